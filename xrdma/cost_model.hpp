#pragma once
// The planner's cost model: what one run of an operation costs by each strategy, in measured
// terms. The link's own figures (round trip, GET latency, GET bandwidth: probe_link) carry the
// network; what the link cannot tell (the agent's cost per hop or item, the client's own per
// item, a dispatch overhead, the first call's code transfer and compile) is fitted from timed
// runs, and refreshed from real ones.
//
//   get      dependent GETs × GET latency + the bytes' cost (LinkFigures::get_curve, for each
//            GET's share) + fixed + units × client ns/unit
//   native   round trip + fixed + units × agent ns/unit + answer bytes × ns/byte + queue wait
//   shipped  as native, with the shipped kernel's own per-unit cost, plus the code's first
//            transfer and compile when the agents do not hold it (once per agent a walk
//            reaches; once for a fan-out, whose agents compile in parallel)
//   reship   as shipped, plus a round trip here for every crossing to another agent (where
//            shipped pays an agent-to-agent forward inside its per-unit cost)
//
// A fan-out (work spread over several agents with no forwards) costs its largest share, and
// where agents share a host's cores (LinkFigures::lanes), the shares of those that wait.

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "link_probe.hpp"
#include "op.hpp"
#include "strategy.hpp"

namespace bitship::xrdma {

inline constexpr std::size_t kStrategies = 4;
inline constexpr std::array<Strategy, kStrategies> kAllStrategies{Strategy::get, Strategy::native, Strategy::xrdma,
                                                                  Strategy::reship};
[[nodiscard]] constexpr std::size_t index_of(Strategy s) noexcept { return static_cast<std::size_t>(s); }
/// Whether `s` runs the shipped kernel (its first call at an agent transfers and compiles it).
[[nodiscard]] constexpr bool ships_code(Strategy s) noexcept { return s == Strategy::xrdma || s == Strategy::reship; }

/// A straight line fitted to timed runs: what the link terms leave, against units.
struct StrategyFit {
    double fixed_ns = 0;    ///< dispatch and completion beyond the link's own terms
    double per_unit_ns = 0; ///< per item or hop (agent's for native/shipped, client's for get)
    bool fitted = false;
};

/// One timed run, for fitting.
struct Sample {
    std::uint64_t size = 0;
    double ns = 0;
};

/// What it costs to run one operation with one set of agents.
struct OpModel {
    LinkFigures link;
    std::array<StrategyFit, kStrategies> fits{};
    double cold_ns = 0; ///< the shipped kernel's first call at an agent beyond a cached one
    /// On a walk, each further agent's first call: dearer than the first one's where the earlier
    /// agents' optimised recompiles (tiered JIT) run meanwhile on the same few cores. 0: cold_ns.
    double cold_next_ns = 0;
};

/// One strategy's estimate, and the terms it is made of (for the explanation).
struct Estimate {
    Strategy strategy = Strategy::get;
    double ns = 0;
    std::string terms; ///< "rtt 19 µs + 1024 × 12 ns"
};

/// Units the agents work through one after another: all of a walk, the largest share of a
/// fan-out over the agents that can run at once (`lanes`, LinkFigures::lanes; 0: every agent).
[[nodiscard]] double serial_units(const OpWork& work, std::uint32_t lanes = 0) noexcept;

/// What a run's GETs cost for their bytes, beyond each one's latency: LinkFigures::get_curve
/// at each GET's share of the bytes (one GET per dependent step, or per agent of a fan-out).
[[nodiscard]] double get_bytes_ns(const LinkFigures& link, const OpWork& work) noexcept;

/// The link terms alone (what a fit is fitted beyond).
[[nodiscard]] double link_ns(const LinkFigures& link, Strategy s, const OpWork& work) noexcept;

/// What `work` costs by `s`: `cached` says whether the agents hold the shipped code;
/// `queue_wait_ns` is what a call waits at a loaded agent before a worker takes it.
[[nodiscard]] double estimate_ns(const OpModel& model, Strategy s, const OpWork& work, bool cached,
                                 double queue_wait_ns = 0) noexcept;
/// estimate_ns with its terms written out.
[[nodiscard]] Estimate explain(const OpModel& model, Strategy s, const OpWork& work, bool cached, double queue_wait_ns = 0);

/// Least-squares line through `samples` after the link terms are taken off (the op gives the
/// work of each size). Fewer than two distinct sizes: the mean residual, no slope.
[[nodiscard]] StrategyFit fit(const Op& op, const LinkFigures& link, Strategy s, std::span<const Sample> samples);

/// A GET's round trip as timed runs of the GET strategy show it (the slope of time against
/// dependent GETs), when those vary over `samples`: it replaces the probe's figure, which one
/// descheduled moment can spoil.
[[nodiscard]] std::optional<double> fit_get_latency(const Op& op, const LinkFigures& link, std::span<const Sample> samples);

/// "12.3 ms", "31 µs", "850 ns".
[[nodiscard]] std::string format_ns(double ns);

} // namespace bitship::xrdma
