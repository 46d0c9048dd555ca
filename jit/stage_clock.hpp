#pragma once
// Times the stages of a compile (CompileStats): each lap is the time since the last one.
// Private to jit/.

#include <chrono>

namespace bitship::jit {

/// Milliseconds since `mark`, which then moves to now.
inline double lap_ms(std::chrono::steady_clock::time_point& mark) {
    auto now = std::chrono::steady_clock::now();
    double ms = std::chrono::duration<double, std::milli>(now - mark).count();
    mark = now;
    return ms;
}

} // namespace bitship::jit
