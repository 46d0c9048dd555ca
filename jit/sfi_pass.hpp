#pragma once
// Software fault isolation of shipped code (jit::Sandbox::sfi): the module pass that confines
// every memory access of a kernel to the agent's arena, and keeps the kernel's stack data where
// it can reach it and the return addresses where it cannot. Private to jit/.
//
// Memory. Every load, store, atomicrmw and cmpxchg, the pointer operands of llvm.masked.*
// (load, store, gather, scatter, expandload, compressstore) and of the memory intrinsics, and
// the byval pointers a call passes, go through
//     confined = base + (address & mask)
// where base and mask are the *addresses* of the absolute symbols __bs_arena_base and
// __bs_arena_mask (jit.hpp), reached through the GOT once per function. The arena is a power of
// two aligned to its size, so base + (a & mask) == (a & mask) | base, and the add folds into
// x86's base+index addressing: one AND per access, base and mask held in registers across
// loops (see the file's test, "the masked load of a loop"). An address inside the arena is left
// as it is; any other lands somewhere inside it, never outside. An access is at most 4 KiB wide
// (rule sfi-access-size) and the arena ends in a guard, so no access runs past its end.
//
// Stack. A frame is split in two, as LLVM's SafeStack splits it:
//   - the real stack (the thread's own, outside the arena) keeps the return addresses, the
//     spills, the callee-saved registers and the *safe* allocas: static allocas whose every use
//     is a load or store at a constant, in-bounds offset (directly or through constant inbounds
//     GEPs) or a lifetime marker. Their accesses are provably inside the alloca, so they are
//     left unmasked (a masked stack address would land in the arena, not on the stack). Every
//     function probes its real-stack frame page by page ("probe-stack"="inline-asm"), so no
//     frame, however large, can step over the thread stack's guard page.
//   - the unsafe stack (jit::UnsafeStack, inside the arena, one per thread, from
//     __bs_unsafe_stack()) takes every other alloca: address-taken locals, arrays indexed by a
//     variable, dynamic allocas (VLAs), byval parameters whose address escapes. The function
//     moves its sp down by the frame on entry (calling __bs_stack_overflow below the limit),
//     and puts it back before every return. llvm.stacksave/stackrestore work on this sp only
//     (a restore is clamped to [limit, the function's entry sp]), so nothing the kernel
//     computes ever becomes the real stack pointer.
// Everything a kernel can name an address of is therefore in the arena, and the return
// addresses are not: no store, however forged its address, can redirect a return.
//
// Why not LLVM's SafeStack pass: its notion of "safe" (StackSafetyAnalysis: no access may be
// out of bounds) is not the same as "needs no mask". An alloca SafeStack keeps on the real
// stack may still be reached through a pointer passed to a callee or a memcpy, and such an
// access would then be masked into the arena (reading something else) or, if left unmasked,
// give the kernel a pointer into the real stack. Here one predicate decides both: an alloca
// stays on the real stack exactly when none of its accesses needs a mask. SafeStack also keeps
// its stack pointer in a thread-local or a runtime of its own; this pass uses the agent's
// UnsafeStack contract.
//
// Memory intrinsics: small constant lengths (<= 256 bytes) stay inline with masked pointers
// (a few vector moves); every other llvm.memcpy/memmove/memset becomes a call to memcpy,
// memmove or memset, which the agent resolves in sfi mode to versions that check [p, p+n)
// against the arena. Byval arguments are copied into the callee's frame by the call sequence
// from a masked pointer; a byval parameter that is not safe is copied into an unsafe-stack slot
// at entry. Variadic functions are refused (rule sfi-no-varargs: va_arg would walk the real
// stack). Pointers outside the default address space are refused (rule sfi-address-space: on
// x86-64 address spaces 256 and 257 are the gs and fs segments, the thread's own data). Indirect
// calls are checked by call_guard.cpp in every mode, this one included. Shipped code that names
// the sandbox's own symbols (__bs_arena_base, ...) is refused (rule sfi-reserved-name).
//
// Refusals are Errc::policy_violation naming the rule, as code_policy.hpp's are.

#include <string>
#include <vector>

#include <bitship/errc.hpp>

namespace llvm {
class Module;
}

namespace bitship::jit {

/// The widest single access sfi code may make (rule sfi-access-size); the guard after the
/// arena is larger.
inline constexpr unsigned kSfiMaxAccessBytes = 4096;
/// Memory intrinsics of a constant length up to this stay inline (masked); longer ones call.
inline constexpr unsigned kSfiInlineMemBytes = 256;

/// What confine_memory did to a module.
struct SfiStats {
    unsigned accesses_masked = 0; ///< loads, stores, atomics, masked intrinsics, byval arguments
    unsigned accesses_safe = 0;   ///< loads and stores of safe allocas, left unmasked
    unsigned allocas_safe = 0;    ///< static allocas kept on the real stack
    unsigned allocas_moved = 0;   ///< static allocas moved to the unsafe stack
    unsigned allocas_dynamic = 0; ///< dynamic allocas bumped from the unsafe stack
    unsigned byval_copied = 0;    ///< byval parameters copied to the unsafe stack
    unsigned mem_inline = 0;      ///< small memory intrinsics kept inline, pointers masked
    unsigned mem_calls = 0;       ///< memory intrinsics turned into calls of memcpy/memmove/memset
    unsigned unsafe_frames = 0;   ///< functions with an unsafe-stack frame
};

/// Confines `module` (see above). Runs after optimisation, just before code generation, at
/// every tier. policy_violation (rules sfi-no-varargs, sfi-access-size, sfi-address-space,
/// sfi-reserved-name) for
/// what cannot be
/// confined; nothing is changed then that matters (the module is discarded).
Result<SfiStats> confine_memory(llvm::Module& module);

/// Independent check of the pass's result, for tests and debugging: every load, store, atomic
/// and masked intrinsic of `module` either reaches its memory through base + (x & mask) built
/// from the arena symbols, or is a safe alloca's (same predicate as the pass), or is one of
/// the pass's own accesses of the UnsafeStack. Returns a description of each one that is not.
std::vector<std::string> unconfined_accesses(const llvm::Module& module);

} // namespace bitship::jit
