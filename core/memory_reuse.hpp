#pragma once
// Keeping freed message buffers for the next message. glibc serves blocks over 128 KiB from
// fresh mmaps (its threshold then grows to the largest block freed) and gives the top of the
// heap back once 2× that is free: a stream of 1 MiB arguments or results then maps, faults
// in page by page, zeroes and unmaps every buffer, on both sides. Measured here (bench/ship_rate,
// TCP loopback): 0.8 GB/s that way against 2.9 GB/s with this. MPI libraries do the same for the
// same reason (Open MPI's leave_pinned sets M_TRIM_THRESHOLD and M_MMAP_MAX).
//
//   keep_freed_memory(engine_options.max_message);  // once, at start; process-wide

#include <cstddef>

namespace bitship {

/// Blocks up to `largest_block` come from the heap, and up to kKeptFree bytes freed at its top
/// stay mapped for reuse. Process-wide (mallopt); idempotent; a no-op under sanitizers and on
/// C libraries without mallopt. Returns false when the C library refused.
bool keep_freed_memory(std::size_t largest_block);

/// Every thread of the process allocates from the one main heap (glibc's M_ARENA_MAX 1), for a
/// process whose large buffers are made on one thread and freed on another: an agent's replies,
/// made by its workers and freed by its engine thread once sent. glibc gives each thread an
/// arena of its own, made of 64 MiB heaps that are unmapped once empty, so a stream of 16 MiB
/// replies kept mapping fresh heaps and faulting them in page by page; the main heap grows in
/// place and keeps what keep_freed_memory says. Small blocks stay per thread (glibc's tcache).
/// Measured (bench/gpu_reduce's GET of a GPU region, fake driver, shared memory): 0.93 to
/// 1.64 GB/s. For an agent, not a library: it changes how every thread of the process allocates.
/// Process-wide (mallopt), before threads start; a no-op where keep_freed_memory is one.
bool one_heap_for_all_threads();

/// Whether this build's malloc is glibc's, which keep_freed_memory can tune (false under
/// sanitizers, whose allocator is their own).
bool malloc_is_tunable() noexcept;

/// How much freed memory a process keeps at most at the top of its heap.
inline constexpr std::size_t kKeptFree = std::size_t{256} << 20;

} // namespace bitship
