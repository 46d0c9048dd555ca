// jit_tiers: what the tiered JIT buys, per `xagent --jit-tiers` setting, in one run.
//   cold ship            the first call to a fresh agent (bundle transfer + compile + run), with
//                        the agent's compile split and the tier it compiled
//   restart, first call  the first call to an agent restarted on a warm --cache-dir (the
//                        optimised object is linked, no IR), against cached calls to it: as
//                        xagent starts by default (it links its cached objects in the background
//                        at start, --cache-preload), and with --cache-preload 0 (the first call
//                        links it)
//   steady state         a compute kernel once the optimised code serves it (tier 1 swapped in,
//                        or the one-tier compile)
// The agents are real xagent processes started here on loopback.

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include <bitship/client.hpp>
#include <jit_tiers_kernels.hpp>

#include "launcher.hpp"
#include "mix_args.hpp"
#include "loopback_client.hpp"
#include "options.hpp"
#include "stats.hpp"

namespace {

using namespace bitship;
using namespace std::chrono_literals;
using bench::Row;
using bench::Summary;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

constexpr auto kTierUpTimeout = 30s;
constexpr std::uint64_t kColdRounds = 16; // the first call: as good as no work

double us_since(Clock::time_point t) { return std::chrono::duration<double, std::micro>(Clock::now() - t).count(); }

struct Config {
    int reps = 2000;
    int warmup = 200;
    int cold_reps = 10;
    int restart_reps = 5;
    int steady_reps = 200;
    std::uint64_t rounds = 200'000;
    std::string progress = "spin-then-block";
    std::string csv, json;
};

using bench::MixArgs;
using bench::mix_args;
using bench::mix_expected;

Client make_client(Transport t, const Config& cfg) {
    ClientOptions o;
    o.transport = t;
    o.loopback_only = true;
    o.progress = bench::progress_named(cfg.progress);
    auto c = Client::create(o);
    if (!c) throw std::runtime_error(c.error().describe());
    return std::move(*c);
}

std::vector<std::string> agent_args(const Config& cfg, unsigned tiers, const fs::path& cache_dir = {}) {
    std::vector<std::string> args{"--progress", cfg.progress, "--log-level", "warn", "--workers", "1", "--jit-tiers",
                                  std::to_string(tiers)};
    if (!cache_dir.empty()) args.insert(args.end(), {"--cache-dir", cache_dir.string()});
    return args;
}

void call_mix(Client& client, const Target& target, const MixArgs& args, std::uint64_t expected) {
    auto r = client.ship(jit_tiers_kernels::mix, target, args).get_as<std::uint64_t>();
    if (!r) throw std::runtime_error("mix failed: " + r.error().describe());
    if (*r != expected) throw std::runtime_error(fmt::format("mix answered {}, expected {}", *r, expected));
}

/// The optimised object is written once tier 1 is swapped in (or compiled, with one tier).
void wait_for_object(const fs::path& dir) {
    auto deadline = Clock::now() + kTierUpTimeout;
    for (;;) {
        for (const auto& e : fs::directory_iterator(dir))
            if (e.path().extension() == ".obj") return;
        if (Clock::now() > deadline) throw std::runtime_error("no optimised object in " + dir.string());
        std::this_thread::sleep_for(1ms);
    }
}

} // namespace

int main(int argc, char** argv) {
    bench::Options options{"Cold ship, restart and steady state of the tiered JIT, per --jit-tiers setting"};
    Config cfg;
    bool quick = false;
    std::vector<std::string> transports{"tcp", "shm"};
    std::vector<unsigned> tier_settings{2, 1};
    options.add("--reps", cfg.reps, "cached calls timed after a restart");
    options.add("--cold-reps", cfg.cold_reps, "cold ships (one fresh agent each)");
    options.add("--restart-reps", cfg.restart_reps, "restarts on a warm cache dir");
    options.add("--steady-reps", cfg.steady_reps, "timed compute calls");
    options.add("--rounds", cfg.rounds, "compute kernel rounds per steady-state call");
    options.add("--transport", transports, "transports to measure").transport();
    options.add("--jit-tiers", tier_settings, "xagent --jit-tiers settings to compare");
    options.add("--progress", cfg.progress, "progress mode of client and agents")
        .progress_mode();
    options.flag("--quick", quick, "fewer repetitions");
    options.add("--csv", cfg.csv, "write the rows as CSV here");
    options.add("--json", cfg.json, "write the rows as JSON here");
    if (auto status = options.parse(argc, argv)) return *status;
    if (quick) {
        cfg.reps = 500;
        cfg.cold_reps = 3;
        cfg.restart_reps = 3;
        cfg.steady_reps = 50;
    }

    fmt::print("jit_tiers: {} | progress {} | agent: 1 worker | {} cold ships, {} restarts ({} cached calls each), "
               "{} steady calls of {} rounds | loopback, unpinned\n\n",
               bench::cpu_description(), cfg.progress, cfg.cold_reps, cfg.restart_reps, cfg.reps, cfg.steady_reps,
               cfg.rounds);
    fmt::print("{:<5} {:<5} {:<42} {:>10} {:>10} {:>10} {:>10}\n", "tl", "tiers", "call", "median us", "p99 us", "min us",
               "max us");
    std::vector<Row> rows;
    std::vector<std::string> verdicts;
    std::map<std::pair<std::string, unsigned>, double> steady_median;
    try {
        for (const auto& tl : transports) {
            auto transport = parse_transport(tl);
            if (!transport) throw std::runtime_error(transport.error().message);
            for (unsigned tiers : tier_settings) {
                const std::string ts = std::to_string(tiers);
                auto print = [&](const std::string& what, const Summary& s) {
                    fmt::print("{:<5} {:<5} {:<42} {:>10.2f} {:>10.2f} {:>10.2f} {:>10.2f}\n", tl, ts, what, s.median, s.p99,
                               s.min, s.max);
                };
                auto labels = [&](const char* call) {
                    return std::vector<std::pair<std::string, std::string>>{{"transport", tl}, {"tiers", ts}, {"call", call}};
                };
                const auto cold_args = mix_args(kColdRounds);
                const auto cold_expected = mix_expected(cold_args);

                // 1. Cold ships, a fresh agent each, with the agent's split.
                std::vector<double> cold;
                std::map<std::string, std::vector<double>> split;
                for (int i = 0; i < cfg.cold_reps; ++i) {
                    launch::AgentProcess agent(tl, agent_args(cfg, tiers));
                    auto client = make_client(*transport, cfg);
                    auto target = client.connect(agent.address());
                    if (!target) throw std::runtime_error(target.error().describe());
                    auto t = Clock::now();
                    call_mix(client, *target, cold_args, cold_expected);
                    cold.push_back(us_since(t));
                    auto stats = client.agent_stats(*target);
                    if (!stats) throw std::runtime_error(stats.error().describe());
                    for (const auto& [k, v] : *stats) {
                        if (k == "last_compile_tier") split["tier"].push_back(double(v));
                        else if (k.rfind("last_compile_", 0) == 0 && k.ends_with("_ns"))
                            split[k.substr(13, k.size() - 13 - 3)].push_back(double(v) / 1000.0);
                    }
                }
                auto cold_s = bench::summarise(cold);
                print("cold ship (first call)", cold_s);
                Row cold_row{labels("cold_ship"), cold_s, {}};
                for (auto stage : {"verify", "parse", "optimise", "codegen", "link"}) {
                    auto s = bench::summarise(split[stage]);
                    print(fmt::format("  of which {} (agent)", stage), s);
                    cold_row.extra.emplace_back(fmt::format("{}_median_us", stage), s.median);
                }
                cold_row.extra.emplace_back("tier", bench::summarise(split["tier"]).median);
                fmt::print("{:<5} {:<5} {:<42} {:>10.0f}\n", tl, ts, "  compiled at tier", bench::summarise(split["tier"]).median);
                rows.push_back(cold_row);
                verdicts.push_back(fmt::format("{} tiers {}: cold ship median {:.2f} ms (target <= 2 ms) {}", tl, ts,
                                               cold_s.median / 1000, cold_s.median <= 2000 ? "MET" : "MISSED"));

                // 2. Restarts on a warm cache dir: the first call, then cached calls.
                auto dir = launch::make_temp_dir("bitship-jit-tiers-");
                {
                    launch::AgentProcess agent(tl, agent_args(cfg, tiers, dir));
                    auto client = make_client(*transport, cfg);
                    auto target = client.connect(agent.address());
                    if (!target) throw std::runtime_error(target.error().describe());
                    call_mix(client, *target, cold_args, cold_expected);
                    wait_for_object(dir);
                }
                // Twice: as xagent starts by default (its cached objects linked in the background
                // at start, --cache-preload), and with --cache-preload 0 (the first call links it).
                for (bool preload : {true, false}) {
                    std::vector<double> first, cached_medians, over, preloaded;
                    for (int i = 0; i < cfg.restart_reps; ++i) {
                        auto args = agent_args(cfg, tiers, dir);
                        if (!preload) args.insert(args.end(), {"--cache-preload", "0"});
                        launch::AgentProcess agent(tl, args);
                        auto client = make_client(*transport, cfg);
                        auto target = client.connect(agent.address());
                        if (!target) throw std::runtime_error(target.error().describe());
                        auto t = Clock::now();
                        call_mix(client, *target, cold_args, cold_expected);
                        first.push_back(us_since(t));
                        auto stats = client.agent_stats(*target);
                        if (!stats) throw std::runtime_error(stats.error().describe());
                        for (const auto& [k, v] : *stats)
                            if (k == "disk_preloads") preloaded.push_back(double(v));
                        for (int w = 0; w < cfg.warmup; ++w) call_mix(client, *target, cold_args, cold_expected);
                        std::vector<double> cached;
                        for (int r = 0; r < cfg.reps; ++r) {
                            auto c = Clock::now();
                            call_mix(client, *target, cold_args, cold_expected);
                            cached.push_back(us_since(c));
                        }
                        cached_medians.push_back(bench::summarise(cached).median);
                        over.push_back(first.back() - cached_medians.back());
                    }
                    auto first_s = bench::summarise(first), cached_s = bench::summarise(cached_medians),
                         over_s = bench::summarise(over);
                    const std::string how = preload ? "restart" : "restart, no preload";
                    print(how + ": first call", first_s);
                    print(how + ": cached call (median)", cached_s);
                    print(how + ": first over cached", over_s);
                    if (preload)
                        fmt::print("{:<5} {:<5} {:<42} {:>10.0f}   (objects the agent linked at start, median)\n", tl, ts,
                                   "restart: preloaded", bench::summarise(preloaded).median);
                    const char* tag = preload ? "restart" : "restart_no_preload";
                    rows.push_back({labels((std::string(tag) + "_first_call").c_str()), first_s, {}});
                    rows.push_back({labels((std::string(tag) + "_cached_call").c_str()), cached_s, {}});
                    rows.push_back({labels((std::string(tag) + "_first_over_cached").c_str()), over_s, {}});
                    verdicts.push_back(fmt::format("{} tiers {}: first call after restart{} is {:.3f} ms over a cached call "
                                                   "(target <= 0.5 ms) {}",
                                                   tl, ts, preload ? "" : " (--cache-preload 0)", over_s.median / 1000,
                                                   over_s.median <= 500 ? "MET" : "MISSED"));
                }
                fs::remove_all(dir);

                // 3. Steady state of the optimised code.
                auto steady_dir = launch::make_temp_dir("bitship-jit-tiers-");
                {
                    launch::AgentProcess agent(tl, agent_args(cfg, tiers, steady_dir));
                    auto client = make_client(*transport, cfg);
                    auto target = client.connect(agent.address());
                    if (!target) throw std::runtime_error(target.error().describe());
                    const auto args = mix_args(cfg.rounds);
                    const auto expected = mix_expected(args);
                    call_mix(client, *target, args, expected);
                    wait_for_object(steady_dir); // tier 1 serves from here on
                    for (int w = 0; w < 5; ++w) call_mix(client, *target, args, expected);
                    std::vector<double> steady;
                    for (int r = 0; r < cfg.steady_reps; ++r) {
                        auto t = Clock::now();
                        call_mix(client, *target, args, expected);
                        steady.push_back(us_since(t));
                    }
                    auto s = bench::summarise(steady);
                    print(fmt::format("steady: mix, {} rounds", cfg.rounds), s);
                    rows.push_back({labels("steady_mix"), s, {{"rounds", double(cfg.rounds)}}});
                    steady_median[{tl, tiers}] = s.median;
                }
                fs::remove_all(steady_dir);
            }
            if (steady_median.contains({tl, 1}) && steady_median.contains({tl, 2})) {
                double ratio = steady_median[{tl, 2}] / steady_median[{tl, 1}];
                verdicts.push_back(fmt::format("{}: steady state, two tiers / one tier = {:.3f}x (target <= 1.05x) {}", tl,
                                               ratio, ratio <= 1.05 ? "MET" : "MISSED"));
            }
        }
    } catch (const std::exception& e) {
        fmt::print(stderr, "jit_tiers: {}\n", e.what());
        return 1;
    }
    fmt::print("\n");
    for (const auto& v : verdicts) fmt::print("{}\n", v);
    std::vector<std::pair<std::string, std::string>> config{{"cpu", bench::cpu_description()},
                                                            {"progress", cfg.progress},
                                                            {"reps", std::to_string(cfg.reps)},
                                                            {"cold_reps", std::to_string(cfg.cold_reps)},
                                                            {"restart_reps", std::to_string(cfg.restart_reps)},
                                                            {"steady_reps", std::to_string(cfg.steady_reps)},
                                                            {"rounds", std::to_string(cfg.rounds)}};
    if (!cfg.csv.empty()) bench::write_csv(cfg.csv, rows);
    if (!cfg.json.empty()) bench::write_json(cfg.json, "jit_tiers", config, rows);
    return 0;
}
