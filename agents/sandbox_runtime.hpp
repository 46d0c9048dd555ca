#pragma once
// The kernel runtime under xagent --sandbox sfi: what sandboxed code links against, and the
// per-call set-up that binds a call to its thread's area of the arena (sandbox_arena.hpp).
//
// Every export checks what it is given before use: the ctx must be the call running on this
// thread, every pointer and length must lie in the arena (a kernel that passes anything else is
// stopped with out_of_bounds, naming the function and the range). The curated libc functions
// that take pointers (memcpy, strlen, ...) are replaced by checked ones; malloc and friends come
// from the call's kernel heap (kernel_heap.hpp), reclaimed when the call ends.

#include <vector>

#include <bitship/errc.hpp>
#include <bitship/kernel.h>

#include "jit.hpp"

namespace bitship::agent {

class SandboxArena;
struct ThreadArea;

/// The exports for Sandbox::sfi: the checked bs_* runtime, checked libc replacements, the
/// kernel heap's malloc/calloc/realloc/free, and the symbols the sfi pass refers to
/// (jit::kArenaBaseSymbol, kArenaMaskSymbol, kUnsafeStackSymbol, kStackOverflowSymbol) plus
/// jit::kForgedCallSymbol. The arena must outlive the JIT.
std::vector<jit::Export> sandboxed_exports(SandboxArena& arena);

/// One kernel call bound to the calling thread's area: made just before the kernel runs,
/// ended after it returned or was stopped. Not movable: it is the thread's current call.
class SandboxedCall {
public:
    /// Copies ctx.args into the area's call buffer and points ctx.args there, resets the unsafe
    /// stack, and makes `ctx` this thread's current call. too_large when the arguments exceed
    /// the call buffer or no area is left.
    static Result<void> enter(SandboxArena& arena, bs_ctx& ctx);
    /// Reclaims whatever the call left on its heap and clears the current call. Cheap when the
    /// call allocated nothing.
    static void leave() noexcept;
};

/// Bytes the calling thread's last call had allocated at its peak (tests, stats).
std::size_t last_call_heap_peak() noexcept;

} // namespace bitship::agent
