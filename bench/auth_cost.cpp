// auth_cost: what authentication costs a call, per transport, in one run.
//   cached ship, keys   an agent with --authorized-keys: the session authenticated once (AUTH),
//                       the code signed once per hash; each call checks neither signature
//   cached ship, open   the same agent binary without keys (open access on loopback)
//   connect, keys/open  connect() to a running agent: HELLO, WELCOME (+ AUTH and its ACK)
// Calls go to the two agents in alternating blocks (--block calls each), so both see the same
// machine over the run while the idle one sleeps (on a small machine two agents polling at
// once would measure the CPU contention, not the call). The
// target is cached ship (keys) <= 1.05x cached ship (open): signatures are checked per session
// and per code hash, never per call.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <bench_kernels.hpp>
#include <bitship/client.hpp>

#include "launcher.hpp"
#include "loopback_client.hpp"
#include "options.hpp"
#include "stats.hpp"

namespace {

using namespace bitship;
using bench::Row;
using bench::Summary;
using Clock = std::chrono::steady_clock;

constexpr double kTargetRatio = 1.05;

double us_since(Clock::time_point t) { return std::chrono::duration<double, std::micro>(Clock::now() - t).count(); }

struct Config {
    int reps = 20000;
    int warmup = 2000;
    int connects = 200;
    int block = 500;
    std::string progress = "spin-then-block";
    std::string csv, json;
};

Client make_client(Transport t, const Config& cfg) {
    ClientOptions o;
    o.transport = t;
    o.loopback_only = true;
    o.progress = bench::progress_named(cfg.progress);
    auto c = Client::create(o); // authenticates with launch::test_keys() (BITSHIP_IDENTITY)
    if (!c) throw std::runtime_error(c.error().describe());
    return std::move(*c);
}

std::vector<std::string> agent_args(const Config& cfg) {
    return {"--progress", cfg.progress, "--log-level", "warn", "--workers", "1"};
}

Target connect(Client& client, const launch::AgentProcess& agent, AgentAccess expected) {
    auto t = client.connect(agent.address());
    if (!t) throw std::runtime_error(t.error().describe());
    if (t->info().access != expected)
        throw std::runtime_error(fmt::format("agent {} says access '{}', expected '{}'", agent.address(),
                                             to_string(t->info().access), to_string(expected)));
    return *t;
}

} // namespace

int main(int argc, char** argv) {
    bench::Options options{"Cached ship and connect, authenticated (authorized keys, signed code) against open, in one run"};
    Config cfg;
    bool quick = false;
    std::vector<std::string> transports{"tcp", "shm"};
    options.add("--reps", cfg.reps, "timed cached ships per agent");
    options.add("--warmup", cfg.warmup, "untimed ships per agent first");
    options.add("--connects", cfg.connects, "timed connects per agent");
    options.add("--block", cfg.block, "consecutive ships to one agent before switching to the other")
        .positive();
    options.add("--transport", transports, "transports to measure").transport();
    options.add("--progress", cfg.progress, "progress mode of client and agents")
        .progress_mode();
    options.flag("--quick", quick, "fewer repetitions (2000 timed, 20 connects)");
    options.add("--csv", cfg.csv, "write the rows as CSV here");
    options.add("--json", cfg.json, "write the rows as JSON here");
    if (auto status = options.parse(argc, argv)) return *status;
    if (quick) {
        cfg.reps = 2000;
        cfg.warmup = 500;
        cfg.connects = 20;
    }
    fmt::print("auth_cost: {} | progress {} | agents: 1 worker each, one with --authorized-keys, one open | "
               "ships in alternating blocks of {}\n  {} timed cached ships per agent after {} warm-up; {} connects per agent; "
               "loopback, processes unpinned\n\n",
               bench::cpu_description(), cfg.progress, cfg.block, cfg.reps, cfg.warmup, cfg.connects);
    fmt::print("{:<5} {:<24} {:>10} {:>10} {:>10} {:>10}\n", "tl", "call", "median us", "p99 us", "min us", "max us");
    std::vector<Row> rows;
    std::vector<std::string> verdicts;
    auto print = [](const std::string& tl, const std::string& what, const Summary& s) {
        fmt::print("{:<5} {:<24} {:>10.2f} {:>10.2f} {:>10.2f} {:>10.2f}\n", tl, what, s.median, s.p99, s.min, s.max);
    };
    auto row = [&](const std::string& tl, const std::string& call, const Summary& s) {
        print(tl, call, s);
        rows.push_back({{{"transport", tl}, {"call", call}}, s, {}});
    };
    try {
        const std::uint64_t arg = 7;
        for (const auto& tl : transports) {
            auto transport = parse_transport(tl);
            if (!transport) throw std::runtime_error(transport.error().message);
            launch::AgentProcess keyed(tl, agent_args(cfg));
            launch::AgentProgram open_program;
            open_program.path = launch::AgentProcess::binary();
            open_program.open = true;
            launch::AgentProcess open(open_program, tl, agent_args(cfg));
            auto client = make_client(*transport, cfg);
            auto keyed_target = connect(client, keyed, AgentAccess::keys);
            auto open_target = connect(client, open, AgentAccess::open);
            auto ship = [&](const Target& t) {
                auto r = client.ship(bench_kernels::empty, t, arg).get();
                if (!r) throw std::runtime_error(fmt::format("cached ship failed: {}", r.error().describe()));
            };
            for (int i = 0; i < cfg.warmup; ++i) ship(keyed_target), ship(open_target);
            std::vector<double> keyed_us, open_us;
            keyed_us.reserve(static_cast<std::size_t>(cfg.reps));
            open_us.reserve(static_cast<std::size_t>(cfg.reps));
            for (int done = 0; done < cfg.reps; done += cfg.block) {
                const int n = std::min(cfg.block, cfg.reps - done);
                for (auto [target, out] : {std::pair{&keyed_target, &keyed_us}, std::pair{&open_target, &open_us}}) {
                    for (int i = 0; i < n; ++i) {
                        auto t = Clock::now();
                        ship(*target);
                        out->push_back(us_since(t));
                    }
                }
            }
            auto keyed_s = bench::summarise(keyed_us), open_s = bench::summarise(open_us);
            row(tl, "cached ship, keys", keyed_s);
            row(tl, "cached ship, open", open_s);
            const auto bundles = client.stats().bundles_sent;
            // Connects: a fresh client each time, so every one is a new session.
            std::vector<double> keyed_connect, open_connect;
            for (int i = 0; i < cfg.connects; ++i) {
                auto fresh = make_client(*transport, cfg);
                auto t = Clock::now();
                connect(fresh, keyed, AgentAccess::keys);
                keyed_connect.push_back(us_since(t));
                t = Clock::now();
                connect(fresh, open, AgentAccess::open);
                open_connect.push_back(us_since(t));
            }
            row(tl, "connect, keys (AUTH)", bench::summarise(keyed_connect));
            row(tl, "connect, open", bench::summarise(open_connect));
            double median_ratio = keyed_s.median / open_s.median, p99_ratio = keyed_s.p99 / open_s.p99;
            verdicts.push_back(fmt::format("{}: cached ship keys/open = {:.3f}x median, {:.3f}x p99 (target median <= "
                                           "{:.2f}x) {}; code sent {} times (once per agent)",
                                           tl, median_ratio, p99_ratio, kTargetRatio,
                                           median_ratio <= kTargetRatio ? "MET" : "MISSED", bundles));
        }
    } catch (const std::exception& e) {
        fmt::print(stderr, "auth_cost: {}\n", e.what());
        return 1;
    }
    fmt::print("\n");
    for (const auto& v : verdicts) fmt::print("{}\n", v);
    std::vector<std::pair<std::string, std::string>> config{{"cpu", bench::cpu_description()},
                                                            {"progress", cfg.progress},
                                                            {"reps", std::to_string(cfg.reps)},
                                                            {"connects", std::to_string(cfg.connects)},
                                                            {"block", std::to_string(cfg.block)}};
    if (!cfg.csv.empty()) bench::write_csv(cfg.csv, rows);
    if (!cfg.json.empty()) bench::write_json(cfg.json, "auth_cost", config, rows);
    return 0;
}
