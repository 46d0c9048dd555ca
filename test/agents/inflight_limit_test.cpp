// A connection that floods an agent: past its limit of messages or bytes held at the agent
// (xagent --max-inflight-calls, --max-inflight-mib), its new calls are refused at once with
// `busy`, nothing admitted is lost, other connections go on, and it recovers once answered.

#include "gate.hpp"
#include "inflight_support.hpp"
#include "launcher.hpp"
#include "test_support.hpp"

#include <algorithm>
#include <behaviour_kernels.hpp>
#include <bitship/client.hpp>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fmt/format.h>
#include <fstream>
#include <load_kernels.hpp>
#include <string>
#include <thread>
#include <trust_kernels.hpp>
#include <vector>

namespace inflight_limit_test_cpp {

using namespace bitship;
using bitship::launch::AgentProcess;
using bitship::test::agent_counters;
using bitship::test::client_seeing_busy;
using bitship::test::connect;
using bitship::test::Gate;
using bitship::test::make_client;
using bitship::test::peak_rss;
using bitship::test::value_of;
using bitship::test::with_gate;
using namespace std::chrono_literals;

namespace {
// Long enough (hundreds of ms) that every later call of the test arrives while it runs.
constexpr std::uint64_t kBlockerSteps = 600'000'000;
} // namespace

TEST_CASE("a connection past its in-flight call limit gets busy at once while others go on",
          "[integration]") {
    auto transport = GENERATE(as<std::string>{}, "tcp", "shm");
    INFO("transport " << transport);
    AgentProcess agent(transport, {"--workers", "1", "--max-inflight-calls", "4"});
    auto flooder = client_seeing_busy(transport);
    auto other = make_client(transport);
    auto target = connect(flooder, agent);
    auto other_target = connect(other, agent);
    REQUIRE(
        flooder.ship(behaviour_kernels::busy_count, target, std::uint64_t{1}).get()); // compiled

    auto blocker = flooder.ship(behaviour_kernels::busy_count, target, kBlockerSteps);
    constexpr int kCalls = 12;
    std::vector<Future> calls;
    for (int i = 0; i < kCalls; ++i)
        calls.push_back(
            flooder.ship(behaviour_kernels::busy_count, target, std::uint64_t(100 + i)));
    // Small calls of a batch travel as one BATCH message: each is admitted or refused alone,
    // when the BATCH is opened (after the blocker, when it came in the same read).
    auto batch = flooder.batch();
    for (int i = 0; i < 20; ++i)
        batch.add(behaviour_kernels::busy_count, target, std::uint64_t(200 + i));
    auto batched = batch.submit();
    // While the flooder is at its limit, another connection's call is taken and answered.
    auto others = other.ship(behaviour_kernels::busy_count, other_target, std::uint64_t{7}).get();
    REQUIRE(others);
    CHECK(value_of(*others) == 7);

    int refused = 0, answered = 0;
    for (int i = 0; i < kCalls; ++i) {
        auto r = calls[static_cast<std::size_t>(i)].get();
        if (r) {
            CHECK(value_of(*r) == std::uint64_t(100 + i));
            ++answered;
            continue;
        }
        INFO(r.error().describe());
        CHECK(r.error().code == Errc::busy);
        CHECK_THAT(r.error().message, Catch::Contains("limit per connection is 4 messages"));
        ++refused;
    }
    // The blocker and at most 3 more were held at once; the blocker outlived every other call.
    CHECK(answered <= 3);
    CHECK(refused == kCalls - answered);
    for (std::size_t i = 0; i < batched.size(); ++i) {
        auto r = batched[i].get();
        if (r) {
            CHECK(value_of(*r) == 200 + i);
            continue;
        }
        INFO(r.error().describe());
        CHECK(r.error().code == Errc::busy); // never lost with its BATCH (no timeout)
        ++refused;
    }
    auto b = blocker.get();
    REQUIRE(b);
    CHECK(value_of(*b) == kBlockerSteps);
    CHECK(agent_counters(flooder, target)["busy_refusals"] == static_cast<std::uint64_t>(refused));
    // Answered, the connection takes calls again.
    auto again = flooder.ship(behaviour_kernels::busy_count, target, std::uint64_t{42}).get();
    REQUIRE(again);
    CHECK(value_of(*again) == 42);
}

TEST_CASE("a connection past its in-flight byte limit is refused before its arguments are received",
          "[integration]") {
    auto transport = GENERATE(as<std::string>{}, "tcp", "shm");
    INFO("transport " << transport);
    // The one worker is held at a gate until both large calls have come, however slowly a
    // sanitizer build sends them.
    AgentProcess agent(transport, with_gate({"--workers", "1", "--max-inflight-mib", "1"}));
    // No bulk window: over shared memory the arguments would go there once it is mapped (its
    // WINDOW reply may come between the two calls), and the RUN alone is small.
    auto client = make_client(transport, 30s, [](ClientOptions& o) {
        o.resend_busy = false;
        o.bulk_window = false;
    });
    auto target = connect(client, agent);
    REQUIRE(client.ship(behaviour_kernels::busy_count, target, std::uint64_t{1}).get());
    REQUIRE(client.ship(behaviour_kernels::echo, target, std::uint64_t{1}).get());

    Gate gate(client, target);
    auto blocker = client.ship(load_kernels::hold_until_released, target);
    gate.wait_held();
    Bytes big(600 << 10); // a rendezvous on every transport
    for (std::size_t i = 0; i < big.size(); ++i)
        big[i] = static_cast<std::byte>(i * 31);
    auto first = client.ship_bytes(behaviour_kernels::echo, target, big);
    auto second = client.ship_bytes(behaviour_kernels::echo, target, big);
    auto small = client.ship(behaviour_kernels::busy_count, target, std::uint64_t{5});

    auto r2 = second.get(); // refused while the first is held
    REQUIRE_FALSE(r2);
    CHECK(r2.error().code == Errc::busy);
    CHECK_THAT(r2.error().message, Catch::Contains("limit per connection is 1048576 bytes"));
    CHECK_FALSE(first.ready());
    gate.release();
    auto r1 = first.get();
    REQUIRE(r1);
    CHECK(*r1 == big);
    auto r3 = small.get(); // small enough to fit beside the first
    REQUIRE(r3);
    CHECK(value_of(*r3) == 5);
    REQUIRE(blocker.get());
    auto again = client.ship_bytes(behaviour_kernels::echo, target, big).get();
    REQUIRE(again);
    CHECK(*again == big);
}

TEST_CASE("a connection flooding large calls cannot grow the agent past its in-flight byte limit",
          "[integration]") {
    // 400 calls of 512 KiB (200 MiB) sent while the agent's one worker is held at a gate:
    // without the limit the agent receives and queues them all; with 16 MiB it holds 31 of them
    // and refuses the rest as they come. The gate opens once every refusal is back, so the
    // whole flood has come while the worker was held, however long it took to send.
    AgentProcess agent("tcp", with_gate({"--workers", "1", "--max-inflight-mib", "16"}));
    auto client = client_seeing_busy("tcp");
    auto target = connect(client, agent);
    Bytes args(512 << 10, std::byte{1}); // busy_count takes any other length as 0 steps
    REQUIRE(client.ship_bytes(behaviour_kernels::busy_count, target, args).get());
    REQUIRE(client.ship(behaviour_kernels::busy_count, target, std::uint64_t{1}).get());
    const auto before = peak_rss(agent.pid());

    Gate gate(client, target);
    auto blocker = client.ship(load_kernels::hold_until_released, target);
    gate.wait_held();
    constexpr int kFlood = 400;
    constexpr int kHeld = 31; // 16 MiB over calls of 512 KiB and their header
    std::vector<Future> flood;
    for (int i = 0; i < kFlood; ++i)
        flood.push_back(client.ship_bytes(behaviour_kernels::busy_count, target, args));
    auto back = [&] { return std::count_if(flood.begin(), flood.end(), [](const Future& f) { return f.ready(); }); };
    test::wait_until([&] { return back() >= kFlood - kHeld; },
                     fmt::format("{} refusals while the worker is held", kFlood - kHeld),
                     2 * test::kGateWaitLimit);
    gate.release();
    int answered = 0, refused = 0;
    for (auto& f : flood) {
        auto r = f.get();
        if (r) {
            CHECK(value_of(*r) == 0);
            ++answered;
        } else {
            INFO(r.error().describe());
            CHECK(r.error().code == Errc::busy);
            ++refused;
        }
    }
    REQUIRE(blocker.get());
    const auto grew = peak_rss(agent.pid()) - before;
    INFO(fmt::format("answered {}, refused {}, agent's peak grew {:.1f} MiB", answered, refused,
                     grew / 1048576.0));
    CHECK(answered + refused == kFlood);
    CHECK(refused >= kFlood - kHeld);
    // The 16 MiB held, plus UCX's and the allocator's own (and ASan's quarantine of freed
    // buffers, in that build); without the limit the agent grows by the whole 200 MiB.
    CHECK(grew < (72ull << 20));
}

TEST_CASE(
    "a client sends calls refused as busy again, so a flood past the agent's limits all succeeds",
    "[integration]") {
    auto transport = GENERATE(as<std::string>{}, "tcp", "shm");
    INFO("transport " << transport);
    AgentProcess agent(transport,
                       {"--workers", "1", "--max-inflight-calls", "8", "--max-inflight-mib", "2"});
    auto client = make_client(transport); // resend_busy: the default
    auto target = connect(client, agent);
    REQUIRE(client.ship(behaviour_kernels::busy_count, target, std::uint64_t{1}).get());

    // The first of each kind carries its code (echo's, refused, goes again with it), while a
    // blocker holds the worker: small calls past the call limit, 300 KiB ones past the bytes.
    auto blocker = client.ship(behaviour_kernels::busy_count, target, kBlockerSteps);
    Bytes big(300 << 10);
    for (std::size_t i = 0; i < big.size(); ++i)
        big[i] = static_cast<std::byte>(i * 7);
    std::vector<Future> small, large;
    for (int i = 0; i < 200; ++i) {
        small.push_back(
            client.ship(behaviour_kernels::busy_count, target, std::uint64_t(1000 + i)));
        if (i % 10 == 0) large.push_back(client.ship_bytes(behaviour_kernels::echo, target, big));
    }
    auto batch = client.batch();
    for (int i = 0; i < 100; ++i)
        batch.add(behaviour_kernels::busy_count, target, std::uint64_t(5000 + i));
    auto batched = batch.submit();
    for (int i = 0; i < 200; ++i) {
        auto r = small[static_cast<std::size_t>(i)].get();
        INFO((r ? std::string() : r.error().describe()));
        REQUIRE(r);
        CHECK(value_of(*r) == std::uint64_t(1000 + i));
    }
    for (auto& f : large) {
        auto r = f.get();
        INFO((r ? std::string() : r.error().describe()));
        REQUIRE(r);
        CHECK(*r == big);
    }
    for (std::size_t i = 0; i < batched.size(); ++i) {
        auto r = batched[i].get();
        INFO((r ? std::string() : r.error().describe()));
        REQUIRE(r);
        CHECK(value_of(*r) == 5000 + i);
    }
    REQUIRE(blocker.get());
    const auto refused = agent_counters(client, target)["busy_refusals"];
    INFO("refused " << refused << ", sent again " << client.stats().busy_resends);
    CHECK(refused > 0);                            // the flood did pass the limits
    CHECK(client.stats().busy_resends >= refused); // and each refusal went again
    CHECK(client.stats().stray_replies == 0);
}

TEST_CASE("a call refused as busy still fails at its deadline when the agent stays full",
          "[integration]") {
    AgentProcess agent("tcp",
                       {"--workers", "1", "--max-inflight-calls", "1", "--kernel-timeout-ms", "0"});
    auto client = make_client("tcp", 300ms);
    auto target = connect(client, agent);
    auto stuck =
        client.ship(behaviour_kernels::spin_forever, target); // holds the agent's one place
    std::this_thread::sleep_for(100ms);
    auto refused = client.ship(behaviour_kernels::busy_count, target, std::uint64_t{1}).get();
    REQUIRE_FALSE(refused);
    CHECK(refused.error().code == Errc::timeout);
    CHECK(client.stats().busy_resends > 0);
    auto other = make_client("tcp"); // this session's STATS would be refused too
    CHECK(agent_counters(other, connect(other, agent))["busy_refusals"] > 0);
}

TEST_CASE("a forward the next agent refuses as busy fails the call with busy, naming that agent",
          "[integration]") {
    AgentProcess first("tcp");
    AgentProcess second("tcp", with_gate({"--workers", "1", "--max-inflight-calls", "1"}));
    auto client = make_client("tcp");
    auto a = connect(client, first);
    auto b = connect(client, second);
    REQUIRE(client.ship(behaviour_kernels::busy_count, b, std::uint64_t{1}).get());
    struct HopArgs {
        std::uint32_t to, pad;
        std::uint64_t value;
    };
    ShipOptions to_second;
    to_second.peers = {a, b};
    // One forward first, so that the hop's code is compiled on both agents and the first's
    // connection to the second is open: the race below then has no compile or connect in it
    // (under ASan, those once outlasted the blocker and both forwards were taken).
    auto warm = client.ship(trust_kernels::hop, a, to_second, HopArgs{1, 0, 3}).get();
    INFO((warm ? std::string() : warm.error().describe()));
    REQUIRE(warm);
    CHECK(value_of(*warm) == 31);
    // The second's one worker is held at the gate until both forwards have come.
    Gate gate(client, b);
    auto blocker = client.ship(load_kernels::hold_until_released, b);
    gate.wait_held();
    // Both forwards go over the first agent's one connection to the second: one is held there
    // behind the blocker, the other refused (its hop at the first agent ran). Which is which
    // is the first agent's say: its workers run the two hops side by side.
    std::vector<Future> hops;
    hops.push_back(client.ship(trust_kernels::hop, a, to_second, HopArgs{1, 0, 4}));
    hops.push_back(client.ship(trust_kernels::hop, a, to_second, HopArgs{1, 0, 5}));
    test::wait_until([&] { return hops[0].ready() || hops[1].ready(); },
                     "one forward to be refused", test::kGateWaitLimit);
    const std::size_t refused_one = hops[0].ready() ? 0 : 1;
    auto r = hops[refused_one].get();
    REQUIRE_FALSE(r);
    INFO(r.error().describe());
    CHECK(r.error().code == Errc::busy);
    CHECK_THAT(r.error().message, Catch::Contains(fmt::format("agent {}", second.address())));
    CHECK_FALSE(hops[1 - refused_one].ready()); // held behind the blocker
    gate.release();
    auto h = hops[1 - refused_one].get();
    INFO((h ? std::string() : h.error().describe()));
    REQUIRE(h);
    CHECK(value_of(*h) == (refused_one == 0 ? 51 : 41));
    REQUIRE(blocker.get());
    CHECK(client.stats().busy_resends == 0); // not sent again: its first hop ran
}

}  // namespace inflight_limit_test_cpp
