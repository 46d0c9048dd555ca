#include "memory_reuse.hpp"

#include <algorithm>
#include <climits>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

// GCC says __SANITIZE_ADDRESS__; clang 19 says it only through __has_feature.
#if defined(__SANITIZE_ADDRESS__)
#define BITSHIP_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define BITSHIP_ASAN 1
#endif
#endif

#if defined(__GLIBC__) && !defined(BITSHIP_ASAN)
#define BITSHIP_GLIBC_MALLOC 1
#endif

namespace bitship {

bool malloc_is_tunable() noexcept {
#if defined(BITSHIP_GLIBC_MALLOC)
    return true;
#else
    return false;
#endif
}

bool keep_freed_memory(std::size_t largest_block) {
#if defined(BITSHIP_GLIBC_MALLOC)
    // glibc caps the mmap threshold at 32 MiB on 64-bit (HEAP_MAX_SIZE / 2); above it, blocks
    // are mapped whatever we ask, which is right for rare giants.
    constexpr std::size_t kMaxThreshold = std::size_t{32} << 20;
    const int threshold = static_cast<int>(std::min(std::max(largest_block, std::size_t{128} << 10) + 4096, kMaxThreshold));
    const int keep = static_cast<int>(std::min<std::size_t>(kKeptFree, INT_MAX));
    return mallopt(M_MMAP_THRESHOLD, threshold) == 1 && mallopt(M_TRIM_THRESHOLD, keep) == 1;
#else
    (void)largest_block;
    return false;
#endif
}

bool one_heap_for_all_threads() {
#if defined(BITSHIP_GLIBC_MALLOC)
    return mallopt(M_ARENA_MAX, 1) == 1;
#else
    return false;
#endif
}

} // namespace bitship
