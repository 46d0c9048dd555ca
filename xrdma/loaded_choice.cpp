#include "loaded_choice.hpp"

#include <algorithm>

namespace bitship::xrdma {

Strategy loaded_choice(const OpModel& model, const OpWork& work, bool cached, std::span<const Strategy> strategies,
                       Strategy by_breakpoints, OwnerLoad load, Shift* shift) noexcept {
    const double remote_wait_ns = std::max(load.wait_ns, 0.0) + std::max(load.wake_ns, 0.0);
    if (remote_wait_ns <= 0 || std::find(strategies.begin(), strategies.end(), Strategy::get) == strategies.end())
        return by_breakpoints;
    const double get_ns = load.get_late * estimate_ns(model, Strategy::get, work, cached) + std::max(load.get_wake_ns, 0.0);
    if (by_breakpoints != Strategy::get) {
        if (get_ns >= estimate_ns(model, by_breakpoints, work, cached, remote_wait_ns)) return by_breakpoints;
        if (shift != nullptr) *shift = load.wait_ns > 0 ? Shift::pushed_back : Shift::asleep;
        return Strategy::get;
    }
    // GET by the breakpoints, its GETs late too (cold rows over TCP: GET chosen at 0.5-3.3 ms
    // where native took 79-674 us, regret up to 6.4).
    if (load.get_late <= 1) return by_breakpoints;
    Strategy choice = Strategy::get;
    double best = get_ns;
    for (auto s : strategies) {
        if (s == Strategy::get) continue;
        if (const double e = estimate_ns(model, s, work, cached, remote_wait_ns); e < best) {
            best = e;
            choice = s;
        }
    }
    if (choice != Strategy::get && shift != nullptr) *shift = Shift::late_gets;
    return choice;
}

} // namespace bitship::xrdma
