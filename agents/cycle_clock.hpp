#pragma once
// Timing a kernel's run on every call, cheaply. steady_clock::now() reads the clock through
// the vDSO (27 ns here under kvm-clock) and a cached call reads it twice; the CPU's time-stamp
// counter is one instruction (11 ns). Where it ticks at a constant rate (x86 with an invariant
// TSC) CycleClock reads it and turns ticks into nanoseconds at a rate measured once against
// steady_clock (1 ms, on first use); elsewhere it is steady_clock itself.
//
//   const auto began = CycleClock::now();
//   run();
//   record(CycleClock::ns_since(began));

#include <cstdint>

namespace bitship::agent {

class CycleClock {
public:
    /// A reading, to give ns_since() later (same process).
    [[nodiscard]] static std::uint64_t now() noexcept;
    /// Nanoseconds since `began` (0 if a counter read on another core seems to go back).
    [[nodiscard]] static std::uint64_t ns_since(std::uint64_t began) noexcept;
    /// Whether readings are the time-stamp counter (else steady_clock nanoseconds).
    [[nodiscard]] static bool uses_tsc() noexcept;
};

} // namespace bitship::agent
