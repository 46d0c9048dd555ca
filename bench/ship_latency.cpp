// ship_latency: what a call costs, per transport, in one run.
//   raw AM round trip   PING answered by the agent's progress thread (no kernel): the floor
//                       a pre-installed active-message handler gets
//   cached ship         the `empty` kernel with 8-byte arguments, code already on the agent
//   cold ship           the first call to a fresh agent: bundle transfer + JIT + run, with
//                       the agent's own split of the compile; once with the compile in a
//                       bitship-compiler process (the default), once in the agent's own
//                       process (--compiler=in-process), and their ratio
//   ping by another     a second client's PINGs to a fresh agent from a first call's start
//   client              until its caller holds the answer (the default compiler process): the
//                       tier-0 compile, and on two cores the start of the tier-1 one behind it;
//                       after the first ping of each, one call of that client's own cached
//                       kernel (`mix` of jit_tiers, 0 rounds), on the agent's one worker
// The agents are real xagent processes started here on loopback. With --agent-arch aarch64
// they are the aarch64 cross build run by qemu-user: EMULATED figures, which measure qemu on
// this machine, not a DPU, and are not comparable with native ones.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>
#include <thread>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <bench_kernels.hpp>
#include <jit_tiers_kernels.hpp>
#include <bitship/client.hpp>

#include "emulated_agent.hpp"
#include "launcher.hpp"
#include "mix_args.hpp"
#include "loopback_client.hpp"
#include "options.hpp"
#include "perftest.hpp"
#include "stats.hpp"

namespace {

/// The bulk call that opens a session's bulk window (over kWindowArgsMin, 32 KiB).
constexpr std::size_t kBulkArgs = 64 << 10;

using namespace bitship;
using bench::Row;
using bench::Summary;
using Clock = std::chrono::steady_clock;

double us_since(Clock::time_point t) { return std::chrono::duration<double, std::micro>(Clock::now() - t).count(); }

struct Config {
    int reps = 20000;
    int warmup = 2000;
    int cold_reps = 10;
    std::string progress = "spin-then-block";
    unsigned spin_us = 200;
    unsigned worker_spin_us = 0;
    std::string csv, json;
    std::string agent_arch = "x86_64";
    int idle_reps = 50;
    int idle_ms = 5;
    std::string emulated_cpu = "neoverse-n1";
    bool bulk_window = true;
    std::vector<std::string> agent_extra; ///< --agent-arg: passed to every agent as they are
};

Client make_client(Transport t, const Config& cfg) {
    ClientOptions o;
    o.transport = t;
    o.loopback_only = true;
    o.progress = bench::progress_named(cfg.progress);
    o.spin = std::chrono::microseconds(cfg.spin_us);
    o.bulk_window = cfg.bulk_window;
    auto c = Client::create(o);
    if (!c) throw std::runtime_error(c.error().describe());
    return std::move(*c);
}

std::vector<std::string> agent_args(const Config& cfg) {
    std::vector<std::string> args{"--progress", cfg.progress, "--spin-us", std::to_string(cfg.spin_us), "--log-level", "warn",
                                  "--workers", "1", "--worker-spin-us", std::to_string(cfg.worker_spin_us)};
    args.insert(args.end(), cfg.agent_extra.begin(), cfg.agent_extra.end());
    return args;
}

template <class Call> std::vector<double> time_calls(int warmup, int reps, Call&& call) {
    for (int i = 0; i < warmup; ++i) call();
    std::vector<double> samples;
    samples.reserve(static_cast<std::size_t>(reps));
    for (int i = 0; i < reps; ++i) {
        auto t = Clock::now();
        call();
        samples.push_back(us_since(t));
    }
    return samples;
}

void must(const Result<Bytes>& r, const char* what) {
    if (!r) throw std::runtime_error(fmt::format("{} failed: {}", what, r.error().describe()));
}

} // namespace

int main(int argc, char** argv) {
    bench::Options options{"Round-trip latency of raw AM, cached ships and cold ships, over TCP and shared memory"};
    Config cfg;
    bool quick = false;
    std::vector<std::string> transports{"tcp", "shm"};
    options.add("--reps", cfg.reps, "timed repetitions per row");
    options.add("--warmup", cfg.warmup, "untimed repetitions before each row");
    options.add("--cold-reps", cfg.cold_reps, "cold ships (one fresh agent each)");
    options.add("--transport", transports, "transports to measure").transport();
    options.add("--progress", cfg.progress, "progress mode of client and agents: spin, block, spin-then-block")
        .progress_mode();
    options.add("--spin-us", cfg.spin_us, "spin window before sleeping (spin-then-block)");
    options.add("--worker-spin-us", cfg.worker_spin_us, "agent: an idle worker polls this long before sleeping");
    options.add("--idle-reps", cfg.idle_reps, "cached ships timed after an idle spell each");
    options.add("--idle-ms", cfg.idle_ms, "the idle spell before each of those (past every spin window)");
    options.add("--agent-arch", cfg.agent_arch,
                "agents to ship to: x86_64 (this machine's xagent) or aarch64 (the cross build, preset aarch64, run by "
                "qemu-user: EMULATED figures, TCP only; $BITSHIP_AARCH64_XAGENT overrides where it is)")
        .one_of({"x86_64", "aarch64"});
    options.add("--emulated-cpu", cfg.emulated_cpu, "with --agent-arch aarch64: the CPU qemu emulates (QEMU_CPU)");
    options.flag("--quick", quick, "fewer repetitions (2000 timed, 3 cold)");
    bool no_window = false;
    options.flag("--no-bulk-window", no_window,
                 "no same-host bulk window (ClientOptions::bulk_window off): calls carry no window slot");
    options.add("--agent-arg", cfg.agent_extra,
                "one more xagent argument for every agent, e.g. --agent-arg=--max-inflight-calls --agent-arg=0 "
                "(repeatable; printed in the header)");
    options.add("--csv", cfg.csv, "write the rows as CSV here");
    options.add("--json", cfg.json, "write the rows as JSON here");
    options.add("--xagent", launch::AgentProcess::binary(),
                "the agent program to start (another build, for an A/B; or a wrapper, as scripts/call_instructions.sh runs "
                "it under callgrind)");
    if (auto status = options.parse(argc, argv)) return *status;
    cfg.bulk_window = !no_window;
    if (quick) {
        cfg.reps = 2000;
        cfg.warmup = 500;
        cfg.cold_reps = 3;
    }
    const bool emulated = cfg.agent_arch == "aarch64";
    launch::AgentProgram program{launch::AgentProcess::binary(), {}, std::chrono::seconds(20)};
    std::string emulated_banner;
    if (emulated) {
        auto arm = launch::find_aarch64_agent(cfg.emulated_cpu);
        if (!arm.program) {
            fmt::print(stderr, "ship_latency: --agent-arch aarch64: {}\n", arm.why_not);
            return 2;
        }
        program = *arm.program;
        if (std::any_of(transports.begin(), transports.end(), [](const auto& t) { return t != "tcp"; })) {
            if (options.given("--transport")) {
                fmt::print(stderr, "ship_latency: --agent-arch aarch64 measures TCP only (x86-64 client, emulated agent)\n");
                return 2;
            }
            transports = {"tcp"};
        }
        emulated_banner = fmt::format("EMULATED: the agents are the aarch64 xagent ({}) run by qemu-user with "
                                      "QEMU_CPU={} on this x86-64 machine.\nThese figures measure qemu, not a DPU: "
                                      "do not compare them with native ones.",
                                      program.path, cfg.emulated_cpu);
        fmt::print("{}\n", emulated_banner);
    }

    fmt::print("ship_latency: {}{} | progress {} (spin {} us) for client and agent | the waiting caller leads progress | "
               "agent: 1 worker thread, worker spin {} us\n",
               bench::cpu_description(), emulated ? " | agents: aarch64 EMULATED (qemu-user)" : "", cfg.progress, cfg.spin_us,
               cfg.worker_spin_us);
    if (!cfg.agent_extra.empty()) fmt::print("  agents also get: {}\n", fmt::join(cfg.agent_extra, " "));
    fmt::print("  {} timed reps (ping and cached ship alternate) after {} warm-up; {} cold ships, each to a fresh agent;"
               " all on loopback, processes unpinned\n\n",
               cfg.reps, cfg.warmup, cfg.cold_reps);
    fmt::print("{:<5} {:<28} {:>10} {:>10} {:>10} {:>10}\n", "tl", "call", "median us", "p99 us", "min us", "max us");

    std::vector<Row> rows;
    // Emulated rows say so in the CSV too.
    auto labels = [&](const std::string& tl, const std::string& call) {
        std::vector<std::pair<std::string, std::string>> l;
        if (emulated) l.emplace_back("agent", "aarch64-EMULATED-qemu");
        l.emplace_back("transport", tl);
        l.emplace_back("call", call);
        return l;
    };
    std::vector<std::string> verdicts;
    const std::uint64_t arg = 7;
    auto print = [&](const std::string& tl, const std::string& what, const Summary& s) {
        fmt::print("{:<5} {:<28} {:>10.2f} {:>10.2f} {:>10.2f} {:>10.2f}\n", tl, what, s.median, s.p99, s.min, s.max);
    };
    try {
        for (const auto& tl : transports) {
            auto transport = parse_transport(tl);
            if (!transport) throw std::runtime_error(transport.error().message);
            Summary ping_s, cached_s;
            std::size_t code_bytes = 0;
            // The floor: bare UCX, same transports and loopback pinning, in this same run.
            std::optional<bench::PerftestResult> floor;
            if (!emulated) floor = bench::run_perftest(*transport, "ucp_am_lat", 8, 200000, 20000);
            {
                launch::AgentProcess agent(program, tl, agent_args(cfg));
                auto client = make_client(*transport, cfg);
                auto target = client.connect(agent.address());
                if (!target) throw std::runtime_error(target.error().describe());
                if (emulated)
                    fmt::print("agent: {} tuned for {} (LLVM {}), {} cores, kind {}\n", target->info().triple,
                               target->info().cpu, to_string(target->info().llvm), target->info().cores,
                               to_string(target->info().capabilities.kind));
                Bytes eight(8);
                auto ping = [&] { must(client.ping(*target, eight).get(), "ping"); };
                auto ship = [&] { must(client.ship(bench_kernels::empty, *target, arg).get(), "cached ship"); };
                // Ping and ship take turns, so both see the same machine at the same moments.
                for (int i = 0; i < cfg.warmup; ++i) ping(), ship();
                std::vector<double> pings, ships;
                for (int i = 0; i < cfg.reps; ++i) {
                    pings.push_back(time_calls(0, 1, ping)[0]);
                    ships.push_back(time_calls(0, 1, ship)[0]);
                }
                ping_s = bench::summarise(pings);
                cached_s = bench::summarise(ships);
                code_bytes = client.stats().bundle_bytes_sent;
                // What moving the bytes of the code costs by itself: a ping that carries them.
                Bytes code_sized(code_bytes);
                auto transfer = bench::summarise(time_calls(10, 200, [&] { must(client.ping(*target, code_sized).get(), "ping"); }));
                print(tl, "raw AM round trip (8 B)", ping_s);
                print(tl, "cached ship (empty, 8 B)", cached_s);
                print(tl, fmt::format("ping with {} B (code size)", code_bytes), transfer);
                // A caller that polls ready() instead of waiting: it progresses the client itself.
                auto polled = bench::summarise(time_calls(10, std::max(cfg.reps / 10, 20), [&] {
                    auto f = client.ship(bench_kernels::empty, *target, arg);
                    while (!f.ready()) {
                    }
                    must(f.get(), "polled ship");
                }));
                print(tl, "cached ship, ready() polled", polled);
                rows.push_back({labels(tl, "cached_ship_polled"), polled, {}});
                {
                    // Polling threads that moved off a core they shared with their peer (core_sharing.hpp).
                    auto agent_stats = client.agent_stats(*target);
                    std::uint64_t agent_moves = 0;
                    if (agent_stats)
                        for (const auto& [k, v] : *agent_stats)
                            if (k == "core_moves") agent_moves = v;
                    fmt::print("{:<5} {:<28} client {}, agent {}\n", tl, "core moves (shared core)", client.stats().core_moves,
                               agent_moves);
                }
                rows.push_back({labels(tl, "raw_am_rtt"), ping_s, {}});
                rows.push_back({labels(tl, "cached_ship"), cached_s, {}});
                rows.push_back({labels(tl, "ping_code_sized"), transfer, {{"bytes", double(code_bytes)}}});
                double ratio = cached_s.median / ping_s.median;
                verdicts.push_back(fmt::format("{}: cached ship / bitship's own PING round trip = {:.2f}x", tl, ratio));
                // After an idle spell: both sides past their spin window, asleep on their event fds.
                std::vector<double> idle;
                for (int i = 0; i < cfg.idle_reps; ++i) {
                    std::this_thread::sleep_for(std::chrono::milliseconds(cfg.idle_ms));
                    idle.push_back(time_calls(0, 1, ship)[0]);
                }
                if (!idle.empty()) {
                    auto idle_s = bench::summarise(idle);
                    print(tl, fmt::format("cached ship after {} ms idle", cfg.idle_ms), idle_s);
                    rows.push_back({labels(tl, "cached_ship_after_idle"), idle_s, {{"idle_ms", double(cfg.idle_ms)}}});
                }
                // The same small call once the session has moved bulk data: over shared memory it
                // then has a bulk window (core/bulk_window.hpp), which a small call must not pay for.
                if (cfg.bulk_window) {
                    Bytes bulk(kBulkArgs);
                    must(client.ship_bytes(bench_kernels::xor_bytes, *target, bulk).get(), "bulk call");
                    std::vector<double> after_bulk;
                    for (int i = 0; i < cfg.warmup; ++i) ship();
                    for (int i = 0; i < cfg.reps; ++i) after_bulk.push_back(time_calls(0, 1, ship)[0]);
                    auto s = bench::summarise(after_bulk);
                    print(tl, "cached ship after a bulk call", s);
                    rows.push_back({labels(tl, "cached_ship_after_bulk"), s, {{"bulk_bytes", double(kBulkArgs)}}});
                }
            }
            // The floor again, right after bitship's rows (the agent gone, so that no spinning
            // thread of it shares the cores): a VM that changed state between the two (this one
            // moves bare UCX 2-3x) shows, and the ratio is taken against the faster of the two.
            std::optional<bench::PerftestResult> floor_after;
            if (floor) floor_after = bench::run_perftest(*transport, "ucp_am_lat", 8, 200000, 20000);
            if (floor && floor_after) {
                auto bare_row = [&](const bench::PerftestResult& f, const char* when, const char* label) {
                    Summary bare;
                    bare.n = 1;
                    bare.median = bare.min = bare.max = bare.p99 = 2 * f.latency_us;
                    fmt::print("{:<5} {:<28} {:>10.2f}   (2 x one-way median, {}; {})\n", tl, "bare UCX AM round trip",
                               bare.median, when, f.command);
                    rows.push_back({labels(tl, label), bare, {{"one_way_us", f.latency_us}}});
                    return bare.median;
                };
                const double before = bare_row(*floor, "before bitship's rows", "ucx_perftest_am_rtt");
                const double after = bare_row(*floor_after, "after them", "ucx_perftest_am_rtt_after");
                const double bare = std::min(before, after);
                double ratio = cached_s.median / bare;
                verdicts.push_back(fmt::format("{}: cached ship / bare UCX AM round trip (ucx_perftest, the faster of before "
                                               "and after: {:.2f} / {:.2f} us) = {:.2f}x (target <= 1.25x) {}{}",
                                               tl, before, after, ratio, ratio <= 1.25 ? "MET" : "MISSED",
                                               std::max(before, after) > 1.25 * bare
                                                   ? " (the floor moved between them: the machine changed state)"
                                                   : ""));
            }
            if (cfg.cold_reps <= 0) { // no cold rows, and no verdicts on figures not measured
                verdicts.push_back(fmt::format("{}: cold ship not measured (--cold-reps 0)", tl));
                continue;
            }
            // Cold: a fresh agent each time, connected first, so the timed call is the ship. Each
            // rep starts one agent compiling in bitship-compiler processes (the default) and one
            // compiling in its own process, alternately, so both see the same machine.
            struct Mode {
                std::string name, label, title;
                std::vector<double> cold;
                std::map<std::string, std::vector<double>> split;
            };
            std::vector<Mode> modes{{"process", "cold_ship", "cold ship (first call, JIT)", {}, {}},
                                    {"in-process", "cold_ship_in_process", "cold ship, --compiler=in-process", {}, {}}};
            for (int i = 0; i < cfg.cold_reps; ++i) {
                for (auto& mode : modes) {
                    auto args = agent_args(cfg);
                    args.insert(args.end(), {"--compiler", mode.name});
                    launch::AgentProcess agent(program, tl, args);
                    auto client = make_client(*transport, cfg);
                    auto target = client.connect(agent.address());
                    if (!target) throw std::runtime_error(target.error().describe());
                    auto t = Clock::now();
                    must(client.ship(bench_kernels::empty, *target, arg).get(), "cold ship");
                    mode.cold.push_back(us_since(t));
                    auto stats = client.agent_stats(*target);
                    if (!stats) throw std::runtime_error(stats.error().describe());
                    for (const auto& [k, v] : *stats)
                        if (k.rfind("last_compile_", 0) == 0)
                            mode.split[k.substr(13, k.size() - 13 - 3)].push_back(double(v) / 1000.0);
                }
            }
            std::vector<Summary> medians;
            const std::size_t cold_row_index = rows.size(); // the first mode's row
            for (auto& mode : modes) {
                auto cold_s = bench::summarise(mode.cold);
                medians.push_back(cold_s);
                print(tl, mode.title, cold_s);
                Row cold_row{labels(tl, mode.label), cold_s, {}};
                double accounted = 0;
                for (auto stage : {"verify", "parse", "optimise", "codegen", "link"}) {
                    auto st = bench::summarise(mode.split[stage]);
                    accounted += st.median;
                    print(tl, fmt::format("  of which {} (agent)", stage), st);
                    cold_row.extra.emplace_back(fmt::format("{}_median_us", stage), st.median);
                }
                fmt::print("{:<5} {:<28} {:>10.2f}   (round trip, transfer, dispatch, run)\n", tl, "  of which the rest",
                           cold_s.median - accounted);
                rows.push_back(cold_row);
            }
            // Another client's pings from a first call's start until its caller has the answer
            // (the default compiler process): does the agent keep answering others meanwhile?
            // The first of each rep goes out as the agent receives the call and compiles it.
            {
                std::vector<double> during, firsts, cached_calls;
                for (int i = 0; i < cfg.cold_reps; ++i) {
                    launch::AgentProcess agent(program, tl, agent_args(cfg));
                    auto client = make_client(*transport, cfg);
                    auto bystander = make_client(*transport, cfg);
                    auto target = client.connect(agent.address());
                    auto other = bystander.connect(agent.address());
                    if (!target || !other) throw std::runtime_error((target ? other : target).error().describe());
                    Bytes eight(8);
                    for (int w = 0; w < 20; ++w) must(bystander.ping(*other, eight).get(), "ping");
                    // The bystander's own kernel (another bundle), compiled and optimised before.
                    const auto mix = bench::mix_args(0); // no rounds: a call's cost
                    const auto expected = bench::mix_expected(mix);
                    auto cached_mix = [&] {
                        auto r = bystander.ship(jit_tiers_kernels::mix, *other, mix).get_as<std::uint64_t>();
                        if (!r || *r != expected)
                            throw std::runtime_error("the bystander's call: " + (r ? std::to_string(*r) : r.error().describe()));
                    };
                    cached_mix();
                    if (!bystander.await_tier_ups(*other, std::chrono::seconds(10)).value_or(false))
                        throw std::runtime_error("the bystander's kernel was not optimised within 10 s");
                    for (int w = 0; w < 20; ++w) cached_mix();
                    auto first = client.ship(bench_kernels::empty, *target, arg);
                    bool first_of_rep = true;
                    while (!first.ready()) {
                        auto t = Clock::now();
                        must(bystander.ping(*other, eight).get(), "ping during a compile");
                        during.push_back(us_since(t));
                        if (first_of_rep) {
                            firsts.push_back(during.back());
                            t = Clock::now();
                            cached_mix();
                            cached_calls.push_back(us_since(t));
                        }
                        first_of_rep = false;
                    }
                    must(std::move(first).get(), "cold ship");
                }
                auto s = bench::summarise(during);
                print(tl, "ping by another client", s);
                fmt::print("{:<5} {:<28} {:>10}   (pings from a cold ship's start until its answer was in, all {} reps "
                           "together)\n",
                           tl, "", s.n, cfg.cold_reps);
                rows.push_back({labels(tl, "ping_during_cold_ship"), s, {}});
                auto f = bench::summarise(firsts);
                print(tl, "  its first ping each rep", f);
                rows.push_back({labels(tl, "first_ping_during_cold_ship"), f, {}});
                auto c = bench::summarise(cached_calls);
                print(tl, "  its cached call after it", c);
                rows.push_back({labels(tl, "cached_call_during_cold_ship"), c, {}});
            }
            const double ratio = medians[0].median / medians[1].median;
            const double ratio_p99 = medians[0].p99 / medians[1].p99;
            fmt::print("{:<5} {:<28} {:>10.3f}   (p99 {:.3f})\n", tl, "cold: process / in-process", ratio, ratio_p99);
            rows[cold_row_index].extra.emplace_back("process_over_in_process_median", ratio);
            rows[cold_row_index].extra.emplace_back("process_over_in_process_p99", ratio_p99);
            // 25 ms: the ship path's first target; 2 ms: the fast first compile's ("Every call at
            // the speed of the wire").
            for (double target_ms : {25.0, 2.0})
                verdicts.push_back(fmt::format("{}: cold ship median {:.2f} ms (target <= {:g} ms) {}", tl,
                                               medians[0].median / 1000, target_ms,
                                               medians[0].median <= target_ms * 1000 ? "MET" : "MISSED"));
            verdicts.push_back(fmt::format("{}: cold ship through the compiler process / in-process, medians: {:.3f} "
                                           "(target <= 1.25) {}", tl, ratio, ratio <= 1.25 ? "MET" : "MISSED"));
        }
    } catch (const std::exception& e) {
        fmt::print(stderr, "ship_latency: {}\n", e.what());
        return 1;
    }
    fmt::print("\n");
    if (emulated) {
        // The targets are for native agents; against qemu they would mean nothing.
        fmt::print("{}\n(no targets checked: they are for native agents)\n", emulated_banner);
    } else {
        for (const auto& v : verdicts) fmt::print("{}\n", v);
    }
    std::vector<std::pair<std::string, std::string>> config{{"cpu", bench::cpu_description()},
                                                            {"agent_arch", emulated ? "aarch64 (EMULATED, qemu-user)" : cfg.agent_arch},
                                                            {"progress", cfg.progress},
                                                            {"spin_us", std::to_string(cfg.spin_us)},
                                                            {"worker_spin_us", std::to_string(cfg.worker_spin_us)},
                                                            {"reps", std::to_string(cfg.reps)},
                                                            {"cold_reps", std::to_string(cfg.cold_reps)}};
    if (!cfg.csv.empty()) bench::write_csv(cfg.csv, rows);
    if (!cfg.json.empty()) bench::write_json(cfg.json, "ship_latency", config, rows);
    return 0;
}
