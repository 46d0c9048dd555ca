// CycleClock: the time-stamp counter, turned into nanoseconds, agrees with steady_clock.
#include "cycle_clock.hpp"

#include <catch2/catch.hpp>
#include <chrono>
#include <thread>

namespace cycle_clock_test_cpp {

using bitship::agent::CycleClock;

TEST_CASE("CycleClock measures a span as steady_clock does, and never goes back", "[unit]") {
    // 50 ms between readings taken side by side: the two clocks may differ by the reads' own
    // jitter (or a preemption between two of them), not by a wrong rate.
    (void)CycleClock::uses_tsc(); // its rate is measured on first use (1 ms), not inside the span
    const auto t0 = std::chrono::steady_clock::now();
    const auto c0 = CycleClock::now();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const auto ns = CycleClock::ns_since(c0);
    const auto steady_ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
            .count();
    INFO("CycleClock " << ns << " ns, steady_clock " << steady_ns
                       << " ns, time-stamp counter: " << CycleClock::uses_tsc());
    CHECK(static_cast<double>(ns) >= 0.8 * static_cast<double>(steady_ns));
    CHECK(static_cast<double>(ns) <= 1.02 * static_cast<double>(steady_ns));
    // A reading from later never gives a negative span, nor one from the future.
    CHECK(CycleClock::ns_since(CycleClock::now() + (std::uint64_t{1} << 40)) == 0);
}

}  // namespace cycle_clock_test_cpp
