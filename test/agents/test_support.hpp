#pragma once
// Helpers the agent integration tests share: a client for loopback agents, an agent's counters,
// xctl run as an operator would, and waiting for an agent to exit.

#include <catch2/catch.hpp>

#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <bitship/client.hpp>

#include "launcher.hpp"

namespace bitship::test {

/// Polls `done` until it holds, napping `poll` between looks; fails the test, saying it waited
/// for `what`, once `limit` has passed (a step that never comes fails, never hangs).
template <class Done>
void wait_until(Done&& done, const std::string& what,
                std::chrono::milliseconds limit = std::chrono::seconds(20),
                std::chrono::milliseconds poll = std::chrono::milliseconds(1)) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (!done()) {
        INFO("waited " << limit.count() << " ms for " << what);
        REQUIRE(std::chrono::steady_clock::now() < deadline);
        std::this_thread::sleep_for(poll);
    }
}

/// A client for loopback agents over `transport`, presenting the test key; `tweak` changes
/// any other option.
inline Client make_client(const std::string& transport, std::chrono::milliseconds call_timeout = std::chrono::seconds(30),
                          const std::function<void(ClientOptions&)>& tweak = {}) {
    ClientOptions o;
    o.transport = *parse_transport(transport);
    o.loopback_only = true;
    o.call_timeout = call_timeout;
    o.identity = launch::test_keys().secret; // some tests make the client before any agent
    if (tweak) tweak(o);
    auto c = Client::create(o);
    INFO((c ? std::string() : c.error().describe()));
    REQUIRE(c);
    return std::move(*c);
}

/// `client`'s connection to `agent`; fails the test, with the agent's log, when it does not connect.
inline Target connect(Client& client, const launch::AgentProcess& agent) {
    auto t = client.connect(agent.address());
    INFO(agent.log());
    REQUIRE(t);
    return *t;
}

/// The agent's counters by name.
inline std::map<std::string, std::uint64_t> agent_counters(Client& client, const Target& t) {
    auto s = client.agent_stats(t);
    INFO((s ? std::string() : s.error().describe()));
    REQUIRE(s);
    return {s->begin(), s->end()};
}

struct CommandOutput {
    int status = -1;
    std::string text;
};

/// Runs a command line, capturing its stdout.
inline CommandOutput run_command(const std::string& command) {
    CommandOutput out;
    FILE* p = popen(command.c_str(), "r");
    REQUIRE(p);
    char buf[4096];
    while (auto n = std::fread(buf, 1, sizeof buf, p)) out.text.append(buf, n);
    int st = pclose(p);
    out.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return out;
}

/// `xctl --json COMMAND` against `agent`: its one JSON object, with "exit_status" added.
inline nlohmann::json xctl_json(const launch::AgentProcess& agent, const std::string& command) {
    auto out = run_command(
        // UCX warns on stdout about variables this process set for other transports (shared memory's):
        // not JSON, so not here.
        fmt::format("UCX_WARN_UNUSED_ENV_VARS=n {} --agent {} --loopback --transport tcp --json {}", BITSHIP_XCTL,
                    agent.address(), command));
    INFO(out.text);
    auto j = nlohmann::json::parse(out.text);
    REQUIRE(j.is_array());
    REQUIRE(j.size() == 1);
    j[0]["exit_status"] = out.status;
    return j[0];
}

/// Waits up to `bound` for `agent`'s process to end: its status as waitpid gives it, or nullopt
/// when it is still running.
inline std::optional<int> wait_for_exit(const launch::AgentProcess& agent, std::chrono::milliseconds bound = std::chrono::seconds(10)) {
    const auto until = std::chrono::steady_clock::now() + bound;
    int status = 0;
    for (;;) {
        if (waitpid(agent.pid(), &status, WNOHANG) == agent.pid()) return status;
        if (std::chrono::steady_clock::now() >= until) return std::nullopt;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
}

} // namespace bitship::test
