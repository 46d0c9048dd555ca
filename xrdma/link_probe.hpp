#pragma once
// What a link to one agent costs, measured with a few real round trips: the terms the
// planner's cost models are written in (round trip, small GET, bulk bytes, mapped or not).
//
//   auto region = client.region(agent, "chase").value();
//   auto link = probe_link_async(client, agent, region);  // at connect, in the background
//   ...
//   auto figures = link.get();                             // Result<LinkFigures>

#include <bitship/client.hpp>
#include <chrono>
#include <future>
#include <span>

#include "get_curve.hpp"
#include "running_figure.hpp"

namespace bitship::xrdma {

/// What a link to one peer costs, measured.
struct LinkFigures {
    double rtt_ns = 0;          ///< active-message round trip (Client::ping), median
    double get_ns = 0;          ///< one small (8 B) GET, median
    double get_ns_per_byte = 0; ///< bulk GET beyond the small one (from a 64-256 KiB GET)
    /// Bulk PUT: not probed (0). A PUT writes the agent's region, and the probe must not change
    /// what a user keeps there; the planner takes it from real PUTs (RunningFigure) instead.
    double put_ns_per_byte = 0;
    bool mapped = false;   ///< the peer's memory is directly mapped (shared-memory transport)
    /// What a round trip to the agent costs beyond rtt_ns after it has been left idle past its
    /// spin window (kWakeSpell: an xagent in its default spin-then-block mode has gone to
    /// sleep, and the message wakes it; one spinning still has its caches cooled), median of
    /// `woken_pings` pings, each after such a spell; never below 0. Not kept in wisdom: every
    /// open() measures the agents it has.
    double wake_ns = 0;
    std::size_t pings = 0; ///< how many samples each figure is the median of
    std::size_t woken_pings = 0;
    std::size_t small_gets = 0;
    std::size_t bulk_gets = 0;
    std::uint32_t bulk_bytes = 0; ///< the size of each bulk GET
    /// How many of the planner's agents can compute at once: agents on one host share its cores
    /// (4 agents on a 2-core host: 2). 0: each agent on cores of its own. Not probed: the planner
    /// works it out from the agents' WELCOME (their address and cores), and not kept in wisdom.
    std::uint32_t lanes = 0;
    /// A GET's cost beyond the small one against its size (GetCurve::ladder's sizes, a step
    /// narrowed, the bulk GET last): what the planner charges a GET's bytes. Empty (a link
    /// figured by hand, or wisdom from before it): bytes × get_ns_per_byte.
    GetCurve get_curve{};
};

/// How long the probe leaves an agent idle before each of its woken pings: 2.5× xagent's
/// default spin window (kDefaultSpin, 200 µs). At 1 ms the two spells took 2 of the probe's
/// 5 ms, and a TCP probe ran to 5.3-5.9 ms.
inline constexpr std::chrono::microseconds kWakeSpell{500};
/// What a woken ping costs beyond its spell, budgeted ahead: sleep_for's overshoot and the
/// ping that wakes the agent (150-200 µs over TCP on the reference VM).
inline constexpr std::chrono::microseconds kWakeSlack{250};
/// Woken pings a probe takes (LinkFigures::wake_ns).
inline constexpr std::size_t kWakePings = 2;

/// Measures a link within `budget` (default 5 ms) using `region` of the target for the GETs
/// (read only). Takes at least one sample of each kind whatever the budget, then more, in
/// rounds, while the budget less what must follow them lasts (at most kMaxRounds): a ping,
/// a small GET and GETs at four of GetCurve::ladder's sizes (in turn, each size once at least) each round, a bulk GET
/// every fourth; then the curve's steepest step narrowed (a few GETs); then
/// kWakePings pings, each after kWakeSpell of leaving the agent alone. Fails with the call's error when the
/// agent does not answer, invalid_argument when `region` is not `target`'s or under 8 bytes.
Result<LinkFigures> probe_link(Client& client, const Target& target, const RemoteRegion& region,
                               std::chrono::microseconds budget = std::chrono::milliseconds(5));

/// The probe's GET figures from its samples, each figure with one sample at least: `out`'s
/// get_ns (the small GETs' median, never above the least GET of any larger size: a small GET
/// sampled only in a slow moment of the host is not dearer than 256 KiB), get_ns_per_byte and
/// get_curve (`ladder`'s sizes at `at_ladder`'s samples and out.bulk_bytes at `bulk`'s, each
/// its least sample beyond the least small GET, made monotone, its bulk point never zero).
/// Returns that least small GET, what a narrowed step's GETs are measured beyond.
double summarise_gets(const RunningFigure& small, std::span<const std::uint32_t> ladder,
                      std::span<const RunningFigure> at_ladder, const RunningFigure& bulk, LinkFigures& out);

/// probe_link in the background: the future completes with the figures. `client` must outlive
/// the future's completion.
std::future<Result<LinkFigures>>
probe_link_async(Client& client, const Target& target, RemoteRegion region,
                 std::chrono::microseconds budget = std::chrono::milliseconds(5));

} // namespace bitship::xrdma
