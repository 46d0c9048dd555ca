#pragma once
// The run-time choice at a loaded owner: the breakpoints' strategy weighed against GET, each
// by what it costs now. A remote run waits for the owner's queue once; GETs, which the owner
// serves itself where UCX emulates them on the target (TCP), are late at every step of a walk.
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
};

/// Why the choice left the breakpoints' strategy.
enum class Shift {
    none,
    pushed_back, ///< the queue makes the remote run dearer than fetching: GET
    late_gets,   ///< the GETs are late too, and fetching costs more than the queue: shipped
};

/// `by_breakpoints` where the owner is not loaded (wait_ns 0) or `strategies` has no GET;
/// else GET (×get_late) against the remote choice (+wait_ns), or, where the breakpoints chose
/// GET and its GETs are late, the cheapest of all as they cost now. `shift` (optional) says
/// which, and is left alone where nothing moved.
[[nodiscard]] Strategy loaded_choice(const OpModel& model, const OpWork& work, bool cached, std::span<const Strategy> strategies,
                                     Strategy by_breakpoints, OwnerLoad load, Shift* shift = nullptr) noexcept;

} // namespace bitship::xrdma
