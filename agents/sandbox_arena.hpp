#pragma once
// The sandbox arena (xagent --sandbox sfi): one reserved, size-aligned virtual range per agent
// holding everything a shipped kernel may touch. Code compiled for jit::Sandbox::sfi confines
// every load and store to it ((address & mask) | base), so a kernel cannot read or write a byte
// of the agent outside it.
//
// Layout, from the base (size 2^N, aligned to 2^N):
//   [guard]          2 MiB, PROT_NONE: a confined null pointer faults here
//   regions          the agent's memory regions (allocate_region), registered with UCX
//   thread areas     one per thread that runs kernels (max_threads of them), each:
//                      guard | unsafe stack | guard | kernel heap (the quota) | guard | call buffer
//                    and a guard after the last
//   JIT data         the kernels' read-only and writable data (CodeZones::data)
//   [guard]          64 KiB at the top of the arena
// and outside it, after a 2 MiB guard: the kernels' code (CodeZones::code), within 2 GiB of
// their data. Guards are 2 MiB, and every part is rounded up to 2 MiB.
// Whatever is not handed out is PROT_NONE, so a confined access that lands there faults (the
// kernel guard stops that kernel), and nothing else of the process is ever mapped inside.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include <bitship/errc.hpp>

#include "jit.hpp"

namespace bitship::agent {

class KernelHeap;

struct ArenaOptions {
    /// log2 of the arena's size (36: 64 GiB of address space, reserved, not committed).
    unsigned size_log2 = 36;
    /// Each call's kernel heap quota (xagent --kernel-heap-mib).
    std::size_t heap_bytes = std::size_t{64} << 20;
    /// Each thread's unsafe stack (address-taken locals, arrays on the stack).
    std::size_t stack_bytes = std::size_t{8} << 20;
    /// Each thread's call buffer: the call's arguments are copied here (the agent's max_args).
    std::size_t call_buffer_bytes = std::size_t{1} << 20;
    /// Most threads that may run kernels (workers); one area each.
    unsigned max_threads = 64;
    /// JIT data zone inside the arena, and code zone after it.
    std::size_t jit_data_bytes = std::size_t{512} << 20;
    std::size_t jit_code_bytes = std::size_t{512} << 20;
};

/// What one thread's kernel calls use inside the arena. The struct itself lives outside it
/// (the kernel cannot reach `heap`); what its pointers name lies inside.
struct ThreadArea {
    /// The thread's unsafe stack pointer and limit: `&unsafe_stack`, in the agent's memory,
    /// outside the arena. Instrumented code loads and stores `sp` through it unconfined, so no
    /// kernel store can reach it (a forged `sp` or `limit` would move frames the pass trusts).
    /// sp and limit are reset at every call's start.
    jit::UnsafeStack* stack = nullptr;
    jit::UnsafeStack unsafe_stack;
    std::byte* stack_top = nullptr;   ///< 16-byte aligned, where sp starts
    std::byte* stack_limit = nullptr; ///< the lowest byte of the unsafe stack
    std::byte* call_buffer = nullptr; ///< the call's arguments, 16-byte aligned
    std::size_t call_buffer_bytes = 0;
    KernelHeap* heap = nullptr;       ///< this thread's calls' heap (reset after each call)
};

class SandboxArena {
public:
    /// Reserves the arena and its code zone (address space only), and maps the per-thread
    /// areas' pages on first use. too_large when the address space cannot be had.
    static Result<std::unique_ptr<SandboxArena>> reserve(const ArenaOptions& options);
    ~SandboxArena();
    SandboxArena(const SandboxArena&) = delete;
    SandboxArena& operator=(const SandboxArena&) = delete;

    [[nodiscard]] std::byte* base() const noexcept { return base_; }
    [[nodiscard]] std::size_t size() const noexcept { return size_; }
    [[nodiscard]] std::uint64_t mask() const noexcept { return size_ - 1; }
    /// Whether [p, p + n) lies wholly inside the arena (n may be 0). Any thread, no lock.
    [[nodiscard]] bool contains(const void* p, std::size_t n) const noexcept {
        auto a = reinterpret_cast<std::uintptr_t>(p);
        auto b = reinterpret_cast<std::uintptr_t>(base_);
        return a >= b && n <= size_ && a - b <= size_ - n;
    }

    /// Address space for a region of `bytes` (rounded up to 2 MiB, 2 MiB aligned), still
    /// PROT_NONE: the caller maps it there (MAP_FIXED, or UCX's fixed allocation). too_large
    /// when the regions' zone has no room.
    Result<std::byte*> allocate_region(std::size_t bytes);
    /// Gives a region's range back: its pages are replaced by PROT_NONE (never left unmapped,
    /// where something else of the process could be mapped). `at` must be what
    /// allocate_region returned (its whole range goes, whatever `bytes` says); anything else
    /// is ignored.
    void release_region(std::byte* at, std::size_t bytes) noexcept;

    /// The calling thread's area, claimed on its first call (its pages mapped then); a thread
    /// that has ended leaves its area to the next thread given its id. too_large once
    /// max_threads live threads have claimed one. After the first call: a thread_local read.
    Result<ThreadArea*> this_thread();

    /// Where the JIT places sandboxed code (see jit::CodeZones).
    [[nodiscard]] jit::CodeZones zones() const noexcept { return zones_; }

    [[nodiscard]] const ArenaOptions& options() const noexcept { return options_; }

private:
    SandboxArena() = default;
    struct Span {
        std::size_t offset = 0;
        std::size_t size = 0;
    };

    ArenaOptions options_;
    std::byte* reservation_ = nullptr; // the whole mapping, arena + guard + code zone, for munmap
    std::size_t reservation_size_ = 0;
    std::byte* base_ = nullptr;
    std::size_t size_ = 0;
    jit::CodeZones zones_;

    std::mutex mutex_;
    std::size_t regions_begin_ = 0; // offsets from base_
    std::size_t regions_end_ = 0;
    std::vector<Span> free_regions_; // free spans of the regions' zone, by offset
    std::map<std::size_t, std::size_t> used_regions_; // offset → size of each handed-out region
    std::size_t areas_begin_ = 0;
    std::size_t area_stride_ = 0;
    std::vector<std::unique_ptr<ThreadArea>> areas_;
    std::vector<std::thread::id> owners_; // areas_[i] belongs to the thread owners_[i]
    std::vector<std::unique_ptr<KernelHeap>> heaps_;
    std::uint64_t id_ = 0; // tells this arena's thread_local claims from another's (never reused)
};

} // namespace bitship::agent
