// A client of a launched job: connects to every agent of a peers file (Client::connect_all, rank
// order), loads a random cyclic list across all of them and checks shipped-kernel chases
// (forwarding agent to agent) against a local walk. Prints one line per check; exit 0 only when
// every answer is right. Used by the mpirun and Slurm tests and the 32-agent run.
//
//   chase_job PEERS_FILE [--depth N] [--walks N] [--transport tcp|shm|any]

#include <chrono>
#include <cstdio>
#include <string>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <bitship/client.hpp>

#include "chase.hpp"

using namespace bitship;
using namespace std::chrono_literals;

int main(int argc, char** argv) {
    CLI::App app{"chase_job: a pointer chase across every agent of a peers file, checked against a local walk"};
    std::string peers_file, transport = "tcp";
    std::uint64_t depth = 256, nodes = 1 << 12, seed = 2026;
    unsigned walks = 4;
    app.add_option("peers_file", peers_file, "xagent --peers-file output")->required();
    app.add_option("--depth", depth, "hops per walk")->capture_default_str();
    app.add_option("--walks", walks, "walks from different starts")->capture_default_str();
    app.add_option("--nodes", nodes, "list nodes per agent (the region must hold 16 bytes each)")->capture_default_str();
    app.add_option("--transport", transport, "tcp, shm or any")->capture_default_str();
    CLI11_PARSE(app, argc, argv);

    ClientOptions o;
    o.transport = *parse_transport(transport);
    o.loopback_only = true;
    o.call_timeout = 60s;
    o.connect_timeout = 10s;
    auto client = Client::create(o);
    if (!client) {
        fmt::print(stderr, "chase_job: {}\n", client.error().describe());
        return 1;
    }
    auto began = std::chrono::steady_clock::now();
    auto targets = client->connect_all(peers_file);
    if (!targets) {
        fmt::print(stderr, "chase_job: {}\n", targets.error().describe());
        return 1;
    }
    auto agents = static_cast<unsigned>(targets->size());
    fmt::print("connected to {} agents in {:.1f} ms\n", agents,
               std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - began).count());
    auto list = xrdma::ChaseList::make(agents, nodes, seed);
    auto chase = xrdma::Chase::open(*client, *targets);
    if (!chase) {
        fmt::print(stderr, "chase_job: {}\n", chase.error().describe());
        return 1;
    }
    if (auto loaded = chase->load(list); !loaded) {
        fmt::print(stderr, "chase_job: load: {}\n", loaded.error().describe());
        return 1;
    }
    int wrong = 0;
    std::vector<bool> visited(agents, false);
    for (unsigned w = 0; w < walks; ++w) {
        auto start = xrdma::ChaseList::address_of(w % agents, (w * 977) % nodes);
        auto expected = list.walk(start, depth);
        // Which agents this walk passes through (the node read at each hop).
        auto at = start;
        for (std::uint64_t h = 0; h < depth; ++h) {
            visited[BS_CHASE_OWNER(at)] = true;
            at = list.walk(at, 1).addr;
        }
        auto t0 = std::chrono::steady_clock::now();
        auto got = chase->run(xrdma::Strategy::xrdma, start, depth);
        auto ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        if (!got) {
            fmt::print("walk {}: FAILED: {}\n", w, got.error().describe());
            ++wrong;
            continue;
        }
        bool ok = got->addr == expected.addr && got->sum == expected.sum;
        fmt::print("walk {}: depth {} from {:#x}: {} ({:.2f} ms)\n", w, depth, start, ok ? "correct" : "WRONG", ms);
        if (!ok) ++wrong;
    }
    auto reached = std::count(visited.begin(), visited.end(), true);
    fmt::print("walks passed through {} of {} agents; {} wrong\n", reached, agents, wrong);
    if (reached != agents) {
        fmt::print("not every agent was on a walk: use more --walks or --depth\n");
        return 1;
    }
    return wrong == 0 ? 0 : 1;
}
