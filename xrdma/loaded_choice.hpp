#pragma once
// The run-time choice at a loaded or sleeping owner: the breakpoints' strategy weighed against
// GET, each by what it costs now. A remote run waits for the owner's queue once; GETs, which the
// owner serves itself where UCX emulates them on the target (TCP), are late at every step of a
// walk. An owner idle past its spin window has gone to sleep: the first message to it wakes it,
// once per call, and a GET over mapped memory wakes nobody.
//
//   auto s = loaded_choice(model, op.work(size), cached, strategies, bp.at(size), {wait_ns, get_late}, &shift);
//
// Private to xrdma/ (Planner::Impl::choose is its caller).

#include <span>

#include "cost_model.hpp"

namespace bitship::xrdma {

/// What the owner's recent runs say of its load (Planner::Impl::update_lateness).
struct OwnerLoad {
    double wait_ns = 0;  ///< what a remote call waits there before a worker takes it
    double get_late = 1; ///< its GETs' actual ÷ predicted meanwhile (≥ 1)
    /// The owner sleeps (idle past its spin window): what waking it adds to a remote call
    /// (LinkFigures::wake_ns), and to a GET walk (the same where the owner serves GETs; 0 over
    /// mapped memory). 0: awake.
    double wake_ns = 0;
    double get_wake_ns = 0;
};

/// Why the choice left the breakpoints' strategy.
enum class Shift {
    none,
    pushed_back, ///< the queue makes the remote run dearer than fetching: GET
    late_gets,   ///< the GETs are late too, and fetching costs more than the queue: shipped
    asleep,      ///< waking the sleeping owner makes the remote run dearer than fetching: GET
};

/// `by_breakpoints` where the owner is neither loaded nor asleep (wait_ns and wake_ns 0) or
/// `strategies` has no GET; else GET (×get_late, +get_wake_ns) against the remote choice
/// (+wait_ns +wake_ns), or, where the breakpoints chose GET and its GETs are late, the cheapest
/// of all as they cost now. `shift` (optional) says which (pushed_back where a queue was part of
/// it, asleep where the wake-up alone was), and is left alone where nothing moved.
[[nodiscard]] Strategy loaded_choice(const OpModel& model, const OpWork& work, bool cached, std::span<const Strategy> strategies,
                                     Strategy by_breakpoints, OwnerLoad load, Shift* shift = nullptr) noexcept;

} // namespace bitship::xrdma
