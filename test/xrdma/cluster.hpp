#pragma once
// Real xagent processes on loopback and a client connected to each: what the X-RDMA
// integration tests start from.

#include <catch2/catch.hpp>

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <bitship/client.hpp>

#include "launcher.hpp"

namespace bitship::test {

struct Cluster {
    std::vector<std::unique_ptr<launch::AgentProcess>> agents;
    Client client;
    std::vector<Target> targets; ///< in the order of `agents`
    /// Every agent's log, for a failing check's message.
    [[nodiscard]] std::string logs() const {
        std::string out;
        for (const auto& a : agents) out += a->log();
        return out;
    }
};

/// `n` agents over `transport` ("tcp", "shm"), each started with `extra` arguments.
inline Cluster start_cluster(const std::string& transport, unsigned n, const std::vector<std::string>& extra,
                             std::chrono::milliseconds call_timeout = std::chrono::seconds(30)) {
    std::vector<std::unique_ptr<launch::AgentProcess>> agents;
    for (unsigned i = 0; i < n; ++i) agents.push_back(std::make_unique<launch::AgentProcess>(transport, extra));
    ClientOptions o;
    o.transport = *parse_transport(transport);
    o.loopback_only = true;
    o.call_timeout = call_timeout;
    auto client = Client::create(o);
    REQUIRE(client);
    Cluster c{std::move(agents), std::move(*client), {}};
    for (auto& a : c.agents) {
        auto t = c.client.connect(a->address());
        INFO(a->log());
        REQUIRE(t);
        c.targets.push_back(*t);
    }
    return c;
}

/// An agent's counters by name.
inline std::map<std::string, std::uint64_t> counters(Client& client, const Target& t) {
    auto s = client.agent_stats(t);
    INFO((s ? std::string() : s.error().describe()));
    REQUIRE(s);
    return {s->begin(), s->end()};
}

} // namespace bitship::test
