// ship_rate: what many calls in flight and bulk arguments and results cost, per transport, in
// one run, beside bare UCX measured by ucx_perftest in the same run:
//   message rate   cached `inc` calls (8-byte arguments and result), a window of calls in
//                  flight through Client::batch() (two batches of half the window; each goes
//                  as one BATCH message and is answered by one, Engine::Cork); the issue's
//                  target is calls/s >= 0.5 x ucp_am_bw's 8-byte message rate
//   group rate     the same calls as groups (Client::ship_each: `group` calls in one RUN, answered
//                  by one RESULT, each call its own run and answer), two groups in flight
//   bulk args      1 MiB arguments to `xor_bytes` (reads them all, answers 8 bytes)
//   bulk result    8-byte arguments to `make_bytes`, which answers 1 MiB; each result, checked,
//                  is handed back (Client::recycle) to receive a later one (--no-recycle: not)
//   bulk floor     ucx_perftest ucp_am_bw with 1 MiB messages
// The agent is a real xagent process started here on loopback.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <bench_kernels.hpp>
#include <bitship/client.hpp>

#include "launcher.hpp"
#include "loopback_client.hpp"
#include "options.hpp"
#include "perftest.hpp"
#include "stats.hpp"

namespace {

using namespace bitship;
using Clock = std::chrono::steady_clock;
constexpr double kMiB = 1024.0 * 1024.0;

struct Config {
    std::size_t calls = 200000;
    std::size_t window = 64;
    std::size_t group = 1024;
    std::size_t bulk_bytes = 1u << 20;
    std::size_t bulk_calls = 400;
    std::size_t bulk_in_flight = 4;
    int rounds = 5;
    std::string progress = "spin-then-block";
    std::string csv;
};

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

void must(bool ok, const std::string& what) {
    if (!ok) throw std::runtime_error(what);
}

// Calls per second with `window` in flight: batches of window / 2 calls, two in flight, so
// the agent runs one while the client reads the other's results and sends the next.
double call_rate(Client& client, const Target& target, std::size_t calls, std::size_t window) {
    const std::size_t per_batch = std::max<std::size_t>(1, window / 2);
    std::uint64_t checksum = 0, expected = 0;
    std::deque<std::vector<Future>> in_flight;
    auto collect = [&] {
        for (auto& f : in_flight.front()) {
            auto r = f.get_as<std::uint64_t>();
            must(bool(r), r ? "" : r.error().describe());
            checksum += *r;
        }
        in_flight.pop_front();
    };
    std::size_t sent = 0;
    auto t = Clock::now();
    while (sent < calls) {
        auto batch = client.batch();
        for (std::size_t i = 0; i < per_batch; ++i, ++sent) {
            batch.add(bench_kernels::inc, target, std::uint64_t{sent});
            expected += sent + 1;
        }
        in_flight.push_back(batch.submit());
        if (in_flight.size() == 2) collect();
    }
    while (!in_flight.empty()) collect();
    double s = seconds_since(t);
    must(checksum == expected, "message-rate results do not add up");
    return double(sent) / s;
}

// Calls per second as groups of `group` calls (Client::ship_each), two groups in flight: the
// agent runs one while the client reads the other's answers and sends the next.
double group_rate(Client& client, const Target& target, std::size_t calls, std::size_t group) {
    std::uint64_t checksum = 0, expected = 0;
    std::deque<EachFuture> in_flight;
    std::vector<std::uint64_t> args(group);
    auto collect = [&] {
        auto r = in_flight.front().get();
        must(bool(r), r ? "" : r.error().describe());
        for (std::size_t i = 0; i < r->size(); ++i) {
            auto v = r->get_as<std::uint64_t>(i);
            must(bool(v), v ? "" : v.error().describe());
            checksum += *v;
        }
        in_flight.pop_front();
    };
    std::size_t sent = 0;
    auto t = Clock::now();
    while (sent < calls) {
        for (auto& a : args) {
            a = sent++;
            expected += a + 1;
        }
        in_flight.push_back(client.ship_each(bench_kernels::inc, target, args));
        if (in_flight.size() == 2) collect();
    }
    while (!in_flight.empty()) collect();
    double s = seconds_since(t);
    must(checksum == expected, "group results do not add up");
    return double(sent) / s;
}

// Bytes per second moved by `calls` bulk calls, `in_flight` at a time: a sliding window (a new
// call goes out as soon as the oldest is answered), as ucx_perftest keeps its window of sends.
double bulk_rate(Client& client, const Target& target, std::size_t calls, std::size_t bytes, bool as_args, std::size_t in_flight,
                 bool recycle) {
    Bytes payload(bytes);
    std::uint64_t x = 0;
    for (std::size_t i = 0; i < bytes / 8; ++i) {
        std::uint64_t w = i * 0x9E3779B97F4A7C15ull;
        std::memcpy(payload.data() + i * 8, &w, 8);
        x ^= w;
    }
    const auto shared = std::make_shared<const Bytes>(std::move(payload));
    const auto request = Client::pack_args(std::uint64_t{bytes});
    auto check = [&](Future& f) {
        auto r = std::move(f).get(); // (the result moves out: no copy)
        must(bool(r), r ? "" : r.error().describe());
        if (as_args) {
            std::uint64_t got;
            must(r->size() == 8, "xor_bytes answered the wrong size");
            std::memcpy(&got, r->data(), 8);
            must(got == x, "xor_bytes answered a wrong checksum: arguments arrived corrupted");
        } else {
            must(r->size() == bytes && (*r)[bytes - 1] == std::byte((bytes - 1) & 0xff), "make_bytes answered wrong bytes");
            // Its buffer receives a later result (Client::recycle), as ucx_perftest receives
            // into one buffer again and again; else each result is a new, zero-filled vector.
            if (recycle) client.recycle(std::move(*r));
        }
    };
    std::deque<Future> window;
    auto t = Clock::now();
    for (std::size_t sent = 0; sent < calls; ++sent) {
        if (window.size() == in_flight) {
            check(window.front());
            window.pop_front();
        }
        // The same arguments every call, shared, not copied (Client::ship_shared), as
        // ucx_perftest sends one buffer again and again.
        window.push_back(as_args ? client.ship_shared(bench_kernels::xor_bytes, target, shared)
                                 : client.ship_bytes(bench_kernels::make_bytes, target, request));
    }
    for (auto& f : window) check(f);
    double s = seconds_since(t);
    return double(calls) * double(bytes) / s;
}

double median_of(std::vector<double> v) { return bench::summarise(std::move(v)).median; }

} // namespace

int main(int argc, char** argv) {
    bench::Options options{"Calls per second with many in flight, and 1 MiB arguments and results, against ucx_perftest ucp_am_bw"};
    Config cfg;
    bool quick = false;
    std::vector<std::string> transports{"tcp", "shm"};
    options.add("--calls", cfg.calls, "cached 8-byte calls per message-rate round");
    options.add("--window", cfg.window, "calls in flight (two batches of half as many, Client::batch)");
    options.add("--group", cfg.group, "calls per group in the group-rate row (Client::ship_each), two groups in flight")
        .range(1, 65536);
    options.add("--bulk-bytes", cfg.bulk_bytes, "bytes of arguments / result per bulk call");
    options.add("--bulk-calls", cfg.bulk_calls, "bulk calls per round");
    options.add("--bulk-in-flight", cfg.bulk_in_flight, "bulk calls in flight");
    options.add("--rounds", cfg.rounds, "rounds per row (median reported)");
    options.add("--transport", transports, "transports to measure").transport();
    options.add("--progress", cfg.progress, "progress mode of client and agent: spin, block, spin-then-block")
        .progress_mode();
    options.flag("--quick", quick, "smaller rounds (20000 calls, 100 bulk calls, 3 rounds)");
    options.add("--csv", cfg.csv, "write the rows as CSV here");
    bool no_window = false;
    options.flag("--no-bulk-window", no_window,
                 "same-host bulk data by UCX alone (ClientOptions::bulk_window off), to compare with the window");
    bool no_recycle = false;
    options.flag("--no-recycle", no_recycle,
                 "each 1 MiB result a new vector (zero-filled, then received into), not one handed back (Client::recycle)");
    options.add("--xagent", launch::AgentProcess::binary(), "the agent program to start (another build, for an A/B)");
    if (auto status = options.parse(argc, argv)) return *status;
    const bool recycle = !no_recycle;
    if (quick) {
        cfg.calls = 20000;
        cfg.bulk_calls = 100;
        cfg.rounds = 3;
    }
    fmt::print("ship_rate: {} | progress {} for client and agent | agent: 1 worker | window {} calls | groups of {} | bulk {} bytes, {} in "
               "flight (sliding window) | {} rounds per row, median | loopback, unpinned | same-host bulk window {} | results "
               "{}\n\n",
               bench::cpu_description(), cfg.progress, cfg.window, cfg.group, cfg.bulk_bytes, cfg.bulk_in_flight, cfg.rounds,
               no_window ? "off (UCX alone)" : "on where the agent gives one",
               recycle ? "handed back for reuse (Client::recycle)" : "each a new vector");
    fmt::print("{:<5} {:<40} {:>14} {:>14} {:>8}\n", "tl", "measure", "bitship", "ucx_perftest", "ratio");

    std::vector<bench::Row> rows;
    std::vector<std::string> verdicts;
    try {
        for (const auto& tl : transports) {
            auto transport = parse_transport(tl);
            if (!transport) throw std::runtime_error(transport.error().message);
            auto rate_floor = bench::run_perftest(*transport, "ucp_am_bw", 8, 1000000, 10000);
            auto bulk_floor = bench::run_perftest(*transport, "ucp_am_bw", cfg.bulk_bytes, 2000, 100);

            launch::AgentProcess agent(tl, {"--progress", cfg.progress, "--log-level", "warn", "--workers", "1",
                                            "--max-args", std::to_string(cfg.bulk_bytes),
                                            "--max-result", std::to_string(cfg.bulk_bytes)});
            ClientOptions o;
            o.transport = *transport;
            o.loopback_only = true;
            o.progress = bench::progress_named(cfg.progress);
            o.bulk_window = !no_window;
            auto client = Client::create(o);
            if (!client) throw std::runtime_error(client.error().describe());
            auto target = client->connect(agent.address());
            if (!target) throw std::runtime_error(target.error().describe());
            // Code on the agent and every path warm before anything is timed.
            call_rate(*client, *target, cfg.window * 20, cfg.window);
            group_rate(*client, *target, cfg.group * 8, cfg.group);
            bulk_rate(*client, *target, 8, cfg.bulk_bytes, true, cfg.bulk_in_flight, recycle);
            bulk_rate(*client, *target, 8, cfg.bulk_bytes, false, cfg.bulk_in_flight, recycle);

            std::vector<double> rates, group_rates, args_bw, result_bw;
            for (int r = 0; r < cfg.rounds; ++r) {
                rates.push_back(call_rate(*client, *target, cfg.calls, cfg.window));
                group_rates.push_back(group_rate(*client, *target, cfg.calls * 4, cfg.group));
                args_bw.push_back(bulk_rate(*client, *target, cfg.bulk_calls, cfg.bulk_bytes, true, cfg.bulk_in_flight, recycle) / kMiB);
                result_bw.push_back(bulk_rate(*client, *target, cfg.bulk_calls, cfg.bulk_bytes, false, cfg.bulk_in_flight, recycle) / kMiB);
            }
            double rate = median_of(rates), grate = median_of(group_rates), abw = median_of(args_bw), rbw = median_of(result_bw);
            double floor_msgs = rate_floor ? rate_floor->message_rate : 0;
            double floor_bw = bulk_floor ? bulk_floor->bandwidth_mib_s : 0;
            auto line = [&](const std::string& what, double ours, double floor, const std::string& unit) {
                fmt::print("{:<5} {:<40} {:>10.0f} {:<3} {:>10.0f} {:<3} {:>8}\n", tl, what, ours, unit, floor, unit,
                           floor > 0 ? fmt::format("{:.2f}", ours / floor) : "n/a");
                rows.push_back({{{"transport", tl}, {"measure", what}}, {}, {{"bitship", ours}, {"ucx_perftest", floor}}});
            };
            line("cached calls/s (8 B) vs 8 B messages/s", rate, floor_msgs, "/s");
            line(fmt::format("  the same in groups of {} (ship_each)", cfg.group), grate, floor_msgs, "/s");
            line(fmt::format("args {} B -> 8 B result, MiB/s", cfg.bulk_bytes), abw, floor_bw, "");
            line(fmt::format("8 B args -> {} B result, MiB/s", cfg.bulk_bytes), rbw, floor_bw, "");
            auto verdict = [&](const std::string& what, double ratio, double target) {
                verdicts.push_back(fmt::format("{}: {} = {:.2f} of bare UCX (target >= {:.2f}) {}", tl, what, ratio, target,
                                               ratio >= target ? "MET" : "MISSED"));
            };
            if (rate_floor) {
                fmt::print("      floor: {}\n", rate_floor->command);
                verdict("calls/s (Batch, a future per call) vs ucp_am_bw 8 B message rate (a call is 2 messages)",
                        rate / rate_floor->message_rate, 0.5);
                verdict(fmt::format("calls/s (groups of {}, ship_each) vs ucp_am_bw 8 B message rate", cfg.group),
                        grate / rate_floor->message_rate, 0.5);
            }
            if (bulk_floor) {
                fmt::print("      floor: {}\n", bulk_floor->command);
                verdict("1 MiB arguments vs ucp_am_bw 1 MiB bandwidth", abw / floor_bw, 0.7);
                verdict("1 MiB results vs ucp_am_bw 1 MiB bandwidth", rbw / floor_bw, 0.7);
            }
        }
    } catch (const std::exception& e) {
        fmt::print(stderr, "ship_rate: {}\n", e.what());
        return 1;
    }
    fmt::print("\n");
    for (const auto& v : verdicts) fmt::print("{}\n", v);
    if (!cfg.csv.empty()) bench::write_csv(cfg.csv, rows);
    return 0;
}
