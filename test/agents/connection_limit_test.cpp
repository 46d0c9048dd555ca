// An agent at its connection limit (xagent --max-connections) refuses new connections: the
// caller's connect fails at once saying so, the connections it has go on, and a place freed by
// a client that leaves, or by a connection that never finished its handshake
// (--handshake-timeout-ms), is taken by the next.

#include "launcher.hpp"
#include "raw_peer.hpp"
#include "test_support.hpp"

#include <behaviour_kernels.hpp>
#include <bitship/client.hpp>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <thread>

namespace connection_limit_test_cpp {

using namespace bitship;
using bitship::launch::AgentProcess;
using bitship::test::agent_counters;
using bitship::test::connect;
using bitship::test::make_client;
using bitship::test::RawPeer;
using namespace std::chrono_literals;

TEST_CASE("an agent at its connection limit refuses new connections and serves the ones it has",
          "[integration]") {
    auto transport = GENERATE(as<std::string>{}, "tcp", "shm");
    INFO("transport " << transport);
    AgentProcess agent(transport, {"--max-connections", "2"});
    auto first = make_client(transport);
    auto first_target = connect(first, agent);
    std::optional<Client> second = make_client(transport);
    connect(*second, agent);

    auto third = make_client(transport);
    const auto began = std::chrono::steady_clock::now();
    auto refused = third.connect(agent.address());
    REQUIRE_FALSE(refused);
    INFO(refused.error().describe());
    CHECK(refused.error().code == Errc::connect_failed);
    CHECK_THAT(refused.error().message,
               Catch::Contains("refused the connection") && Catch::Contains("--max-connections"));
    // At once, not at the connect timeout.
    CHECK(std::chrono::steady_clock::now() - began < 2s);

    // The connections it has are served as before.
    auto r = first.ship(behaviour_kernels::busy_count, first_target, std::uint64_t{9}).get();
    INFO((r ? std::string() : r.error().describe()));
    REQUIRE(r);
    auto counters = agent_counters(first, first_target);
    CHECK(counters["refused_connections"] == 1);
    CHECK(counters["connections"] == 2);

    // A client that leaves frees its place (once the agent sees its endpoint close).
    second.reset();
    std::optional<Target> taken;
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (!taken && std::chrono::steady_clock::now() < deadline) {
        if (auto t = third.connect(agent.address()))
            taken = *t;
        else
            std::this_thread::sleep_for(20ms);
    }
    INFO(agent.log());
    REQUIRE(taken);
    auto again = third.ship(behaviour_kernels::busy_count, *taken, std::uint64_t{11}).get();
    REQUIRE(again);
    std::uint64_t v = 0;
    REQUIRE(again->size() == sizeof v);
    std::memcpy(&v, again->data(), sizeof v);
    CHECK(v == 11);
}

TEST_CASE("a connection that never finishes its handshake gives its place up to the next one",
          "[integration]") {
    auto transport = GENERATE(as<std::string>{}, "tcp", "shm");
    INFO("transport " << transport);
    AgentProcess agent(transport, {"--max-connections", "1", "--handshake-timeout-ms", "300"});
    // HELLO, WELCOME, and no AUTH: this agent asks for keys, so the session is never admitted.
    RawPeer idle(transport, agent.port(), /*authenticate=*/false);

    auto client = make_client(transport);
    auto refused = client.connect(agent.address()); // within its 300 ms: the place is taken
    REQUIRE_FALSE(refused);
    CHECK_THAT(refused.error().message, Catch::Contains("--max-connections"));
    std::this_thread::sleep_for(400ms);
    auto target = client.connect(agent.address()); // past them: the idle one is closed for it
    INFO(agent.log());
    REQUIRE(target);
    auto r = client.ship(behaviour_kernels::busy_count, *target, std::uint64_t{3}).get();
    REQUIRE(r);
    auto counters = agent_counters(client, *target);
    CHECK(counters["handshake_timeouts"] == 1);
    CHECK(counters["refused_connections"] == 1);
    CHECK_THAT(agent.log(), Catch::Contains("no AUTH with an authorized key within 300 ms"));
}

}  // namespace connection_limit_test_cpp
