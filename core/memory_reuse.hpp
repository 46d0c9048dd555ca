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

/// Whether this build's malloc is glibc's, which keep_freed_memory can tune (false under
/// sanitizers, whose allocator is their own).
bool malloc_is_tunable() noexcept;

/// How much freed memory a process keeps at most at the top of its heap.
inline constexpr std::size_t kKeptFree = std::size_t{256} << 20;

} // namespace bitship
