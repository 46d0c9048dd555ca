// Where a cold compile spends its time: compiles BITSHIP_JIT_TIMING_VARIANTS distinct variants
// of the add kernel (each a new hash, so each a real compile) and prints the median, min and
// max of every CompileStats phase, per opt_level at tier 1 (one tier: the full compile on the
// caller's thread) and for tier 0 (the fast first compile of a two-tier Jit), plus the cost of
// Jit::create (LLJIT setup) and of the first compile in the process. Not a test; a bench/
// program would grow from this. Last, "obj": load() of the same variants from a disk cache of
// optimised objects, as a restarted agent links them (no IR at all).
//
//   ./build/test/jit/jit_compile_timing [opt_level...]      (default: 0 1 2 3; tier 0 always)
//   BITSHIP_TIMING_BITCODE=k.bc BITSHIP_TIMING_ENTRY=name ./build/test/jit/jit_compile_timing
//       times that kernel instead (its variants differ only in a bitcode wrapper header)
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <unistd.h>

#include "jit.hpp"
#include "test_runtime.hpp"

using namespace bitship;
using Clock = std::chrono::steady_clock;

namespace {

struct Summary {
    double median, min, max;
};

Summary summarise(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return {v[v.size() / 2], v.front(), v.back()};
}

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

std::unique_ptr<jit::Jit> make_jit(unsigned opt_level, double* create_ms, unsigned tiers = 1,
                                   std::filesystem::path cache_dir = {}) {
    jit::JitOptions options;
    options.cache_dir = std::move(cache_dir);
    options.exports = jit_test::runtime_exports();
    options.opt_level = opt_level;
    options.tiers = tiers;
    auto start = Clock::now();
    auto j = jit::Jit::create(std::move(options));
    if (create_ms) *create_ms = ms_since(start);
    if (!j) {
        std::fprintf(stderr, "Jit::create: %s\n", j.error().describe().c_str());
        std::exit(1);
    }
    return std::move(*j);
}

} // namespace

int main(int argc, char** argv) {
    std::vector<unsigned> levels;
    for (int i = 1; i < argc; ++i) levels.push_back(static_cast<unsigned>(std::stoul(argv[i])));
    if (levels.empty()) levels = {0, 1, 2, 3};

    std::vector<jit_test::Bundle> bundles;
    if (const char* path = std::getenv("BITSHIP_TIMING_BITCODE")) {
        const char* entry = std::getenv("BITSHIP_TIMING_ENTRY");
        std::ifstream in(path, std::ios::binary);
        std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        if (!in.good() && !in.eof()) return std::fprintf(stderr, "cannot read %s\n", path), 1;
        for (std::uint32_t n = 1; n <= BITSHIP_JIT_TIMING_VARIANTS; ++n) {
            // LLVM's bitcode wrapper header: magic, version, offset, size, CPU type (the variant).
            const std::array<std::uint32_t, 5> header{0x0B17C0DE, 0, 20, static_cast<std::uint32_t>(chars.size()), n};
            std::vector<std::byte> bytes(sizeof header + chars.size());
            std::memcpy(bytes.data(), header.data(), sizeof header);
            std::memcpy(bytes.data() + sizeof header, chars.data(), chars.size());
            bundles.push_back(jit_test::make_bundle(bytes, {entry ? entry : "main"}));
        }
    } else {
        for (int n = 1; n <= BITSHIP_JIT_TIMING_VARIANTS; ++n)
            bundles.push_back(jit_test::make_bundle(jit_test::kernel_bitcode("add_v" + std::to_string(n)), {"add"}));
    }

    const auto& h = jit::host();
    std::printf("host %s, cpu %s, LLVM %s; %zu distinct add-kernel variants per level, one Jit per level\n",
                h.triple.c_str(), h.cpu.c_str(), to_string(h.llvm).c_str(), bundles.size());

    // One-time costs: LLVM target initialisation, the first TargetMachine, pass registration;
    // then what is left of them after Jit::warm_up (what an agent's first shipped kernel pays).
    for (bool warm : {false, true}) {
        double create_ms = 0;
        auto j = make_jit(2, &create_ms, 2);
        double warm_ms = 0;
        if (warm) {
            auto t = Clock::now();
            if (auto w = j->warm_up(); !w) return std::fprintf(stderr, "%s\n", w.error().describe().c_str()), 1;
            warm_ms = ms_since(t);
        }
        auto b = jit_test::make_bundle(jit_test::kernel_bitcode("add"), {"add"});
        // On a thread of its own, as an agent's worker compiles.
        Clock::time_point start;
        Result<std::shared_ptr<const jit::CompiledCode>> code = fail(Errc::internal, "not run");
        std::thread([&] {
            start = Clock::now();
            code = j->compile(b.bytes, b.hash);
        }).join();
        if (!code) return std::fprintf(stderr, "%s\n", code.error().describe().c_str()), 1;
        const auto& s = (*code)->stats();
        std::printf("first in process%s: Jit::create %.2f ms, warm-up %.2f ms, first compile (tier %u) %.2f ms wall "
                    "(verify %.2f parse %.2f optimise %.2f codegen %.2f link %.2f)\n",
                    warm ? " after warm-up" : "", create_ms, warm_ms, s.tier, ms_since(start), s.verify_ms, s.parse_ms,
                    s.optimise_ms, s.codegen_ms, s.link_ms);
        j->drain_tier_ups();
    }

    std::printf("\n%-5s %-9s %8s %8s %8s\n", "tier", "phase", "median", "min", "max");
    // Tier 1 at each level asked for, then tier 0 (which is the same whatever the level).
    constexpr unsigned kTier0 = ~0u;
    levels.push_back(kTier0);
    for (unsigned level : levels) {
        const bool tier0 = level == kTier0;
        double create_ms = 0;
        auto j = make_jit(tier0 ? 2 : level, &create_ms, tier0 ? 2 : 1);
        const std::string label = tier0 ? "t0" : "t1/O" + std::to_string(level);
        std::vector<double> verify, parse, optimise, codegen, link, total, wall;
        for (const auto& b : bundles) {
            auto start = Clock::now();
            auto code = j->compile(b.bytes, b.hash);
            wall.push_back(ms_since(start));
            if (!code) return std::fprintf(stderr, "%s\n", code.error().describe().c_str()), 1;
            const auto& s = (*code)->stats();
            verify.push_back(s.verify_ms);
            parse.push_back(s.parse_ms);
            optimise.push_back(s.optimise_ms);
            codegen.push_back(s.codegen_ms);
            link.push_back(s.link_ms);
            total.push_back(s.total_ms());
            j->drain_tier_ups(); // tier 1 in the background would skew the next tier-0 compile
        }
        auto row = [&](const char* name, const std::vector<double>& v) {
            auto s = summarise(v);
            std::printf("%-5s %-9s %8.3f %8.3f %8.3f\n", label.c_str(), name, s.median, s.min, s.max);
        };
        std::printf("%-5s %-9s %8.3f\n", label.c_str(), "create", create_ms);
        row("verify", verify);
        row("parse", parse);
        row("optimise", optimise);
        row("codegen", codegen);
        row("link", link);
        row("total", total);
        row("wall", wall);
    }

    // A restarted agent: every variant's optimised object is on disk; load() links it.
    {
        auto dir = std::filesystem::temp_directory_path() / ("bitship-timing-" + std::to_string(::getpid()));
        std::filesystem::remove_all(dir);
        {
            auto j = make_jit(2, nullptr, 1, dir);
            for (const auto& b : bundles)
                if (auto code = j->compile(b.bytes, b.hash); !code)
                    return std::fprintf(stderr, "%s\n", code.error().describe().c_str()), 1;
        }
        auto j = make_jit(2, nullptr, 2, dir);
        if (auto w = j->warm_up(); !w) return std::fprintf(stderr, "%s\n", w.error().describe().c_str()), 1;
        std::vector<double> verify, link, wall;
        for (const auto& b : bundles) {
            auto start = Clock::now();
            auto code = j->load(b.hash);
            wall.push_back(ms_since(start));
            if (!code) return std::fprintf(stderr, "%s\n", code.error().describe().c_str()), 1;
            if (!(*code)->stats().from_object) return std::fprintf(stderr, "not loaded as an object\n"), 1;
            verify.push_back((*code)->stats().verify_ms);
            link.push_back((*code)->stats().link_ms);
        }
        std::filesystem::remove_all(dir);
        for (auto [name, v] : {std::pair{"verify", &verify}, {"link", &link}, {"wall", &wall}}) {
            auto s = summarise(*v);
            std::printf("%-5s %-9s %8.3f %8.3f %8.3f\n", "obj", name, s.median, s.min, s.max);
        }
    }
    return 0;
}
