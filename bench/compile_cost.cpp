// compile_cost: what the first call's compile costs LLVM alone, and how much of it is the
// machine's caches. One small kernel's tier-0 compile (bench/kernels/tiny.c's `empty`, as a
// cold ship's first call asks for it: that entry alone, FastISel), made by bitship's
// InProcessCompiler, the code a bitship-compiler process runs, here in this process: no agent,
// no UCX, no link. Rows:
//   back to back       one compile right after another: LLVM's code and data in the caches
//   after N ms asleep  the thread sleeps N ms before each compile (what a resident agent's
//                      compiler does between new kernels)
//   after N ms busy    the thread spins N ms on the clock before each compile: no sleep, no
//                      idle state; only time passes and the rest of the machine runs
// Each row splits the compile into its stages (CompileStats). Run once for each sandbox mode
// (the agent's default is sfi).

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "bench_kernels.hpp"
#include "compile_to_object.hpp"
#include "options.hpp"
#include "runtime.hpp"
#include "stats.hpp"

namespace {

using namespace bitship;
using Clock = std::chrono::steady_clock;

double micros(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

enum class Gap { none, asleep, busy };

struct Samples {
    std::vector<double> total, verify, parse, optimise, codegen;
};

} // namespace

int main(int argc, char** argv) {
    bench::Options options{"Tier-0 compile of one small kernel in this process: back to back, after sleeping, after spinning"};
    int reps = 30, warmup = 3;
    std::vector<int> gaps_ms{10, 100};
    std::vector<std::string> sandboxes{"sfi", "none"};
    std::string csv;
    options.add("--reps", reps, "compiles timed per row").positive();
    options.add("--warmup", warmup, "compiles first, untimed (after the compiler's own warm-up, as an agent's)");
    options.add("--gap-ms", gaps_ms, "the spells before each compile of the asleep and busy rows, ms").positive();
    options.add("--sandbox", sandboxes, "sandbox modes to compile for (xagent --sandbox)").one_of({"sfi", "none"});
    options.add("--csv", csv, "write the rows as CSV here");
    if (auto status = options.parse(argc, argv)) return *status;

    // What an agent allows: its runtime (bs_*) and the curated libc/libm exports.
    jit::SymbolNames allowed;
    for (const auto& e : agent::runtime_exports()) allowed.insert(e.name);
    for (const auto& e : jit::curated_exports()) allowed.insert(e.name);

    auto bundle = bench_kernels::empty.bundle();
    auto view = BundleView::parse(bundle);
    if (!view) {
        fmt::print(stderr, "compile_cost: {}\n", view.error().describe());
        return 1;
    }
    auto index = view->find_slice(jit::host().triple);
    if (!index) {
        fmt::print(stderr, "compile_cost: the bench kernels have no slice for {}\n", jit::host().triple);
        return 1;
    }
    const CodeHash hash = view->slices[*index].hash;
    const std::string entry{bench_kernels::empty.entry};

    fmt::print("compile_cost: {} | LLVM {} for {} ({}) | kernel '{}' of bench/kernels/tiny.c, tier 0, that entry alone\n",
               bench::cpu_description(), to_string(jit::host().llvm), jit::host().triple, jit::host().cpu, entry);
    fmt::print("  {} compiles a row after {} untimed; one thread, in this process; the spells: {} ms\n\n", reps, warmup,
               fmt::join(gaps_ms, ", "));
    fmt::print("{:<5} {:<20} {:>10} {:>10} {:>10} | {:>8} {:>8} {:>8} {:>8} (medians, us)\n", "sbx", "row", "median us",
               "p99 us", "min us", "verify", "parse", "optimise", "codegen");

    std::vector<bench::Row> rows;
    for (const auto& mode : sandboxes) {
        std::vector<double> medians; // this mode's rows, back to back first
        const auto sandbox = mode == "sfi" ? jit::Sandbox::sfi : jit::Sandbox::none;
        auto compiler = jit::InProcessCompiler::create(allowed, 2, sandbox);
        if (!compiler) {
            fmt::print(stderr, "compile_cost: {}\n", compiler.error().describe());
            return 1;
        }
        // The warm-up a bitship-compiler process runs before it says READY.
        auto warm = jit::warm_up_bundle();
        for (auto tier : {jit::Tier::fast, jit::Tier::optimised})
            if (auto made = (*compiler)->compile(warm.bundle, warm.hash, tier); !made) {
                fmt::print(stderr, "compile_cost: warm-up: {}\n", made.error().describe());
                return 1;
            }
        auto compile_once = [&](Samples* into) {
            auto t = Clock::now();
            auto made = (*compiler)->compile(bundle, hash, jit::Tier::fast, entry);
            const double us = micros(Clock::now() - t);
            if (!made) throw std::runtime_error(made.error().describe());
            if (!into) return;
            into->total.push_back(us);
            into->verify.push_back(made->stats.verify_ms * 1e3);
            into->parse.push_back(made->stats.parse_ms * 1e3);
            into->optimise.push_back(made->stats.optimise_ms * 1e3);
            into->codegen.push_back(made->stats.codegen_ms * 1e3);
        };
        struct Plan {
            Gap gap;
            int ms;
        };
        std::vector<Plan> plans{{Gap::none, 0}};
        for (int ms : gaps_ms) plans.push_back({Gap::asleep, ms});
        for (int ms : gaps_ms) plans.push_back({Gap::busy, ms});
        for (const auto& plan : plans) {
            Samples s;
            for (int i = 0; i < warmup + reps; ++i) {
                if (plan.gap == Gap::asleep) std::this_thread::sleep_for(std::chrono::milliseconds(plan.ms));
                if (plan.gap == Gap::busy)
                    for (auto until = Clock::now() + std::chrono::milliseconds(plan.ms); Clock::now() < until;) {
                    }
                compile_once(i < warmup ? nullptr : &s);
            }
            const std::string name = plan.gap == Gap::none     ? "back to back"
                                     : plan.gap == Gap::asleep ? fmt::format("after {} ms asleep", plan.ms)
                                                               : fmt::format("after {} ms busy", plan.ms);
            auto total = bench::summarise(s.total);
            medians.push_back(total.median);
            auto median = [](const std::vector<double>& v) { return bench::summarise(v).median; };
            fmt::print("{:<5} {:<20} {:>10.1f} {:>10.1f} {:>10.1f} | {:>8.1f} {:>8.1f} {:>8.1f} {:>8.1f}\n", mode, name,
                       total.median, total.p99, total.min, median(s.verify), median(s.parse), median(s.optimise),
                       median(s.codegen));
            rows.push_back(bench::Row{{{"sandbox", mode}, {"row", name}},
                                      total,
                                      {{"verify_median_us", median(s.verify)},
                                       {"parse_median_us", median(s.parse)},
                                       {"optimise_median_us", median(s.optimise)},
                                       {"codegen_median_us", median(s.codegen)}}});
        }
        fmt::print("{:<5} after a spell / back to back, medians:", mode);
        for (std::size_t i = 1; i < medians.size(); ++i) fmt::print(" {:.2f}", medians[i] / medians[0]);
        fmt::print("\n\n");
    }
    if (!csv.empty()) bench::write_csv(csv, rows);
    return 0;
}
