// after_idle: what the calls of a short burst cost after an idle spell. ship_latency reports the
// first call after a spell (it pays the wake-ups); this shows the calls right after it too. On
// a host with few cores, the woken agent thread is put on its waker's core, beside the caller
// that polls for its answer: until one of the two moves (core_sharing.hpp: after kSharedYields
// shared yields in a row), each round trip hands the core back and forth, 6 µs a turn
// (`perf sched timehist` on the 2-core test VM: 9 µs a call over shared memory, not 1). A
// burst shorter than that count may never move.
//
// For each idle gap: the gap (the caller sleeps), then `--burst` cached ships of an empty
// kernel back to back, each timed; `--reps` bursts. Prints the median and p90 of each call of
// the burst, writes CSV.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include <bench_kernels.hpp>
#include <bitship/client.hpp>

#include "launcher.hpp"
#include "loopback_client.hpp"
#include "options.hpp"
#include "stats.hpp"

using namespace bitship;
using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) {
    bench::Options options{"The calls of a short burst after an idle spell: each call's latency against the spell"};
    std::vector<std::string> transports{"shm", "tcp"};
    std::vector<int> gaps_us{0, 100, 400, 1000, 5000};
    int burst = 4;
    int reps = 300;
    std::string progress = "spin-then-block";
    std::string csv;
    options.add("--xagent", launch::AgentProcess::binary(), "the agent program to start (an A/B against another build)");
    options.add("--transport", transports, "transports to measure").transport();
    options.add("--gap-us", gaps_us, "idle spells before a burst, in microseconds");
    options.add("--burst", burst, "calls in a burst").range(1, 64);
    options.add("--reps", reps, "bursts per spell").range(3, 100000);
    options.add("--progress", progress, "progress mode of client and agent")
        .progress_mode();
    options.add("--csv", csv, "write the rows as CSV here");
    if (auto status = options.parse(argc, argv)) return *status;

    fmt::print("after_idle: {} | progress {} for client and agent (spin window 200 us) | agent: 1 worker | "
               "{} bursts of {} cached empty ships after each spell | loopback, processes unpinned\n\n",
               bench::cpu_description(), progress, reps, burst);
    fmt::print("{:<5} {:>8} {:>6} {:>10} {:>10}\n", "tl", "gap us", "call", "median us", "p90 us");
    std::vector<bench::Row> rows;
    try {
        for (const auto& tl : transports) {
            auto transport = parse_transport(tl);
            if (!transport) throw std::runtime_error(transport.error().message);
            launch::AgentProcess agent(tl, {"--log-level", "warn", "--workers", "1", "--progress", progress});
            auto client = bench::loopback_client(*transport, progress);
            const auto target = bench::connect_or_throw(client, agent.address());
            auto ship = [&] {
                auto r = client.ship(bench_kernels::empty, target, std::uint64_t{7}).get();
                if (!r) throw std::runtime_error(r.error().describe());
            };
            for (int i = 0; i < 2000; ++i) ship();
            for (int gap : gaps_us) {
                std::vector<std::vector<double>> calls(static_cast<std::size_t>(burst));
                for (int r = 0; r < reps; ++r) {
                    if (gap > 0) std::this_thread::sleep_for(std::chrono::microseconds(gap));
                    for (auto& call : calls) {
                        const auto t = Clock::now();
                        ship();
                        call.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t).count());
                    }
                }
                for (std::size_t c = 0; c < calls.size(); ++c) {
                    auto sorted = calls[c];
                    std::sort(sorted.begin(), sorted.end());
                    const double p90 = sorted[sorted.size() * 9 / 10];
                    const auto s = bench::summarise(calls[c]);
                    fmt::print("{:<5} {:>8} {:>6} {:>10.2f} {:>10.2f}\n", tl, gap, c + 1, s.median, p90);
                    rows.push_back({{{"transport", tl}, {"gap_us", std::to_string(gap)}, {"call", std::to_string(c + 1)}},
                                    s,
                                    {{"p90_us", p90}}});
                }
            }
            std::uint64_t agent_moves = 0;
            if (auto stats = client.agent_stats(target))
                for (const auto& [k, v] : *stats)
                    if (k == "core_moves") agent_moves = v;
            fmt::print("{:<5} core moves (shared core): client {}, agent {}\n", tl, client.stats().core_moves, agent_moves);
        }
    } catch (const std::exception& e) {
        fmt::print(stderr, "after_idle: {}\n", e.what());
        return 1;
    }
    if (!csv.empty()) {
        bench::write_csv(csv, rows);
        fmt::print("wrote {}\n", csv);
    }
    return 0;
}
