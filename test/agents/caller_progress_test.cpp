// Who progresses the client: a caller waiting on its future or polling ready() leads, several
// waiting threads are each handed their results, many threads' calls all arrive, and idle
// clients and agents use no CPU. Real xagent processes, real UCX over loopback.

#include <dlfcn.h>
#include <sys/resource.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <thread>

#include <bitship/client.hpp>
#include <behaviour_kernels.hpp>

#include "core/wire.hpp"
#include "launcher.hpp"
#include "test_support.hpp"

namespace caller_progress_test_cpp {


using namespace bitship;
using bitship::test::make_client;
using bitship::test::agent_counters;
using bitship::test::connect;
using bitship::launch::AgentProcess;
using namespace std::chrono_literals;

TEST_CASE("4 client threads x 1000 ships: every result arrives, correct", "[integration]") {
    auto transport = GENERATE(as<std::string>{}, "tcp", "shm");
    AgentProcess agent(transport);
    auto client = make_client(transport);
    auto target = connect(client, agent);
    constexpr int kThreads = 4, kCalls = 1000;
    std::atomic<int> right{0}, wrong{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
        threads.emplace_back([&, t] {
            // Some in flight at once, some one by one.
            std::vector<std::pair<Future, std::uint64_t>> window;
            for (int i = 0; i < kCalls; ++i) {
                std::uint64_t a = static_cast<std::uint64_t>(t) << 32, b = static_cast<std::uint64_t>(i);
                window.emplace_back(client.ship(behaviour_kernels::add, target, a, b), a + b);
                if (window.size() == 16 || i == kCalls - 1) {
                    for (auto& [f, want] : window) {
                        auto r = f.get_as<std::uint64_t>();
                        (r && *r == want ? right : wrong).fetch_add(1);
                    }
                    window.clear();
                }
            }
        });
    }
    for (auto& th : threads) th.join();
    CHECK(wrong.load() == 0);
    CHECK(right.load() == kThreads * kCalls);
    auto c = agent_counters(client, target);
    CHECK(c["results"] == static_cast<std::uint64_t>(kThreads * kCalls));
    CHECK(client.stats().bundles_sent == 1);
    // Every call was completed by someone: a waiting thread leading progress (for itself or
    // for the others) or the background thread. (connect() adds its own two.)
    auto s = client.stats();
    CHECK(s.completed_by_waiter + s.completed_by_background >= static_cast<std::uint64_t>(kThreads * kCalls));
}

TEST_CASE("a caller waiting on its future receives its result itself, leading progress", "[integration]") {
    auto transport = GENERATE(as<std::string>{}, "tcp", "shm");
    for (auto mode : {ProgressMode::spin, ProgressMode::spin_then_block}) {
        AgentProcess agent(transport);
        ClientOptions o;
        o.transport = *parse_transport(transport);
        o.loopback_only = true;
        o.progress = mode;
        auto client = Client::create(o);
        REQUIRE(client);
        auto target = client->connect(agent.address());
        REQUIRE(target);
        REQUIRE(client->ship(behaviour_kernels::add, *target, std::uint64_t{1}, std::uint64_t{1}).get()); // code sent
        auto before = client->stats();
        constexpr int kCalls = 2000;
        for (int i = 0; i < kCalls; ++i) {
            auto r = client->ship(behaviour_kernels::add, *target, std::uint64_t(i), std::uint64_t{1}).get_as<std::uint64_t>();
            REQUIRE(r);
            REQUIRE(*r == std::uint64_t(i) + 1);
        }
        auto after = client->stats();
        auto by_waiter = after.completed_by_waiter - before.completed_by_waiter;
        auto by_background = after.completed_by_background - before.completed_by_background;
        INFO(to_string(mode) << ": " << by_waiter << " completed by the waiting caller, " << by_background
                             << " by the background thread");
        CHECK(by_waiter + by_background == kCalls);
        // The background thread only gets a reply that arrives before the caller starts waiting.
        CHECK(by_waiter > by_background);
    }
}

TEST_CASE("a caller polling ready() progresses itself: its calls complete without waiting for the background thread",
          "[integration]") {
    // Nobody waits on these futures: before, only the background thread could complete them,
    // and it looked only every Engine::kDeepWait (50 ms) while the caller came and went.
    auto transport = GENERATE(as<std::string>{}, "tcp", "shm");
    INFO("transport " << transport);
    AgentProcess agent(transport);
    auto client = make_client(transport);
    auto target = client.connect(agent.address());
    REQUIRE(target);
    REQUIRE(client.ship(behaviour_kernels::add, *target, std::uint64_t{1}, std::uint64_t{1}).get()); // code sent
    const auto before = client.stats();
    constexpr int kCalls = 200;
    for (int i = 0; i < kCalls; ++i) {
        auto f = client.ship(behaviour_kernels::add, *target, std::uint64_t(i), std::uint64_t{1});
        while (!f.ready()) {
        }
        auto r = f.get_as<std::uint64_t>();
        REQUIRE(r);
        REQUIRE(*r == std::uint64_t(i) + 1);
    }
    const auto after = client.stats();
    const auto by_poller = after.completed_by_waiter - before.completed_by_waiter;
    const auto by_background = after.completed_by_background - before.completed_by_background;
    INFO(by_poller << " completed by the polling caller, " << by_background << " by the background thread");
    CHECK(by_poller + by_background == kCalls);
    CHECK(by_poller > by_background);
}

TEST_CASE("several threads waiting at once: one leads, the others are handed their results", "[integration]") {
    AgentProcess agent("shm");
    auto client = make_client("shm");
    auto target = connect(client, agent);
    REQUIRE(client.ship(behaviour_kernels::add, target, std::uint64_t{1}, std::uint64_t{1}).get());
    // Each thread waits on a slow call and a fast one; whoever leads completes the others'.
    constexpr int kThreads = 4, kRounds = 50;
    std::atomic<int> right{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t)
        threads.emplace_back([&, t] {
            for (int i = 0; i < kRounds; ++i) {
                // Thread 0's slow call keeps it waiting (and likely leading) for milliseconds.
                auto slow = client.ship(behaviour_kernels::busy_count, target, std::uint64_t(t == 0 ? 5'000'000 : 0));
                auto fast = client.ship(behaviour_kernels::add, target, std::uint64_t(t), std::uint64_t(i));
                auto f = fast.get_as<std::uint64_t>();
                if (f && *f == std::uint64_t(t + i) && slow.get()) right.fetch_add(1);
            }
        });
    for (auto& th : threads) th.join();
    CHECK(right.load() == kThreads * kRounds);
}

TEST_CASE("an idle client uses no CPU", "[integration]") {
    AgentProcess agent("shm");
    auto client = make_client("shm");
    auto target = connect(client, agent);
    for (int i = 0; i < 100; ++i) REQUIRE(client.ship(behaviour_kernels::add, target, std::uint64_t{1}, std::uint64_t{1}).get());
    std::this_thread::sleep_for(200ms); // past the spin window
    auto cpu_ms = [] {
        rusage u{};
        getrusage(RUSAGE_SELF, &u);
        return (u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1e3 + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e3;
    };
    auto before = cpu_ms();
    std::this_thread::sleep_for(2s);
    auto used = cpu_ms() - before;
    INFO("idle client process used " << used << " ms of CPU in 2 s");
    CHECK(used < 100.0);
}

TEST_CASE("an idle agent sleeps instead of spinning", "[integration]") {
    AgentProcess agent("tcp");
    auto client = make_client("tcp");
    auto target = connect(client, agent);
    REQUIRE(client.ship(behaviour_kernels::add, target, std::uint64_t{1}, std::uint64_t{1}).get());
    std::this_thread::sleep_for(200ms); // past the spin window
    auto before = agent.cpu_ms();
    std::this_thread::sleep_for(2s);
    auto used = agent.cpu_ms() - before;
    INFO("idle agent used " << used << " ms of CPU in 2 s");
    CHECK(used < 100.0); // a spinning agent would use ~2000
}

} // namespace caller_progress_test_cpp
