#include "link_probe.hpp"

#include "running_figure.hpp"

#include <algorithm>
#include <optional>
#include <fmt/format.h>
#include <thread>
#include <vector>

namespace bitship::xrdma {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::uint32_t kSmallBytes = 8;
constexpr std::uint32_t kBulkBytes = 256u << 10; ///< less when the region is smaller
constexpr std::size_t kMaxRounds = 16;           ///< rounds of (ping, small GET[, bulk GET])
constexpr std::size_t kBulkEvery = 4;            ///< a bulk GET in every this many rounds
constexpr std::size_t kLadderPerRound = 4;       ///< GETs at GetCurve::ladder's sizes a round, in turn
/// A step in the GET curve (GetCurve::refine_step) worth narrowing: a rise this share of a
/// small GET beyond what the segments around it give; narrowed by this many bisections, each
/// the least of kStepGets GETs.
constexpr double kStepShare = 0.2;
constexpr unsigned kStepBisections = 3;
constexpr std::size_t kStepGets = 3;

/// Runs `call` (which returns a Future) and returns its time in ns, or its error.
template <class Call> Result<double> timed(Call&& call) {
    auto began = Clock::now();
    auto r = call().get();
    auto took = Clock::now() - began;
    if (!r) return tl::make_unexpected(r.error());
    return std::chrono::duration<double, std::nano>(took).count();
}

} // namespace

double summarise_gets(const RunningFigure& small, std::span<const std::uint32_t> ladder,
                      std::span<const RunningFigure> at_ladder, const RunningFigure& bulk, LinkFigures& out) {
    // A small GET is never dearer than a larger one: a sample above the least larger GET was
    // a slow moment of the host (CI's loaded 2 cores gave one round, an 8 B GET of 9.8 ms
    // against 1.1 ms for 256 KiB, and a curve of zeros).
    double least_larger = bulk.percentile(0);
    for (const auto& g : at_ladder) least_larger = std::min(least_larger, g.percentile(0));
    out.get_ns = std::min(small.p50(), least_larger);
    // The bytes beyond the small GET's, at the bulk GET's cost beyond the small one's. Noise
    // can make a bulk GET on a fast mapped link look no dearer than a small one: then the whole
    // bulk time over its bytes, a bound that is never zero.
    const double extra_bytes = static_cast<double>(out.bulk_bytes) - kSmallBytes;
    const double extra_ns = bulk.p50() - out.get_ns;
    out.get_ns_per_byte = extra_bytes > 0 && extra_ns > 0 ? extra_ns / extra_bytes
                                                          : bulk.p50() / static_cast<double>(out.bulk_bytes);
    // The curve: each ladder size's GET and the bulk GET beyond the small GET, each the least
    // of its samples less the least small GET (a slow moment of a loaded host only adds, and a
    // probe's few samples a size cannot outvote a spell: over TCP, in the first probe after an
    // agent started, medians of 2-3 put a 4 KiB GET at the small one's cost and 5.8 KiB at
    // 9 us more).
    const double least_small = std::min(small.percentile(0), least_larger);
    out.get_curve = GetCurve{};
    for (std::size_t i = 0; i < ladder.size() && i < at_ladder.size(); ++i)
        out.get_curve.add(ladder[i], at_ladder[i].percentile(0) - least_small);
    // The bulk GET's own least the least of all (every sample of the others slow): its cost
    // beyond the small one at the per-byte figure above, never zero.
    const double bulk_extra = bulk.percentile(0) - least_small;
    out.get_curve.add(out.bulk_bytes, bulk_extra > 0 ? bulk_extra : out.get_ns_per_byte * extra_bytes);
    out.get_curve.make_monotone();
    return least_small;
}

Result<LinkFigures> probe_link(Client& client, const Target& target, const RemoteRegion& region,
                               std::chrono::microseconds budget) {
    if (region.target != target.id())
        return fail(Errc::invalid_argument,
                    fmt::format("region '{}' belongs to another target than agent {}", region.name,
                                target.info().address));
    if (region.size < kSmallBytes)
        return fail(
            Errc::invalid_argument,
            fmt::format("region '{}' of agent {} has {} bytes: a link probe needs at least {}",
                        region.name, target.info().address, region.size, kSmallBytes));
    // The woken pings come last; a tenth of the budget is kept for what the estimates below
    // miss (the probe's thread starting, the step's search running long on a loaded host).
    const auto deadline = Clock::now() + budget - budget / 10 - kWakePings * (kWakeSpell + kWakeSlack);
    LinkFigures out;
    auto mapped = client.mapped(region);
    if (!mapped) return tl::make_unexpected(mapped.error());
    out.mapped = *mapped;
    out.bulk_bytes = static_cast<std::uint32_t>(std::min<std::uint64_t>(kBulkBytes, region.size));

    auto ping = [&] { return client.ping(target); };
    auto small = [&] { return client.get(region, 0, kSmallBytes); };
    auto bulk = [&] { return client.get(region, 0, out.bulk_bytes); };
    const auto ladder = GetCurve::ladder(out.bulk_bytes);
    // Warm-up, not counted: the first call on a path pays for lazy set-up (the rkey unpacked,
    // UCX's lanes and buffers).
    if (auto r = timed(ping); !r) return tl::make_unexpected(r.error());
    if (auto r = timed(small); !r) return tl::make_unexpected(r.error());
    if (auto r = timed(bulk); !r) return tl::make_unexpected(r.error());

    RunningFigure rtt, get_small, get_bulk;
    std::vector<RunningFigure> get_ladder(ladder.size());
    // A round goes only if it ends, as the last of its kind did, in time for what must follow
    // it before the woken pings: the step's GETs (kStepBisections × kStepGets) and the ladder
    // sizes no round has measured yet, each about a ladder GET.
    // The ladder's sizes take turns, kLadderPerRound a round, so that a slow moment of the host
    // falls on one sample of a size, not on every size measured in it.
    Clock::duration bulk_round_took{}, round_took{};
    double ladder_ns = 0, last_bulk_ns = 0; // the ladder GETs' time so far; the latest bulk GET's
    std::size_t next_rung = 0;
    for (std::size_t round = 0; round < kMaxRounds; ++round) {
        const auto began_round = Clock::now();
        const bool bulk_round = round % kBulkEvery == 0;
        const std::size_t unmeasured = ladder.size() - std::min(ladder.size(), next_rung);
        const double per_ladder_get_ns = next_rung > 0 ? ladder_ns / static_cast<double>(next_rung) : 0;
        const auto reserve = std::chrono::duration_cast<Clock::duration>(
            std::chrono::duration<double, std::nano>(per_ladder_get_ns * static_cast<double>(kStepBisections * kStepGets + unmeasured)));
        // Before a plain round has run, the bulk round less its bulk GET stands for one.
        const auto plain_round = round_took.count() > 0
                                     ? round_took
                                     : bulk_round_took - std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::nano>(last_bulk_ns));
        if (round > 0 && began_round + (bulk_round ? bulk_round_took : plain_round) + reserve >= deadline) break;
        auto p = timed(ping);
        if (!p) return tl::make_unexpected(p.error());
        rtt.add(*p);
        auto s = timed(small);
        if (!s) return tl::make_unexpected(s.error());
        get_small.add(*s);
        for (std::size_t k = 0; k < kLadderPerRound && !ladder.empty(); ++k, ++next_rung) {
            const std::size_t i = next_rung % ladder.size();
            auto g = timed([&] { return client.get(region, 0, ladder[i]); });
            if (!g) return tl::make_unexpected(g.error());
            get_ladder[i].add(*g);
            ladder_ns += *g;
        }
        if (bulk_round) {
            auto b = timed(bulk);
            if (!b) return tl::make_unexpected(b.error());
            get_bulk.add(*b);
            last_bulk_ns = *b;
        }
        (bulk_round ? bulk_round_took : round_took) = Clock::now() - began_round;
    }
    // Every ladder size once at least, whatever the budget left.
    for (std::size_t i = 0; i < ladder.size(); ++i) {
        if (get_ladder[i].count() > 0) continue;
        auto g = timed([&] { return client.get(region, 0, ladder[i]); });
        if (!g) return tl::make_unexpected(g.error());
        get_ladder[i].add(*g);
    }
    out.rtt_ns = rtt.p50();
    out.pings = rtt.count();
    out.small_gets = get_small.count();
    out.bulk_gets = get_bulk.count();
    const double least_small = summarise_gets(get_small, ladder, get_ladder, get_bulk, out);
    // Then its steepest step narrowed (over TCP, where a GET's reply stops fitting one segment).
    std::optional<Error> failed;
    out.get_curve.refine_step(
        [&](std::uint32_t bytes) {
            RunningFigure at;
            for (std::size_t k = 0; k < kStepGets && !failed; ++k) {
                auto g = timed([&] { return client.get(region, 0, bytes); });
                if (g) at.add(*g);
                else failed = g.error();
            }
            return at.percentile(0) - least_small;
        },
        kStepShare * out.get_ns, kStepBisections);
    if (failed) return tl::make_unexpected(*failed);
    out.get_curve.make_monotone();
    // The woken pings last: the rounds before keep the agent awake, as calls do.
    RunningFigure woken;
    for (std::size_t i = 0; i < kWakePings; ++i) {
        std::this_thread::sleep_for(kWakeSpell);
        auto p = timed(ping);
        if (!p) return tl::make_unexpected(p.error());
        woken.add(*p);
    }
    out.wake_ns = std::max(0.0, woken.p50() - out.rtt_ns);
    out.woken_pings = woken.count();
    return out;
}

std::future<Result<LinkFigures>> probe_link_async(Client& client, const Target& target,
                                                  RemoteRegion region,
                                                  std::chrono::microseconds budget) {
    return std::async(std::launch::async, [&client, target, region = std::move(region), budget] {
        return probe_link(client, target, region, budget);
    });
}

} // namespace bitship::xrdma
