// An agent's load travels in the header of every RESULT and ERROR it sends (core/agent_load.hpp):
// the client keeps the latest figure per target (Client::load).

#include "core/agent_load.hpp"
#include "gate.hpp"
#include "launcher.hpp"
#include "test_support.hpp"

#include <behaviour_kernels.hpp>
#include <bitship/client.hpp>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <load_kernels.hpp>
#include <thread>

namespace agent_load_test_cpp {

using namespace bitship;
using namespace std::chrono_literals;

namespace {

constexpr auto kWaitLimit = test::kGateWaitLimit;
using test::read_word;
using test::write_word;

std::uint64_t runs_seen(Client& client, const Target& t) {
    return test::agent_counters(client, t)["runs"];
}

/// An agent with one worker and a 4 KiB region "gate" for load_kernels::hold_until_released,
/// and a client connected to it.
struct GatedAgent {
    explicit GatedAgent(const std::string& transport)
        : agent(transport, test::with_gate({"--workers", "1"})),
          client(test::make_client(transport)), target(client.connect(agent.address())) {}
    launch::AgentProcess agent;
    Client client;
    Result<Target> target;
};

} // namespace

TEST_CASE("the load field packs queued and busy, saturating, and zero reads as idle", "[unit]") {
    CHECK(pack_agent_load(0, 0) == 0);
    CHECK(load_queued(0) == 0);
    CHECK(load_busy(0) == 0);
    auto bits = pack_agent_load(3, 2);
    CHECK(load_queued(bits) == 3);
    CHECK(load_busy(bits) == 2);
    auto saturated = pack_agent_load(1u << 20, 70000);
    CHECK(load_queued(saturated) == 0xffff);
    CHECK(load_busy(saturated) == 0xffff);
}

TEST_CASE("the client keeps each target's latest reported load", "[unit]") {
    AgentLoadTable table;
    CHECK(table.load(5).at == std::chrono::steady_clock::time_point{});
    auto now = std::chrono::steady_clock::now();
    table.record(5, pack_agent_load(4, 1), now);
    CHECK(table.load(5).queued == 4);
    CHECK(table.load(5).busy == 1);
    CHECK(table.load(5).at == now);
    CHECK(table.load(6).at ==
          std::chrono::steady_clock::time_point{}); // another target: nothing yet
    table.record(AgentLoadTable::kCapacity + 1, pack_agent_load(1, 1),
                 now); // beyond the table: dropped
    CHECK(table.load(AgentLoadTable::kCapacity + 1).queued == 0);
}

TEST_CASE("a busy agent reports its running kernel and its queue in the replies that follow, an "
          "idle one 0/0",
          "[integration]") {
    auto transport = GENERATE(as<std::string>{}, "tcp", "shm");
    INFO(transport);
    GatedAgent gated(transport);
    auto& client = gated.client;
    auto& target = gated.target;
    INFO(gated.agent.log());
    REQUIRE(target);
    CHECK(client.load(*target).at == std::chrono::steady_clock::time_point{}); // no reply yet

    // 1. Idle: the answered call's own kernel has finished, nothing else runs or waits.
    REQUIRE(client.ship(load_kernels::answer_now, *target).get_as<std::uint64_t>() ==
            std::uint64_t{7});
    auto idle = client.load(*target);
    CHECK(idle.queued == 0);
    CHECK(idle.busy == 0);
    CHECK(idle.at != std::chrono::steady_clock::time_point{});

    // 2. The one worker holds a kernel until released; a second call waits behind it.
    auto gate = client.region(*target, "gate");
    REQUIRE(gate);
    auto held = client.ship(load_kernels::hold_until_released, *target);
    test::wait_until([&] { return read_word(client, *gate, 0) != 0; },
                     "the kernel to hold the worker", kWaitLimit);
    auto runs_before = runs_seen(client, *target);
    auto waiting = client.ship(load_kernels::answer_now, *target);
    // The agent counts a RUN as it takes it and queues it in the same step: once the count
    // shows, the call is in the queue.
    test::wait_until([&] { return runs_seen(client, *target) != runs_before; },
                     "the second call to be queued", kWaitLimit);
    CHECK_FALSE(waiting.ready());

    // 3. An ERROR answered at once (no worker needed) carries the load: one busy, one queued.
    auto refused = client.ship_native("no_such_native_kernel", *target, {}).get();
    REQUIRE_FALSE(refused);
    CHECK(refused.error().code == Errc::entry_not_found);
    auto busy = client.load(*target);
    CHECK(busy.busy == 1);
    CHECK(busy.queued >= 1);
    CHECK(busy.at >= idle.at); // (stamped by the coarse clock: replies within a tick share a time)

    // 4. Released: both calls answer, and the agent is idle again.
    write_word(client, *gate, 1, 1);
    CHECK(held.get_as<std::uint64_t>() == std::uint64_t{1});
    CHECK(waiting.get_as<std::uint64_t>() == std::uint64_t{7});
    REQUIRE(client.ship(behaviour_kernels::add, *target, std::uint64_t{2}, std::uint64_t{3})
                .get_as<std::uint64_t>() == std::uint64_t{5});
    auto after = client.load(*target);
    CHECK(after.queued == 0);
    CHECK(after.busy == 0);
    CHECK(after.at >= busy.at);
}

TEST_CASE("a kernel whose last run was long has the engine's thread progress from its start, "
          "short kernels do not pay that wake-up",
          "[integration]") {
    auto transport = GENERATE(as<std::string>{}, "tcp", "shm");
    INFO(transport);
    GatedAgent gated(transport);
    auto& client = gated.client;
    auto& target = gated.target;
    INFO(gated.agent.log());
    REQUIRE(target);
    auto gate = client.region(*target, "gate");
    REQUIRE(gate);
    auto handovers = [&] { return test::agent_counters(client, *target)["progress_handovers"]; };

    // Short kernels: a wake-up of the engine's thread would cost them more than they run. A
    // run preempted past the threshold (100 us) makes the next one hand over; the agent times
    // a run inside the call's round trip seen here, so only a call after one whose round trip
    // took 100 us or more (or the first, after runs not seen here) may hand over. On a loaded
    // machine, or under a sanitizer, many do.
    // The code is compiled and optimised first: the first calls wait for a compile.
    REQUIRE(client.ship(load_kernels::answer_now, *target).get_as<std::uint64_t>() == std::uint64_t{7});
    REQUIRE(client.await_tier_ups(*target, kWaitLimit).value_or(false));
    const auto before_short = handovers();
    std::uint64_t may_hand_over = 1;
    for (int i = 0; i < 20; ++i) {
        const auto sent = std::chrono::steady_clock::now();
        REQUIRE(client.ship(load_kernels::answer_now, *target).get_as<std::uint64_t>() == std::uint64_t{7});
        if (i < 19 && std::chrono::steady_clock::now() - sent >= 100us) ++may_hand_over;
    }
    INFO(may_hand_over << " of 20 short calls came after a round trip of 100 us or more, or first");
    CHECK(handovers() - before_short <= may_hand_over);

    // A kernel held for milliseconds, three times: from the second on, its last run was long.
    // Meanwhile the agent keeps answering (the GETs of the gate, a call's queueing).
    const auto before_long = handovers();
    for (std::uint64_t round = 1; round <= 3; ++round) {
        write_word(client, *gate, 1, 0);
        auto held = client.ship(load_kernels::hold_until_released, *target);
        test::wait_until([&] { return read_word(client, *gate, 0) == round; },
                         "the kernel to hold the worker", kWaitLimit);
        std::this_thread::sleep_for(2ms);
        write_word(client, *gate, 1, 1);
        REQUIRE(held.get_as<std::uint64_t>() == std::uint64_t{1});
    }
    // The second and third runs hand over when the worker that took them leads (it does unless
    // the RUN came while the engine's thread led, which then keeps leading: nothing to hand over).
    CHECK(handovers() - before_long >= 1);
    CHECK(handovers() - before_long <= 2);
}

}  // namespace agent_load_test_cpp
