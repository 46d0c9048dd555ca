// InflightLedger: what one peer may make an agent hold, and the Holds that give it back.

#include "core/inflight_ledger.hpp"

#include <catch2/catch.hpp>
#include <thread>
#include <vector>

namespace inflight_ledger_test_cpp {

using namespace bitship;

namespace {
ucp_ep_h ep_named(std::uintptr_t n) {
    return reinterpret_cast<ucp_ep_h>(n);
}
} // namespace

TEST_CASE("a ledger with no limits holds nothing and refuses nothing", "[inflight]") {
    InflightLedger ledger;
    CHECK_FALSE(ledger.enabled());
    for (int i = 0; i < 1000; ++i) {
        auto h = ledger.admit(ep_named(1), 1 << 20);
        REQUIRE(h);
        CHECK(h->empty());
    }
    CHECK(ledger.charge(ep_named(1), 100).empty());
    CHECK(ledger.held(ep_named(1)) == std::pair<std::uint64_t, std::uint64_t>{0, 0});
}

TEST_CASE("a peer past its message limit is refused until a hold is let go", "[inflight]") {
    InflightLedger ledger({.per_peer = {0, 3}, .total = {}});
    std::vector<Hold> holds;
    for (int i = 0; i < 3; ++i) {
        auto h = ledger.admit(ep_named(1), 10);
        REQUIRE(h);
        holds.push_back(std::move(*h));
    }
    CHECK(ledger.held(ep_named(1)) == std::pair<std::uint64_t, std::uint64_t>{30, 3});
    auto refused = ledger.admit(ep_named(1), 10);
    REQUIRE_FALSE(refused);
    CHECK(refused.error().code == Errc::busy);
    CHECK_THAT(refused.error().message, Catch::Contains("3 messages (30 bytes)") &&
                                            Catch::Contains("limit per connection is 3 messages"));
    // Another peer is not affected.
    CHECK(ledger.admit(ep_named(2), 10));
    holds.pop_back();
    CHECK(ledger.held(ep_named(1)) == std::pair<std::uint64_t, std::uint64_t>{20, 2});
    CHECK(ledger.admit(ep_named(1), 10));
}

TEST_CASE("a peer past its byte limit is refused, but one message alone always goes",
          "[inflight]") {
    InflightLedger ledger({.per_peer = {100, 0}, .total = {}});
    {
        auto alone = ledger.admit(ep_named(1), 1000); // over the budget, but nothing else is held
        REQUIRE(alone);
        auto second = ledger.admit(ep_named(1), 1);
        REQUIRE_FALSE(second);
        CHECK(second.error().code == Errc::busy);
        CHECK_THAT(second.error().message, Catch::Contains("100 bytes, and this message has 1"));
    }
    auto a = ledger.admit(ep_named(1), 60);
    REQUIRE(a);
    CHECK_FALSE(ledger.admit(ep_named(1), 41));
    CHECK(ledger.admit(ep_named(1), 40));
    // Undelivered answers count against new messages, and are never refused themselves.
    auto answer = ledger.charge(ep_named(1), 500);
    CHECK_FALSE(answer.empty());
    CHECK_FALSE(ledger.admit(ep_named(1), 1));
    answer.release();
    answer.release(); // idempotent
    CHECK(ledger.held(ep_named(1)) == std::pair<std::uint64_t, std::uint64_t>{60, 1});
}

TEST_CASE("holds outlive a forgotten peer and may be let go on any thread", "[inflight]") {
    InflightLedger ledger({.per_peer = {1 << 20, 1 << 20}, .total = {}});
    std::vector<Hold> holds;
    for (int i = 0; i < 1000; ++i)
        holds.push_back(std::move(*ledger.admit(ep_named(7), 8)));
    ledger.forget(ep_named(7));
    CHECK(ledger.held(ep_named(7)) == std::pair<std::uint64_t, std::uint64_t>{0, 0});
    auto fresh = ledger.admit(ep_named(7), 8); // a new connection at a reused address starts empty
    REQUIRE(fresh);
    CHECK(ledger.held(ep_named(7)) == std::pair<std::uint64_t, std::uint64_t>{8, 1});
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
        threads.emplace_back([&, t] {
            for (int i = t; i < 1000; i += 4)
                holds[static_cast<std::size_t>(i)] = Hold{};
        });
    for (auto& th : threads)
        th.join();
    CHECK(ledger.held(ep_named(7)) == std::pair<std::uint64_t, std::uint64_t>{8, 1});
}

TEST_CASE("holds may outlive their ledger, and the last one frees the count", "[inflight]") {
    std::vector<Hold> holds;
    {
        InflightLedger ledger({.per_peer = {0, 100}, .total = {}});
        for (int i = 0; i < 10; ++i)
            holds.push_back(std::move(*ledger.admit(ep_named(1), 16)));
        auto gone = ledger.admit(ep_named(2), 16); // a peer whose count the ledger frees at once
        REQUIRE(gone);
        gone->release();
    }
    holds.clear(); // ASan: no use after free, no leak
    SUCCEED();
}

TEST_CASE("limits past what a peer's count can hold are clamped, never overflow", "[inflight]") {
    InflightLedger ledger({.per_peer = {~0ull, ~0ull}, .total = {~0ull, ~0ull}});
    std::vector<Hold> holds;
    for (int i = 0; i < 3; ++i) { // 384 GiB: within the word's room for bytes (512 GiB)
        auto h = ledger.admit(ep_named(1), 1ull << 37);
        REQUIRE(h);
        holds.push_back(std::move(*h));
    }
    CHECK(ledger.held(ep_named(1)) == std::pair<std::uint64_t, std::uint64_t>{3ull << 37, 3});
    auto past = ledger.admit(ep_named(1), 1ull << 37);
    REQUIRE_FALSE(past);
    CHECK(past.error().code == Errc::busy);
    CHECK(ledger.held(ep_named(1)).second == 3);
}

TEST_CASE("past the total across peers any peer is refused, but a small first message goes",
          "[inflight]") {
    InflightLedger ledger({.per_peer = {}, .total = {0, 4}});
    std::vector<Hold> holds;
    for (int i = 0; i < 4; ++i) // two peers fill the total
        holds.push_back(std::move(*ledger.admit(ep_named(1 + i % 2), 100)));
    CHECK(ledger.held_by_all() == std::pair<std::uint64_t, std::uint64_t>{400, 4});
    auto refused = ledger.admit(ep_named(1), 100);
    REQUIRE_FALSE(refused);
    CHECK(refused.error().code == Errc::busy);
    CHECK_THAT(refused.error().message,
               Catch::Contains("holds 4 messages (400 bytes) not yet answered from all its "
                               "connections, 2 of them this one's") &&
                   Catch::Contains("limit across connections is 4 messages"));
    CHECK_FALSE(ledger.admit(ep_named(2), 100));
    // A peer that holds nothing has one message of up to kAlwaysAdmitted taken all the same ...
    auto light = ledger.admit(ep_named(3), kAlwaysAdmitted);
    REQUIRE(light);
    CHECK(ledger.held_by_all() ==
          std::pair<std::uint64_t, std::uint64_t>{400 + kAlwaysAdmitted, 5});
    CHECK_FALSE(ledger.admit(ep_named(3), 1));                   // ... and no second one
    CHECK_FALSE(ledger.admit(ep_named(4), kAlwaysAdmitted + 1)); // nor a larger one
    // Every hold gives its share of the total back.
    light->release();
    holds.pop_back();
    CHECK(ledger.held_by_all() == std::pair<std::uint64_t, std::uint64_t>{300, 3});
    CHECK(ledger.admit(ep_named(1), 100));
}

TEST_CASE("past the total in bytes any peer is refused, but one message alone always goes",
          "[inflight]") {
    InflightLedger ledger({.per_peer = {1 << 20, 0}, .total = {1000, 0}});
    {
        auto alone = ledger.admit(ep_named(1), 5000); // nothing held anywhere: it goes
        REQUIRE(alone);
        auto other = ledger.admit(ep_named(2), kAlwaysAdmitted + 1);
        REQUIRE_FALSE(other);
        CHECK_THAT(other.error().message,
                   Catch::Contains("limit across connections is 1000 bytes, and this message has"));
    }
    auto a = ledger.admit(ep_named(1), 600);
    auto b = ledger.admit(ep_named(2), 400);
    REQUIRE(a);
    REQUIRE(b);
    CHECK_FALSE(ledger.admit(ep_named(1), 1));
    // Undelivered answers count against the total too, and are never refused themselves.
    b->release();
    auto answer = ledger.charge(ep_named(2), 400);
    CHECK_FALSE(answer.empty());
    CHECK_FALSE(ledger.admit(ep_named(1), 1));
    answer.release();
    CHECK(ledger.admit(ep_named(1), 400));
}

TEST_CASE("the total outlives its ledger while holds are out", "[inflight]") {
    std::vector<Hold> holds;
    {
        InflightLedger ledger({.per_peer = {}, .total = {0, 100}});
        for (int i = 0; i < 10; ++i)
            holds.push_back(std::move(*ledger.admit(ep_named(1 + i % 3), 16)));
        CHECK(ledger.held_by_all() == std::pair<std::uint64_t, std::uint64_t>{160, 10});
    }
    std::vector<std::thread> threads;
    for (int t = 0; t < 2; ++t)
        threads.emplace_back([&, t] {
            for (std::size_t i = static_cast<std::size_t>(t); i < holds.size(); i += 2)
                holds[i] = Hold{};
        });
    for (auto& th : threads)
        th.join(); // ASan: no use after free, no leak; TSan: no race
    SUCCEED();
}

}  // namespace inflight_ledger_test_cpp
