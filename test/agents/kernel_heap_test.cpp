// The kernel heap (agents/kernel_heap.*): the allocator sandboxed kernels' malloc comes from.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include <catch2/catch.hpp>

#include "kernel_heap.hpp"
#include "page_size.hpp"

namespace kernel_heap_test_cpp {

using bitship::agent::KernelHeap;
using bitship::agent::kPage;

namespace {

constexpr std::byte kCanary{0xa5};

// A heap's range with a canary page right before and right after it: whatever the heap does,
// those must keep their bytes.
class GuardedRange {
public:
    explicit GuardedRange(std::size_t bytes) : bytes_(bytes) {
        total_ = bytes + 2 * kPage;
        void* p = ::mmap(nullptr, total_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        REQUIRE(p != MAP_FAILED);
        first_ = static_cast<std::byte*>(p);
        std::memset(first_, static_cast<int>(kCanary), kPage);
        std::memset(first_ + kPage + bytes, static_cast<int>(kCanary), kPage);
    }
    ~GuardedRange() { ::munmap(first_, total_); }
    GuardedRange(const GuardedRange&) = delete;
    GuardedRange& operator=(const GuardedRange&) = delete;

    [[nodiscard]] std::byte* begin() const { return first_ + kPage; }
    [[nodiscard]] std::size_t size() const { return bytes_; }
    [[nodiscard]] bool canaries_intact() const {
        auto same = [](const std::byte* p) { return std::all_of(p, p + kPage, [](std::byte b) { return b == kCanary; }); };
        return same(first_) && same(first_ + kPage + bytes_);
    }
    [[nodiscard]] bool holds(const void* p, std::size_t n) const {
        auto* b = static_cast<const std::byte*>(p);
        return b >= begin() && b + n <= begin() + bytes_;
    }
    // Pages of the range in memory now (mincore).
    [[nodiscard]] std::size_t resident_pages() const {
        std::vector<unsigned char> v(bytes_ / kPage);
        REQUIRE(::mincore(begin(), bytes_, v.data()) == 0);
        return static_cast<std::size_t>(std::count_if(v.begin(), v.end(), [](unsigned char c) { return c & 1; }));
    }

private:
    std::byte* first_ = nullptr;
    std::size_t bytes_ = 0;
    std::size_t total_ = 0;
};

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

} // namespace

TEST_CASE("kernel heap blocks are 16-byte aligned, inside the range, apart, and reused after free", "[unit]") {
    GuardedRange range(std::size_t{4} << 20);
    KernelHeap heap(range.begin(), range.size());
    std::vector<std::pair<std::byte*, std::size_t>> blocks;
    for (std::size_t n : {0UL, 1UL, 15UL, 16UL, 17UL, 100UL, 1000UL, 4096UL, 70000UL, 200000UL, 1UL << 20}) {
        auto* p = static_cast<std::byte*>(heap.allocate(n));
        REQUIRE(p != nullptr);
        CHECK(aligned16(p));
        CHECK(range.holds(p, n));
        CHECK(heap.usable_size(p) >= n);
        std::memset(p, static_cast<int>(blocks.size() + 1), n);
        blocks.emplace_back(p, n);
    }
    // Each block still holds its own byte: none overlaps another.
    for (std::size_t i = 0; i < blocks.size(); ++i)
        CHECK(std::all_of(blocks[i].first, blocks[i].first + blocks[i].second,
                          [&](std::byte b) { return b == std::byte(i + 1); }));
    CHECK(heap.in_use() > (std::size_t{1} << 20));

    void* small = heap.allocate(40);
    REQUIRE(heap.release(small));
    CHECK(heap.allocate(40) == small); // same size class: the freed block comes back
    CHECK(range.canaries_intact());
}

TEST_CASE("kernel heap refuses forged, stale and double frees and changes nothing then", "[unit]") {
    GuardedRange range(std::size_t{1} << 20);
    KernelHeap heap(range.begin(), range.size());
    auto* p = static_cast<std::byte*>(heap.allocate(64));
    auto* q = static_cast<std::byte*>(heap.allocate(64));
    REQUIRE(p);
    REQUIRE(q);
    int on_stack = 0;
    CHECK_FALSE(heap.release(&on_stack));              // not in the heap
    CHECK_FALSE(heap.release(p + 16));                 // inside a block, not its start
    CHECK_FALSE(heap.release(range.begin() + 65536)); // beyond what was handed out
    CHECK(heap.release(nullptr));
    CHECK(heap.release(p));
    CHECK_FALSE(heap.release(p)); // double free
    CHECK(heap.usable_size(p) == 0);
    CHECK(heap.usable_size(q) >= 64);
    CHECK(heap.reallocate(p, 128) == nullptr); // stale: nothing happens
    CHECK(heap.in_use() == heap.usable_size(q) + 16);
}

TEST_CASE("kernel heap realloc keeps the bytes, grows in place on top, and 0 bytes frees", "[unit]") {
    GuardedRange range(std::size_t{8} << 20);
    KernelHeap heap(range.begin(), range.size());
    auto* p = static_cast<std::byte*>(heap.reallocate(nullptr, 100));
    REQUIRE(p);
    for (int i = 0; i < 100; ++i) p[i] = std::byte(i);
    CHECK(heap.reallocate(p, 90) == p); // shrinking keeps the block
    auto* q = static_cast<std::byte*>(heap.reallocate(p, 5000));
    REQUIRE(q);
    for (int i = 0; i < 100; ++i) REQUIRE(q[i] == std::byte(i));
    CHECK(heap.usable_size(p) == 0); // the old block was freed

    auto* big = static_cast<std::byte*>(heap.allocate(std::size_t{1} << 20));
    REQUIRE(big);
    big[0] = std::byte{7};
    CHECK(heap.reallocate(big, std::size_t{3} << 20) == big); // on top: grown where it is
    CHECK(heap.usable_size(big) >= (std::size_t{3} << 20));
    CHECK(big[0] == std::byte{7});
    CHECK(heap.reallocate(q, 0) == nullptr);
    CHECK(heap.usable_size(q) == 0);
    CHECK(heap.reallocate(big, std::size_t{9} << 20) == nullptr); // past the quota: the old block stays
    CHECK(heap.usable_size(big) >= (std::size_t{3} << 20));
    CHECK(range.canaries_intact());
}

TEST_CASE("kernel heap calloc zeroes reused memory and refuses count x size overflow", "[unit]") {
    GuardedRange range(std::size_t{1} << 20);
    KernelHeap heap(range.begin(), range.size());
    auto* p = static_cast<unsigned char*>(heap.allocate(256));
    std::memset(p, 0xff, 256);
    REQUIRE(heap.release(p));
    auto* z = static_cast<unsigned char*>(heap.allocate_zeroed(16, 16));
    CHECK(z == p);
    CHECK(std::all_of(z, z + 256, [](unsigned char c) { return c == 0; }));
    CHECK(heap.allocate_zeroed(SIZE_MAX / 2, 3) == nullptr);
    CHECK(heap.allocate_zeroed(std::size_t{1} << 33, std::size_t{1} << 33) == nullptr);
}

TEST_CASE("kernel heap stops at its quota and serves again once blocks are freed", "[unit]") {
    constexpr std::size_t kQuota = std::size_t{2} << 20;
    GuardedRange range(kQuota);
    KernelHeap heap(range.begin(), kQuota);
    CHECK(heap.quota() == kQuota);
    CHECK(heap.allocate(kQuota + 1) == nullptr);
    CHECK(heap.allocate(SIZE_MAX) == nullptr);
    std::vector<void*> blocks;
    while (void* p = heap.allocate(1000)) blocks.push_back(p);
    CHECK(blocks.size() > 1000);
    CHECK(heap.in_use() <= kQuota);
    CHECK(heap.peak() == heap.in_use());
    for (void* p : blocks) REQUIRE(heap.release(p));
    CHECK(heap.in_use() == 0);
    CHECK(heap.allocate(1000) != nullptr);
    CHECK(range.canaries_intact());
}

TEST_CASE("kernel heap reuses freed large blocks: a temporary buffer per round does not exhaust the quota", "[unit]") {
    GuardedRange range(std::size_t{8} << 20);
    KernelHeap heap(range.begin(), range.size());
    void* first = nullptr;
    for (int round = 0; round < 1000; ++round) {
        void* temp = heap.allocate(std::size_t{1} << 20);
        REQUIRE(temp != nullptr);
        if (round == 0) first = temp;
        CHECK(temp == first);
        REQUIRE(heap.allocate(16) != nullptr); // kept: the large block is never on top after this
        REQUIRE(heap.release(temp));
    }
    // A large block freed on top goes back to the bump pointer, with the free ones below it.
    heap.reset();
    void* a = heap.allocate(std::size_t{1} << 20);
    void* b = heap.allocate(std::size_t{1} << 20);
    REQUIRE(heap.release(a));
    REQUIRE(heap.release(b));
    CHECK(heap.allocate(std::size_t{2} << 20) == a);
}

TEST_CASE("kernel heap reset frees every block and gives the touched pages back", "[unit]") {
    constexpr std::size_t kQuota = std::size_t{64} << 20;
    GuardedRange range(kQuota);
    KernelHeap heap(range.begin(), kQuota);
    std::size_t before = range.resident_pages();
    std::vector<void*> blocks;
    for (int i = 0; i < 48; ++i) {
        void* p = heap.allocate(std::size_t{1} << 20);
        REQUIRE(p);
        std::memset(p, 1, std::size_t{1} << 20);
        blocks.push_back(p);
    }
    CHECK(range.resident_pages() >= before + 48 * 256);
    CHECK(heap.touched());
    heap.reset();
    CHECK_FALSE(heap.touched());
    CHECK(heap.in_use() == 0);
    CHECK(heap.peak() == 0);
    CHECK(range.resident_pages() <= before + 1);
    CHECK(heap.usable_size(blocks[0]) == 0); // blocks of before the reset are gone
    void* again = heap.allocate(std::size_t{1} << 20);
    CHECK(again == blocks[0]); // and the range is used from its start again
    CHECK(static_cast<unsigned char*>(again)[100] == 0);
}

TEST_CASE("kernel heap small resets zero what was touched", "[unit]") {
    GuardedRange range(std::size_t{1} << 20);
    KernelHeap heap(range.begin(), range.size());
    auto* p = static_cast<unsigned char*>(heap.allocate(1000));
    std::memset(p, 0xee, 1000);
    heap.reset();
    CHECK(std::all_of(range.begin(), range.begin() + 4096, [](std::byte b) { return b == std::byte{0}; }));
}

TEST_CASE("a kernel heap full of garbage never makes the allocator write outside its range", "[unit]") {
    constexpr std::size_t kQuota = std::size_t{1} << 20;
    for (std::uint32_t seed : {1U, 2U, 3U, 4U}) {
        GuardedRange range(kQuota);
        KernelHeap heap(range.begin(), kQuota);
        std::mt19937_64 rng(seed);
        auto scribble = [&](std::size_t from, std::size_t n) {
            for (std::size_t i = from; i < from + n && i < kQuota; ++i) range.begin()[i] = std::byte(rng());
        };
        auto random_size = [&]() -> std::size_t {
            switch (rng() % 4) {
            case 0: return rng() % 64;
            case 1: return rng() % 4096;
            case 2: return rng() % (std::size_t{300} << 10);
            default: return rng();
            }
        };
        std::vector<void*> handed;
        // A pointer a kernel might free: one it got, one near it, or anything in or around the range.
        auto random_pointer = [&]() -> void* {
            auto r = rng() % 4;
            if (r == 0 && !handed.empty()) return handed[rng() % handed.size()];
            if (r == 1 && !handed.empty()) return static_cast<std::byte*>(handed[rng() % handed.size()]) + 16 * (rng() % 8);
            if (r == 2) return range.begin() + (rng() % kQuota & ~std::size_t{15});
            return range.begin() - 4096 + rng() % (kQuota + 8192);
        };
        scribble(0, kQuota);
        for (int round = 0; round < 5000; ++round) {
            void* p = nullptr;
            std::size_t n = 0;
            switch (rng() % 6) {
            case 0:
            case 1: p = heap.allocate(n = random_size()); break;
            case 2: (void)heap.release(random_pointer()); break;
            case 3: p = heap.reallocate(random_pointer(), n = random_size()); break;
            case 4: {
                std::size_t count = rng() % 64, size = rng() % 512;
                p = heap.allocate_zeroed(count, size);
                n = count * size;
                break;
            }
            default:
                // The kernel writes into the heap: blocks it holds, freed ones (their links), headers.
                if (!handed.empty() && rng() % 2) {
                    auto* at = static_cast<std::byte*>(handed[rng() % handed.size()]) - 16;
                    std::size_t off = static_cast<std::size_t>(at - range.begin());
                    scribble(off, 8 + rng() % 64);
                } else {
                    scribble(rng() % kQuota, rng() % 256);
                }
            }
            if (p) {
                REQUIRE(aligned16(p));
                REQUIRE(range.holds(p, 1));
                // The kernel fills what it got (as much as lies in the range).
                auto* b = static_cast<std::byte*>(p);
                std::size_t room = static_cast<std::size_t>(range.begin() + kQuota - b);
                std::memset(b, 0x5a, std::min({n, room, std::size_t{4096}}));
                handed.push_back(p);
            }
            if (round % 1000 == 999) heap.reset();
            REQUIRE(range.canaries_intact());
            REQUIRE(heap.in_use() <= kQuota);
        }
    }
}

}  // namespace kernel_heap_test_cpp
