#pragma once
// The kernel's coarse monotonic clock (CLOCK_MONOTONIC_COARSE: the time at its last tick, a few
// ms resolution), for what needs a time but not a precise one: it costs 4 ns here against 23 ns
// for steady_clock::now(). Private to bitship (core, jit, agents).

#include <chrono>
#include <cstdint>
#include <ctime>

namespace bitship {

/// Nanoseconds of the coarse monotonic clock (async-signal-safe).
[[nodiscard]] inline std::int64_t coarse_now_ns() noexcept {
    timespec ts{};
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return std::int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

/// The coarse clock as a steady_clock time point (both are CLOCK_MONOTONIC): at most one tick
/// earlier than steady_clock::now(), never later. For times compared at a few ms' grain (an
/// agent's reported load, the planner's lateness window).
[[nodiscard]] inline std::chrono::steady_clock::time_point coarse_steady_now() noexcept {
    using namespace std::chrono;
    return steady_clock::time_point(duration_cast<steady_clock::duration>(nanoseconds(coarse_now_ns())));
}

/// One tick of the coarse clock (its resolution: clock_getres), read once.
[[nodiscard]] inline std::chrono::nanoseconds coarse_tick() noexcept {
    using namespace std::chrono;
    static const nanoseconds tick = [] {
        timespec res{};
        clock_getres(CLOCK_MONOTONIC_COARSE, &res);
        return seconds(res.tv_sec) + nanoseconds(res.tv_nsec);
    }();
    return tick;
}

/// The clock a call's deadline starts from: the coarse clock as a steady_clock time point,
/// moved on by two ticks, so it is never earlier than steady_clock::now() and at most two ticks
/// (8 ms here) later. Deadlines are checked every Engine::kTick (20 ms), far coarser.
[[nodiscard]] inline std::chrono::steady_clock::time_point deadline_clock_now() noexcept {
    using namespace std::chrono;
    return coarse_steady_now() + duration_cast<steady_clock::duration>(2 * coarse_tick());
}

} // namespace bitship
