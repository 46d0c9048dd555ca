// keep_freed_memory: message-sized buffers come from the heap and stay there when freed, so a
// stream of bulk messages does not map, fault in and unmap a fresh buffer each time.
#include <catch2/catch.hpp>

#include <malloc.h>

#include <cstddef>
#include <cstring>
#include <memory>

#include "core/memory_reuse.hpp"

namespace memory_reuse_test_cpp {

using namespace bitship;

TEST_CASE("keep_freed_memory: a 1 MiB buffer comes from the heap and its memory stays for the next one") {
    constexpr std::size_t kMiB = std::size_t{1} << 20;
    if (!malloc_is_tunable()) {
        // A sanitizer's allocator is its own: nothing to tune, and keep_freed_memory says so.
        CHECK_FALSE(keep_freed_memory(4 * kMiB));
        return;
    }
    REQUIRE(keep_freed_memory(4 * kMiB));
    const auto mapped_before = mallinfo2().hblkhd; // bytes in blocks glibc mapped on their own
    auto buffer = std::make_unique<std::byte[]>(kMiB);
    std::memset(buffer.get(), 1, kMiB);
    CHECK(mallinfo2().hblkhd == mapped_before); // not a fresh mapping of its own
    buffer.reset();
    // Freed, it stays in the heap (glibc's default would have unmapped it, or trimmed it away).
    CHECK(mallinfo2().fordblks >= kMiB);
    auto again = std::make_unique<std::byte[]>(kMiB);
    CHECK(mallinfo2().hblkhd == mapped_before);
}

}  // namespace memory_reuse_test_cpp
