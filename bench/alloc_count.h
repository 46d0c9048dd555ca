/* What bench/alloc_count.c keeps in DIR/<pid> for each process it is preloaded into (C and C++). */
#pragma once
#include <stdint.h>

#ifdef __cplusplus
#include <atomic>
struct bitship_alloc_counts {
    std::atomic<uint64_t> allocations; /* malloc, calloc, realloc to a new size, aligned forms */
    std::atomic<uint64_t> frees;       /* free of a non-null pointer, realloc to 0 */
    std::atomic<uint64_t> bytes;       /* bytes asked for by those allocations */
};
#else
#include <stdatomic.h>
struct bitship_alloc_counts {
    _Atomic uint64_t allocations;
    _Atomic uint64_t frees;
    _Atomic uint64_t bytes;
};
#endif
