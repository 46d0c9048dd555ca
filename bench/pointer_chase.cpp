// pointer_chase: a dependent walk through remote memory, three ways, same list, same answers.
//   get     the client walks with one RDMA GET per hop (a network round trip per hop)
//   native  a chase handler compiled into xagent in advance (the active-message baseline)
//   xrdma   the shipped chase kernel; it forwards itself to the agent owning the next node
// Agents are real xagent processes on loopback, started here; every answer is checked
// against a walk of the same list in this process.

#include <chrono>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <bitship/client.hpp>

#include "chase.hpp"
#include "core/engine.hpp"
#include "launcher.hpp"
#include "loopback_client.hpp"
#include "options.hpp"
#include "stats.hpp"

namespace {

using namespace bitship;
using Clock = std::chrono::steady_clock;
using xrdma::Chase;
using xrdma::ChaseList;
using xrdma::Strategy;

struct Config {
    std::vector<std::uint64_t> depths{1, 4, 16, 64, 256, 1024, 4096};
    std::vector<unsigned> agent_counts{1, 2, 4};
    std::vector<std::string> transports{"tcp", "shm"};
    unsigned log2_nodes = 20;
    std::uint64_t seed = 42;
    int min_reps = 5, max_reps = 300;
    double row_seconds = 0.5;
    int cold_reps = 3;
    std::string progress = "spin-then-block";
    std::string csv = "pointer_chase.csv";
    std::string png;
};

struct Measured {
    std::string transport;
    unsigned agents;
    Strategy strategy;
    std::uint64_t depth;
    bench::Summary s;
};

std::vector<std::string> agent_args(const Config& cfg, std::uint64_t region_bytes) {
    return {"--region", fmt::format("chase={}", region_bytes), "--progress", cfg.progress, "--log-level", "warn", "--workers", "1"};
}

Client make_client(Transport t, const Config& cfg) {
    ClientOptions o;
    o.transport = t;
    o.loopback_only = true;
    o.progress = bench::progress_named(cfg.progress);
    o.call_timeout = std::chrono::minutes(5);
    auto c = Client::create(o);
    if (!c) throw std::runtime_error(c.error().describe());
    return std::move(*c);
}

// Agents, a client connected to them, the list loaded.
struct Setup {
    std::vector<std::unique_ptr<launch::AgentProcess>> agents;
    std::unique_ptr<Client> client;
    std::vector<Target> targets;
    std::unique_ptr<Chase> chase;
};

Setup start(const std::string& tl, unsigned n, const ChaseList& list, const Config& cfg) {
    Setup s;
    auto region = list.nodes_per_agent() * sizeof(bs_chase_node);
    for (unsigned i = 0; i < n; ++i) s.agents.push_back(std::make_unique<launch::AgentProcess>(tl, agent_args(cfg, region)));
    s.client = std::make_unique<Client>(make_client(bench::transport_named(tl), cfg));
    for (auto& a : s.agents) {
        auto t = s.client->connect(a->address());
        if (!t) throw std::runtime_error(t.error().describe());
        s.targets.push_back(*t);
    }
    auto chase = Chase::open(*s.client, s.targets);
    if (!chase) throw std::runtime_error(chase.error().describe());
    s.chase = std::make_unique<Chase>(std::move(*chase));
    if (auto r = s.chase->load(list); !r) throw std::runtime_error(r.error().describe());
    return s;
}

// One timed chase and what it answered; check() compares it with a local walk.
struct Answer {
    Strategy strategy;
    std::uint64_t start, depth;
    bs_chase_result got;
};

double timed_chase(Chase& chase, Strategy st, std::uint64_t start, std::uint64_t depth, std::vector<Answer>& answers) {
    auto t = Clock::now();
    auto r = chase.run(st, start, depth);
    double us = std::chrono::duration<double, std::micro>(Clock::now() - t).count();
    if (!r) throw std::runtime_error(fmt::format("{} chase failed: {}", xrdma::to_string(st), r.error().describe()));
    answers.push_back({st, start, depth, *r});
    return us;
}

// A fast wrong answer is a failure, not a data point. Checked after the row, not between its
// chases: the reference walk goes through the client's own copy of the list (as large as the
// region), and between two timed chases it would push the region's page-table entries (the
// guest's and, in a VM, the host's) out of the caches, so every timed hop would pay a page walk
// from DRAM that a program chasing its data back to back does not (1 GiB, 1024 hops, on this
// VM: 170 us with a walk of another 1 GiB between chases at 261).
void check(const ChaseList& list, const std::vector<Answer>& answers) {
    for (const auto& a : answers) {
        auto want = list.walk(a.start, a.depth);
        if (a.got.addr != want.addr || a.got.sum != want.sum)
            throw std::runtime_error(fmt::format("WRONG ANSWER: {} depth {} from {:#x}: got node {:#x} sum {}, expected {:#x} sum {}",
                                                 xrdma::to_string(a.strategy), a.depth, a.start, a.got.addr, a.got.sum, want.addr,
                                                 want.sum));
    }
}

std::uint64_t random_start(std::mt19937_64& rng, const ChaseList& list) {
    return ChaseList::address_of(static_cast<unsigned>(rng() % list.agents()), rng() % list.nodes_per_agent());
}

} // namespace

int main(int argc, char** argv) {
    bench::Options options{"Pointer chase through remote memory: RDMA GET vs a pre-installed handler vs the shipped kernel"};
    Config cfg;
    bool quick = false;
    options.add("--depth", cfg.depths, "chase depths (hops)");
    options.add("--agents", cfg.agent_counts, "agent counts");
    options.add("--transport", cfg.transports, "transports (tcp, shm)").transport();
    options.add("--log2-nodes", cfg.log2_nodes, "nodes per agent = 2^N (16..26; 26 is a 1 GiB region)")
        .range(10, 26);
    options.add("--seed", cfg.seed, "list seed");
    options.add("--min-reps", cfg.min_reps, "timed chases per row, at least");
    options.add("--max-reps", cfg.max_reps, "timed chases per row, at most");
    options.add("--row-seconds", cfg.row_seconds, "stop adding reps to a row after this long (min-reps first)");
    options.add("--cold-reps", cfg.cold_reps, "cold X-RDMA chases (fresh agent each)");
    options.add("--progress", cfg.progress, "progress mode of client and agents")
        .progress_mode();
    options.add("--csv", cfg.csv, "write rows here");
    options.add("--png", cfg.png, "plot latency against depth here (runs bench/plot_chase.sh, needs gnuplot)");
    options.flag("--quick", quick, "depths 1, 64, 1024; 1 and 2 agents; 2^16 nodes; short rows (the README demo)");
    if (auto status = options.parse(argc, argv)) return *status;
    if (quick) {
        cfg.depths = {1, 64, 1024};
        cfg.agent_counts = {1, 2};
        cfg.log2_nodes = 16;
        cfg.row_seconds = 0.15;
        cfg.max_reps = 100;
        cfg.cold_reps = 1;
    }
    const std::uint64_t nodes = 1ull << cfg.log2_nodes;
    fmt::print("pointer_chase: {} | progress {} (client and agents) | each agent: 1 progress + 1 worker thread;\n"
               "  all processes share the machine's cores (no pinning) | 2^{} nodes/agent ({} MiB region), random sharding, seed {}\n"
               "  strategies take turns, each from a fresh random start of its own; {}..{} reps or {:.2f} s of chasing per row;\n"
               "  every answer checked against a local walk (after its row: between timed chases it would evict the region's page tables)\n"
               "  shm regions: {} (without either, 4 KiB pages)\n\n",
               bench::cpu_description(), cfg.progress, cfg.log2_nodes, nodes * 16 >> 20, cfg.seed, cfg.min_reps, cfg.max_reps,
               cfg.row_seconds, shared_huge_pages());
    fmt::print("{:<4} {:>6} {:<7} {:>6} {:>11} {:>11} {:>11} {:>5}\n", "tl", "agents", "strat", "depth", "median us", "p99 us",
               "chases/s", "reps");

    std::vector<Measured> results;
    std::vector<bench::Row> rows;
    std::mt19937_64 rng(cfg.seed ^ 0x9e3779b97f4a7c15ull);
    std::map<std::string, bench::Summary> cold;
    std::map<std::string, bool> get_by_loads; ///< per transport: the 1-agent GET read by direct loads
    try {
        for (const auto& tl : cfg.transports) {
            for (unsigned n : cfg.agent_counts) {
                auto list = ChaseList::make(n, nodes, cfg.seed + n);
                auto setup = start(tl, n, list, cfg);
                // What the kernel gave each region (the agents are on this host): a random hop
                // on 4 KiB pages is a TLB miss as well as a DRAM load.
                for (unsigned i = 0; i < n; ++i) {
                    auto r = setup.client->region(setup.targets[i], "chase");
                    if (!r) throw std::runtime_error(r.error().describe());
                    fmt::print("{:<4} {:>6} region of agent {}: {}\n", tl, n, i,
                               page_size_of(reinterpret_cast<const void*>(r->base), setup.agents[i]->pid()));
                    if (n == 1) {
                        auto loads = setup.client->mapped(*r);
                        get_by_loads[tl] = loads && *loads;
                    }
                }
                const Strategy strategies[] = {Strategy::get, Strategy::native, Strategy::xrdma};
                // Warm: the shipped kernel's code is on every agent before timing (cold is below).
                std::vector<Answer> answers;
                for (auto st : strategies) timed_chase(*setup.chase, st, random_start(rng, list), 64, answers);
                for (auto depth : cfg.depths) {
                    // The strategies take turns, one chase each, each from a fresh random start of
                    // its own: they see the same machine and neighbours, and none walks a path
                    // another has just pulled into the cache and TLB (with one start for all,
                    // the last strategy of each rep found its 1024 nodes warm).
                    std::vector<double> samples[3];
                    std::vector<double> spent(3, 0.0);
                    for (int rep = 0;; ++rep) {
                        bool more = false;
                        for (int i = 0; i < 3; ++i) {
                            auto start = random_start(rng, list);
                            bool want = rep < cfg.min_reps || (rep < cfg.max_reps && spent[i] < cfg.row_seconds * 1e6);
                            if (!want) continue;
                            samples[i].push_back(timed_chase(*setup.chase, strategies[i], start, depth, answers));
                            spent[i] += samples[i].back();
                            more = true;
                        }
                        if (!more) break;
                    }
                    check(list, answers);
                    answers.clear();
                    for (int i = 0; i < 3; ++i) {
                        auto st = strategies[i];
                        auto s = bench::summarise(samples[i]);
                        double per_s = 1e6 / s.mean;
                        fmt::print("{:<4} {:>6} {:<7} {:>6} {:>11.1f} {:>11.1f} {:>11.0f} {:>5}\n", tl, n, xrdma::to_string(st), depth,
                                   s.median, s.p99, per_s, s.n);
                        results.push_back({tl, n, st, depth, s});
                        rows.push_back({{{"transport", tl}, {"agents", std::to_string(n)}, {"strategy", std::string(xrdma::to_string(st))},
                                         {"depth", std::to_string(depth)}},
                                        s,
                                        {{"chases_per_s", per_s}}});
                    }
                }
                auto c = setup.client->stats();
                if (c.stray_replies) throw std::runtime_error(fmt::format("{} stray replies: a chase answered twice", c.stray_replies));
            }
            // Cold: first X-RDMA chase to a fresh agent, code transfer and JIT included.
            std::vector<double> samples;
            for (int i = 0; i < cfg.cold_reps; ++i) {
                auto list = ChaseList::make(1, nodes, cfg.seed + 1);
                auto setup = start(tl, 1, list, cfg);
                std::vector<Answer> answers;
                samples.push_back(timed_chase(*setup.chase, Strategy::xrdma, random_start(rng, list), 1024, answers));
                check(list, answers);
            }
            cold[tl] = bench::summarise(samples);
            fmt::print("{:<4} {:>6} {:<7} {:>6} {:>11.1f} {:>11.1f} {:>11} {:>5}   cold: first call to a fresh agent (code + JIT)\n",
                       tl, 1, "xrdma", 1024, cold[tl].median, cold[tl].p99, "-", cold[tl].n);
            rows.push_back({{{"transport", tl}, {"agents", "1"}, {"strategy", "xrdma_cold"}, {"depth", "1024"}}, cold[tl], {{"chases_per_s", 0}}});
        }
    } catch (const std::exception& e) {
        fmt::print(stderr, "\npointer_chase: FAILED: {}\n", e.what());
        return 1;
    }

    auto median_of = [&](const std::string& tl, unsigned n, Strategy st, std::uint64_t d) -> double {
        for (const auto& m : results)
            if (m.transport == tl && m.agents == n && m.strategy == st && m.depth == d) return m.s.median;
        return std::nan("");
    };
    fmt::print("\nTargets (ratios of medians from this run):\n");
    for (const auto& tl : cfg.transports) {
        double worst = 0;
        std::uint64_t worst_depth = 0;
        for (auto d : cfg.depths) {
            double r = median_of(tl, 1, Strategy::xrdma, d) / median_of(tl, 1, Strategy::native, d);
            if (r > worst) worst = r, worst_depth = d;
        }
        if (worst > 0)
            fmt::print("  {}: X-RDMA / native, 1 agent, worst over depths = {:.3f} (depth {}) (target <= 1.10) {}\n", tl, worst,
                       worst_depth, worst <= 1.10 ? "MET" : "MISSED");
        double one = median_of(tl, 1, Strategy::get, 1024) / median_of(tl, 1, Strategy::xrdma, 1024);
        if (!std::isnan(one) && get_by_loads[tl])
            // The X-RDMA issue set this target when a GET crossed UCX; a same-host GET now
            // reads the agent's memory by direct loads, a walk as fast as the shipped kernel's.
            fmt::print("  {}: GET / X-RDMA, 1 agent, depth 1024 = {:.3f} (no target: GET read this same-host region by "
                       "direct loads; the X-RDMA target >= 5 was set for a GET through UCX)\n", tl, one);
        else if (!std::isnan(one))
            fmt::print("  {}: GET / X-RDMA, 1 agent, depth 1024 = {:.1f} (target >= {}) {}\n", tl, one, tl == "tcp" ? 40 : 5,
                       one >= (tl == "tcp" ? 40 : 5) ? "MET" : "MISSED");
        double four = median_of(tl, 4, Strategy::get, 1024) / median_of(tl, 4, Strategy::xrdma, 1024);
        if (!std::isnan(four))
            fmt::print("  {}: GET / X-RDMA, 4 agents, depth 1024 = {:.2f} (target >= 1.7) {}\n", tl, four, four >= 1.7 ? "MET" : "MISSED");
    }
    bench::write_csv(cfg.csv, rows);
    fmt::print("\nrows written to {}\n", cfg.csv);
    if (!cfg.png.empty()) {
        auto cmd = fmt::format("bash '{}/plot_chase.sh' '{}' '{}'", BITSHIP_BENCH_DIR, cfg.csv, cfg.png);
        if (std::system(cmd.c_str()) == 0) fmt::print("plot written to {}\n", cfg.png);
        else fmt::print(stderr, "plot failed (is gnuplot installed? scripts/setup.sh installs gnuplot-nox)\n");
    }
    return 0;
}
