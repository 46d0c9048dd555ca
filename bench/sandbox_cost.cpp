// sandbox_cost: what software fault isolation (xagent --sandbox sfi, the default) costs against
// --sandbox none, in one run, on two agents started alike but for that flag:
//   chase 2^N        X-RDMA pointer chase at depth 1024 on one agent (the shipped kernel walks
//                    its region), 2^20 and 2^26 nodes: target <= 1.10x
//   cached ship      the empty kernel, a cached call's round trip: target <= 1.05x
//   sum_words        memory-bound: sums 128 MiB of a region           target <= 1.15x
//   mandelbrot       compute-bound: floating point in registers         target <= 1.15x
//   interpret        indirect calls: a bytecode loop dispatching through a function table
//                                                                       target <= 1.15x
//   leaks            1,000 calls that each leak 1 MiB: each agent's resident memory before and
//                    after (sfi reclaims a call's heap when it ends; none keeps every MiB)
// Calls go to the two agents in alternating blocks, so both see the same machine over the run
// while the other sleeps. Answers are compared between the agents (and for the chase, with the
// walk done here).

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <bench_kernels.hpp>
#include <bitship/client.hpp>
#include <sandbox_cost_kernels.hpp>

#include "chase.hpp"
#include "launcher.hpp"
#include "loopback_client.hpp"
#include "options.hpp"
#include "stats.hpp"

namespace {

using namespace bitship;
using bench::Row;
using bench::Summary;
using Clock = std::chrono::steady_clock;

double us_since(Clock::time_point t) { return std::chrono::duration<double, std::micro>(Clock::now() - t).count(); }

struct Config {
    int chase_reps = 2000;
    int ship_reps = 20000;
    int compute_reps = 200;
    int block = 50;
    int leak_calls = 1000;
    std::uint64_t seed = 1;
    std::string transport = "tcp";
    std::string progress = "spin-then-block";
    std::string csv, json;
};

constexpr std::uint64_t kDepth = 1024;
constexpr std::uint64_t kDataBytes = std::uint64_t{256} << 20;

struct Pair {
    std::unique_ptr<launch::AgentProcess> sfi, none;
    std::optional<Target> sfi_target, none_target;
};

Pair start_pair(Client& client, const Config& cfg, std::uint64_t chase_bytes) {
    std::vector<std::string> args{"--region", fmt::format("chase={}", chase_bytes), "--region", fmt::format("data={}", kDataBytes),
                                  "--progress", cfg.progress, "--log-level", "warn", "--workers", "1"};
    Pair p;
    p.sfi = std::make_unique<launch::AgentProcess>(cfg.transport, args);
    args.insert(args.end(), {"--sandbox", "none"});
    p.none = std::make_unique<launch::AgentProcess>(cfg.transport, args);
    for (auto [agent, target, mode] : {std::tuple{p.sfi.get(), &p.sfi_target, SandboxMode::sfi},
                                       std::tuple{p.none.get(), &p.none_target, SandboxMode::none}}) {
        auto t = client.connect(agent->address());
        if (!t) throw std::runtime_error(t.error().describe());
        if (t->info().sandbox != mode)
            throw std::runtime_error(fmt::format("agent {} runs sandbox '{}', expected '{}'", agent->address(),
                                                 to_string(t->info().sandbox), to_string(mode)));
        target->emplace(*t);
    }
    return p;
}

/// Times `call(target)` on both agents in alternating blocks; checks both answer alike.
template <class Call> std::pair<Summary, Summary> alternate(const Pair& p, int reps, int warmup, int block, Call call) {
    std::uint64_t sfi_answer = 0, none_answer = 0;
    for (int i = 0; i < warmup; ++i) sfi_answer = call(*p.sfi_target), none_answer = call(*p.none_target);
    if (sfi_answer != none_answer)
        throw std::runtime_error(fmt::format("the agents disagree: sfi answered {}, none {}", sfi_answer, none_answer));
    std::vector<double> sfi_us, none_us;
    for (int done = 0; done < reps; done += block) {
        const int n = std::min(block, reps - done);
        for (auto [target, out] : {std::pair{&*p.sfi_target, &sfi_us}, std::pair{&*p.none_target, &none_us}})
            for (int i = 0; i < n; ++i) {
                auto t = Clock::now();
                call(*target);
                out->push_back(us_since(t));
            }
    }
    return {bench::summarise(sfi_us), bench::summarise(none_us)};
}

std::size_t resident_bytes(pid_t pid) {
    std::ifstream statm("/proc/" + std::to_string(pid) + "/statm");
    std::size_t pages = 0, resident = 0;
    statm >> pages >> resident;
    return resident * static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
}

std::uint64_t value_of(const Future& f, const char* what) {
    auto r = f.get_as<std::uint64_t>();
    if (!r) throw std::runtime_error(fmt::format("{}: {}", what, r.error().describe()));
    return *r;
}

} // namespace

int main(int argc, char** argv) {
    bench::Options options{"The sandbox's cost: --sandbox sfi against --sandbox none, chase, cached ship and compute kernels, in one run"};
    Config cfg;
    bool quick = false;
    std::vector<unsigned> chase_log2{20, 26};
    options.add("--chase-reps", cfg.chase_reps, "timed chases per agent and size");
    options.add("--ship-reps", cfg.ship_reps, "timed cached ships per agent");
    options.add("--compute-reps", cfg.compute_reps, "timed calls per agent and compute kernel");
    options.add("--block", cfg.block, "consecutive calls to one agent before switching to the other")
        .positive();
    options.add("--chase-log2-nodes", chase_log2, "chase list sizes, 2^N nodes (16..26)");
    options.add("--transport", cfg.transport, "tcp or shm").transport();
    options.add("--progress", cfg.progress, "progress mode of client and agents")
        .progress_mode();
    options.add("--seed", cfg.seed, "chase list seed");
    options.add("--leak-calls", cfg.leak_calls, "calls leaking 1 MiB each, per agent");
    options.flag("--quick", quick, "fewer repetitions, 2^20 nodes only");
    options.add("--csv", cfg.csv, "write the rows as CSV here");
    options.add("--json", cfg.json, "write the rows as JSON here");
    if (auto status = options.parse(argc, argv)) return *status;
    if (quick) {
        cfg.chase_reps = 200;
        cfg.ship_reps = 2000;
        cfg.compute_reps = 20;
        chase_log2 = {20};
    }
    for (auto n : chase_log2)
        if (n < 16 || n > 26) {
            fmt::print(stderr, "sandbox_cost: --chase-log2-nodes {} is outside 16..26\n", n);
            return 2;
        }
    fmt::print("sandbox_cost: {} | transport {} | progress {} | two agents, 1 worker each, --sandbox sfi and none, "
               "alternating blocks of {}\n  chase depth {} ({} timed per size), cached ship ({} timed), compute kernels "
               "({} timed each); loopback, processes unpinned\n\n",
               bench::cpu_description(), cfg.transport, cfg.progress, cfg.block, kDepth, cfg.chase_reps, cfg.ship_reps,
               cfg.compute_reps);
    fmt::print("{:<26} {:>8} {:>11} {:>10} {:>11} {:>10} {:>8} {:>7} {:>6}\n", "what", "", "sfi med us", "sfi p99",
               "none med us", "none p99", "ratio", "target", "");
    std::vector<Row> rows;
    int missed = 0;
    auto report = [&](const std::string& what, const std::pair<Summary, Summary>& s, double target) {
        const double ratio = s.first.median / s.second.median;
        const bool met = ratio <= target;
        missed += met ? 0 : 1;
        fmt::print("{:<26} {:>8} {:>11.2f} {:>10.2f} {:>11.2f} {:>10.2f} {:>7.3f}x {:>6.2f}x {:>6}\n", what, "", s.first.median,
                   s.first.p99, s.second.median, s.second.p99, ratio, target, met ? "MET" : "MISSED");
        rows.push_back({{{"what", what}, {"sandbox", "sfi"}}, s.first, {{"ratio", ratio}, {"target", target}}});
        rows.push_back({{{"what", what}, {"sandbox", "none"}}, s.second, {}});
    };
    try {
        ClientOptions o;
        o.transport = bench::transport_named(cfg.transport);
        o.loopback_only = true;
        o.progress = bench::progress_named(cfg.progress);
        o.call_timeout = std::chrono::seconds(60);
        o.identity = launch::test_keys().secret; // made before any agent, which would set BITSHIP_IDENTITY
        auto client = Client::create(o);
        if (!client) throw std::runtime_error(client.error().describe());

        Pair last;
        for (std::size_t k = 0; k < chase_log2.size(); ++k) {
            const std::uint64_t nodes = std::uint64_t{1} << chase_log2[k];
            auto list = xrdma::ChaseList::make(1, nodes, cfg.seed);
            Pair p = start_pair(*client, cfg, nodes * sizeof(bs_chase_node));
            std::vector<xrdma::Chase> chases;
            for (const Target& t : {*p.sfi_target, *p.none_target}) {
                auto chase = xrdma::Chase::open(*client, {t});
                if (!chase) throw std::runtime_error(chase.error().describe());
                if (auto loaded = chase->load(list); !loaded) throw std::runtime_error(loaded.error().describe());
                chases.push_back(std::move(*chase));
            }
            // Each walk goes on where the last one stopped, so no call finds its nodes in cache
            // (the same 1024 nodes every time would be an L2 walk). The walks are worked out
            // here first; each agent makes the same sequence.
            constexpr int kChaseWarmup = 20;
            std::vector<std::uint64_t> starts{xrdma::ChaseList::address_of(0, 0)};
            std::vector<bs_chase_result> expected;
            for (int i = 0; i < cfg.chase_reps + kChaseWarmup; ++i) {
                expected.push_back(list.walk(starts.back(), kDepth));
                starts.push_back(expected.back().addr);
            }
            std::size_t next[2] = {0, 0};
            auto timed = alternate(p, cfg.chase_reps, kChaseWarmup, cfg.block, [&](const Target& t) {
                const int which = &t == &*p.sfi_target ? 0 : 1;
                const std::size_t k = next[which]++;
                auto r = chases[static_cast<std::size_t>(which)].run(xrdma::Strategy::xrdma, starts[k], kDepth);
                if (!r) throw std::runtime_error(fmt::format("chase: {}", r.error().describe()));
                if (r->addr != expected[k].addr || r->sum != expected[k].sum)
                    throw std::runtime_error(fmt::format("chase: wrong answer from the {} agent", which == 0 ? "sfi" : "none"));
                return r->sum;
            });
            report(fmt::format("chase 2^{} depth {}", chase_log2[k], kDepth), timed, 1.10);
            last = std::move(p);
        }
        if (!last.sfi) last = start_pair(*client, cfg, std::uint64_t{1} << 20);

        report("cached ship (empty)", alternate(last, cfg.ship_reps, 1000, cfg.block * 10, [&](const Target& t) {
                   auto r = client->ship(bench_kernels::empty, t, std::uint64_t{7}).get();
                   if (!r) throw std::runtime_error(fmt::format("cached ship: {}", r.error().describe()));
                   return std::uint64_t{0};
               }), 1.05);
        const std::uint64_t words = (std::uint64_t{128} << 20) / 8; // past any L3 here
        report("sum_words 128 MiB", alternate(last, cfg.compute_reps, 5, std::max(1, cfg.block / 10), [&](const Target& t) {
                   return value_of(client->ship(sandbox_cost_kernels::sum_words, t, std::uint64_t{0}, words), "sum_words");
               }), 1.15);
        report("mandelbrot 256^2 x 64", alternate(last, cfg.compute_reps, 5, std::max(1, cfg.block / 10), [&](const Target& t) {
                   return value_of(client->ship(sandbox_cost_kernels::mandelbrot, t, std::uint64_t{256}, std::uint64_t{64}),
                                   "mandelbrot");
               }), 1.15);
        report("interpret 4M steps", alternate(last, cfg.compute_reps, 5, std::max(1, cfg.block / 10), [&](const Target& t) {
                   return value_of(client->ship(sandbox_cost_kernels::interpret, t, std::uint64_t{4} << 20), "interpret");
               }), 1.15);
        const std::size_t targets = rows.size() / 2;
        fmt::print("\n{} of {} cost targets met\n\n", targets - static_cast<std::size_t>(missed), targets);
        // Leaks: resident memory after 10 warm-up calls and after 1,000 more, each agent.
        for (auto [agent, target, mode] : {std::tuple{last.sfi.get(), &*last.sfi_target, "sfi"},
                                           std::tuple{last.none.get(), &*last.none_target, "none"}}) {
            for (int i = 0; i < 10; ++i) value_of(client->ship(sandbox_cost_kernels::leak_mib, *target), "leak_mib");
            const auto before = resident_bytes(agent->pid());
            for (int i = 0; i < cfg.leak_calls; ++i) value_of(client->ship(sandbox_cost_kernels::leak_mib, *target), "leak_mib");
            const auto after = resident_bytes(agent->pid());
            const double grew = (static_cast<double>(after) - static_cast<double>(before)) / (1 << 20);
            fmt::print("leaks, --sandbox {:<4}: {} calls leaking 1 MiB each: resident {:.1f} MiB before, {:.1f} MiB after "
                       "({:+.1f} MiB){}\n",
                       mode, cfg.leak_calls, before / 1048576.0, after / 1048576.0, grew,
                       std::string_view(mode) == "sfi" ? (grew <= 64 ? " within the 64 MiB quota: MET" : " past the quota: MISSED")
                                                       : "");
            rows.push_back({{{"what", "leaks"}, {"sandbox", mode}}, {},
                            {{"calls", cfg.leak_calls}, {"resident_before_mib", before / 1048576.0},
                             {"resident_after_mib", after / 1048576.0}}});
        }
    } catch (const std::exception& e) {
        fmt::print(stderr, "sandbox_cost: {}\n", e.what());
        return 1;
    }
    std::vector<std::pair<std::string, std::string>> config{{"cpu", bench::cpu_description()},
                                                            {"transport", cfg.transport},
                                                            {"progress", cfg.progress},
                                                            {"chase_reps", std::to_string(cfg.chase_reps)},
                                                            {"ship_reps", std::to_string(cfg.ship_reps)},
                                                            {"compute_reps", std::to_string(cfg.compute_reps)},
                                                            {"block", std::to_string(cfg.block)}};
    if (!cfg.csv.empty()) bench::write_csv(cfg.csv, rows);
    if (!cfg.json.empty()) bench::write_json(cfg.json, "sandbox_cost", config, rows);
    return 0;
}
