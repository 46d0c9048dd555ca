#include "cycle_clock.hpp"

#include <chrono>

#if defined(__x86_64__)
#include <cpuid.h>
#include <x86intrin.h>
#endif

namespace bitship::agent {
namespace {

using steady = std::chrono::steady_clock;

struct Rate {
    bool tsc = false;
    double ns_per_tick = 1.0;
};

#if defined(__x86_64__)
// steady_clock and the counter read together: the counter between two clock reads at most
// kPaired apart (retried otherwise), so a preemption between reads cannot skew the rate.
struct Pair {
    steady::time_point time;
    std::uint64_t ticks;
};
constexpr auto kPaired = std::chrono::microseconds(2);
constexpr int kPairTries = 1000;
constexpr auto kCalibration = std::chrono::milliseconds(1);

Pair paired() {
    Pair p{steady::now(), __rdtsc()};
    for (int tries = 0; tries < kPairTries; ++tries) {
        const auto before = steady::now();
        const auto ticks = __rdtsc();
        const auto after = steady::now();
        p = Pair{before + (after - before) / 2, ticks};
        if (after - before < kPaired) break;
    }
    return p;
}
#endif

Rate measure() {
#if defined(__x86_64__)
    unsigned a = 0, b = 0, c = 0, d = 0;
    constexpr unsigned kPowerManagementLeaf = 0x80000007; // "advanced power management": EDX bit 8
    constexpr unsigned kInvariantTsc = 1u << 8;
    if (__get_cpuid(kPowerManagementLeaf, &a, &b, &c, &d) != 0 && (d & kInvariantTsc) != 0) {
        const auto start = paired();
        while (steady::now() - start.time < kCalibration) {
        }
        const auto end = paired();
        const double ns = std::chrono::duration<double, std::nano>(end.time - start.time).count();
        if (end.ticks > start.ticks && ns > 0)
            return Rate{true, ns / static_cast<double>(end.ticks - start.ticks)};
    }
#endif
    return Rate{};
}

const Rate& rate() noexcept {
    static const Rate r = measure();
    return r;
}

} // namespace

std::uint64_t CycleClock::now() noexcept {
#if defined(__x86_64__)
    if (rate().tsc) return __rdtsc();
#endif
    return static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(steady::now().time_since_epoch())
            .count());
}

std::uint64_t CycleClock::ns_since(std::uint64_t began) noexcept {
    const auto end = now();
    if (end <= began) return 0;
    const auto& r = rate();
    if (!r.tsc) return end - began;
    return static_cast<std::uint64_t>(static_cast<double>(end - began) * r.ns_per_tick);
}

bool CycleClock::uses_tsc() noexcept {
    return rate().tsc;
}

} // namespace bitship::agent
