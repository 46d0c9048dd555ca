// get_sizes: what one GET costs against its size, per transport, against one agent on
// loopback: the curve the planner's GET model (xrdma/cost_model.hpp) is a line through. Sizes
// in steps of a quarter octave (or --sizes), timed one GET at a time in an order shuffled each
// round, so a slow spell of the machine falls on every size alike.
//
//   UCX_NET_DEVICES=lo build/bench/get_sizes                       # tcp and shm, 8 B - 256 KiB
//   UCX_NET_DEVICES=lo build/bench/get_sizes --transport tcp --reps 400

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "launcher.hpp"
#include "loopback_client.hpp"
#include "options.hpp"
#include "stats.hpp"

namespace {

using namespace bitship;
using Clock = std::chrono::steady_clock;

struct Config {
    std::vector<std::string> transports{"tcp", "shm"};
    std::vector<std::uint32_t> sizes; ///< empty: 8 B to --max-bytes in quarter octaves
    std::uint32_t max_bytes = 256u << 10;
    int reps = 200;
    std::string progress = "spin-then-block";
    std::string csv = "get_sizes.csv";
};

std::vector<std::uint32_t> quarter_octaves(std::uint32_t max_bytes) {
    std::vector<std::uint32_t> out;
    for (double s = 8; s <= max_bytes; s *= std::exp2(0.25)) {
        const auto b = static_cast<std::uint32_t>(std::llround(s / 8) * 8);
        if (out.empty() || out.back() != b) out.push_back(b);
    }
    return out;
}

} // namespace

int main(int argc, char** argv) {
    bench::Options options{"One GET's cost against its size, per transport (the curve under the planner's GET model)"};
    Config cfg;
    options.add("--transport", cfg.transports, "tcp, shm").transport();
    options.add("--sizes", cfg.sizes, "GET sizes in bytes (default: 8 B to --max-bytes in quarter octaves)");
    options.add("--max-bytes", cfg.max_bytes, "the largest size of the default sizes").range(8u, 64u << 20);
    options.add("--reps", cfg.reps, "timed GETs per size").range(1, 1'000'000);
    options.add("--progress", cfg.progress, "progress mode of client and agent").progress_mode();
    options.add("--csv", cfg.csv, "write rows here");
    if (auto status = options.parse(argc, argv)) return *status;
    auto sizes = cfg.sizes.empty() ? quarter_octaves(cfg.max_bytes) : cfg.sizes;
    std::sort(sizes.begin(), sizes.end());
    const std::uint32_t region_bytes = std::max<std::uint32_t>(sizes.back(), 8);
    fmt::print("get_sizes: {} | transports {} | {} sizes, {} B - {} B | {} GETs a size, one at a time, the sizes shuffled each\n"
               "  round | one agent, region of {} B | progress {}\n\n",
               bench::cpu_description(), fmt::join(cfg.transports, ","), sizes.size(), sizes.front(), sizes.back(), cfg.reps,
               region_bytes, cfg.progress);
    std::vector<bench::Row> rows;
    try {
        for (const auto& tl : cfg.transports) {
            launch::AgentProcess agent(tl, {"--progress", cfg.progress, "--region", fmt::format("data={}", region_bytes), "--log-level",
                                            "warn"});
            auto client = bench::loopback_client(bench::transport_named(tl), cfg.progress);
            auto target = bench::connect_or_throw(client, agent.address());
            auto region = client.region(target, "data");
            if (!region) throw std::runtime_error(region.error().describe());
            auto mapped = client.mapped(*region);
            if (!mapped) throw std::runtime_error(mapped.error().describe());
            std::map<std::uint32_t, std::vector<double>> us;
            std::mt19937 rng(7);
            auto order = sizes;
            for (int round = -2; round < cfg.reps; ++round) { // two rounds of warm-up
                std::shuffle(order.begin(), order.end(), rng);
                for (auto b : order) {
                    const auto t0 = Clock::now();
                    auto r = client.get(*region, 0, b).get();
                    const auto t1 = Clock::now();
                    if (!r) throw std::runtime_error(fmt::format("GET of {} B over {}: {}", b, tl, r.error().describe()));
                    if (r->size() != b) throw std::runtime_error(fmt::format("GET of {} B over {} read {}", b, tl, r->size()));
                    if (round >= 0) us[b].push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
                }
            }
            fmt::print("{} ({}):\n{:>9} | {:>9} {:>9} {:>9} | {:>12}\n", tl, *mapped ? "mapped: direct loads" : "not mapped", "bytes",
                       "median us", "p99 us", "min us", "ns/B beyond 8 B");
            const double small = bench::summarise(us.at(sizes.front())).median;
            for (auto b : sizes) {
                auto s = bench::summarise(us.at(b));
                const double per_byte = b > sizes.front() ? (s.median - small) * 1e3 / (b - sizes.front()) : 0;
                fmt::print("{:>9} | {:>9.2f} {:>9.2f} {:>9.2f} | {:>12.3f}\n", b, s.median, s.p99, s.min, per_byte);
                rows.push_back({{{"transport", tl}, {"mapped", *mapped ? "1" : "0"}, {"bytes", std::to_string(b)}}, s, {}});
            }
            fmt::print("\n");
        }
    } catch (const std::exception& e) {
        fmt::print(stderr, "get_sizes: {}\n", e.what());
        return 1;
    }
    bench::write_csv(cfg.csv, rows);
    fmt::print("wrote {}\n", cfg.csv);
    return 0;
}
