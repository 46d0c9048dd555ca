// ReceiveBuffers: rendezvous buffers handed back are taken again (the best fit first) without
// being filled, within their bounds, from any thread.
#include <catch2/catch.hpp>

#include <cstddef>
#include <thread>
#include <vector>

#include "core/receive_buffers.hpp"

namespace receive_buffers_test_cpp {

using namespace bitship;

constexpr std::size_t kKiB = 1024;

std::vector<std::byte> filled(std::size_t size, std::byte value) { return std::vector<std::byte>(size, value); }

TEST_CASE("a buffer handed back is taken again at its size or less without being filled") {
    ReceiveBuffers pool(64 << 20);
    auto first = filled(256 * kKiB, std::byte{7});
    const auto* at = first.data();
    pool.give_back(std::move(first));
    CHECK(pool.kept_count() == 1);
    auto again = pool.take(100 * kKiB);
    CHECK(again.data() == at);
    REQUIRE(again.size() == 100 * kKiB);
    CHECK(again[100 * kKiB - 1] == std::byte{7}); // shrunk, not filled: the receive writes it all
    CHECK(pool.kept_count() == 0);
    CHECK(pool.reused() == 1);
    // Grown again within its capacity: only the part past its size is new (zeroed).
    pool.give_back(std::move(again));
    auto grown = pool.take(256 * kKiB);
    CHECK(grown.data() == at);
    CHECK(grown[0] == std::byte{7});
    CHECK(grown[256 * kKiB - 1] == std::byte{0});
}

TEST_CASE("the best kept buffer is one already large enough, then the one of least capacity") {
    ReceiveBuffers pool(64 << 20);
    auto big = filled(1024 * kKiB, std::byte{1});
    auto small = filled(64 * kKiB, std::byte{2});
    auto roomy = filled(512 * kKiB, std::byte{3});
    roomy.resize(16 * kKiB); // size 16 KiB, capacity 512 KiB
    const auto *big_at = big.data(), *small_at = small.data(), *roomy_at = roomy.data();
    pool.give_back(std::move(big));
    pool.give_back(std::move(small));
    pool.give_back(std::move(roomy));
    CHECK(pool.take(32 * kKiB).data() == small_at); // large enough already, least capacity
    CHECK(pool.take(100 * kKiB).data() == big_at);  // the only one already 100 KiB
    CHECK(pool.take(100 * kKiB).data() == roomy_at); // capacity enough (fills past 16 KiB)
    CHECK(pool.take(8 * kKiB).size() == 8 * kKiB); // none left: a new one
}

TEST_CASE("small buffers, buffers past the byte bound and past the count bound are not kept") {
    ReceiveBuffers pool(1 << 20);
    pool.give_back(filled(ReceiveBuffers::kMinKept - 1, std::byte{1}));
    CHECK(pool.kept_count() == 0);
    pool.give_back(filled((1 << 20) + 1, std::byte{1}));
    CHECK(pool.kept_count() == 0);
    pool.give_back(filled(512 * kKiB, std::byte{1}));
    pool.give_back(filled(512 * kKiB, std::byte{1}));
    pool.give_back(filled(8 * kKiB, std::byte{1})); // would pass the 1 MiB bound
    CHECK(pool.kept_count() == 2);
    ReceiveBuffers many(std::size_t{1} << 30);
    for (std::size_t i = 0; i < ReceiveBuffers::kMaxKept + 4; ++i) many.give_back(filled(8 * kKiB, std::byte{1}));
    CHECK(many.kept_count() == ReceiveBuffers::kMaxKept);
    ReceiveBuffers none(0); // (an engine under a sanitizer keeps none)
    none.give_back(filled(64 * kKiB, std::byte{1}));
    CHECK(none.kept_count() == 0);
}

TEST_CASE("buffers handed back from other threads are taken on this one") {
    ReceiveBuffers pool(64 << 20);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
        threads.emplace_back([&pool] {
            for (int i = 0; i < 200; ++i) pool.give_back(pool.take(16 * kKiB + std::size_t(i) * 64));
        });
    for (int i = 0; i < 200; ++i) pool.give_back(pool.take(64 * kKiB));
    for (auto& t : threads) t.join();
    CHECK(pool.kept_count() >= 1);
    CHECK(pool.kept_count() <= ReceiveBuffers::kMaxKept);
}

} // namespace receive_buffers_test_cpp
