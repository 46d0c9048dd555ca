// Calibration: the links probed, and every strategy of an op timed across its range, fitted.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <thread>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <bitship/transport.hpp>

#include "planner_impl.hpp"

namespace bitship::xrdma {
namespace {

/// A strategy whose run took longer than this stops going to larger sizes in calibration (the
/// fit extrapolates).
constexpr auto kCalibrationRunLimit = std::chrono::milliseconds(400);
/// Untimed rounds of every strategy at the smallest size before calibration's timed runs, for
/// at most kCalibrationWarmTime after the first (a range whose smallest size is slow).
constexpr unsigned kCalibrationWarmRounds = 64;
constexpr auto kCalibrationWarmTime = std::chrono::milliseconds(20);
/// How long calibration waits for the agents' optimised (tier-1) code after a compile.
constexpr auto kTierUpWait = std::chrono::seconds(2);
constexpr auto kTierUpFloor = std::chrono::milliseconds(20);
constexpr auto kTierUpPoll = std::chrono::milliseconds(2);
constexpr std::uint64_t kTierUpFactor = 8;
constexpr std::uint8_t kCacheEvictType = 19; // wire::Type::cache_evict

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0 : v[v.size() / 2];
}
} // namespace

/// Every strategy at sizes across the range; the fits; the first call's extra cost.
Result<void> Planner::Impl::calibrate(OpState& st) {
    Op& op = *st.op;
    const auto& b = st.bounds;
    std::vector<std::uint64_t> sizes;
    const unsigned n = std::max(options.calibration_sizes, 2u);
    const double ratio = static_cast<double>(b.max_size) / static_cast<double>(b.min_size);
    for (unsigned i = 0; i < n; ++i) {
        auto s = static_cast<std::uint64_t>(std::llround(b.min_size * std::pow(ratio, double(i) / (n - 1))));
        s = std::clamp(s, b.min_size, b.max_size);
        if (sizes.empty() || s != sizes.back()) sizes.push_back(s);
    }
    // 1. Each strategy once (answers checked); the shipped code reaches the agents here.
    auto marks = compile_marks();
    for (auto s : st.strategies)
        if (auto r = timed(op, b.min_size, s, true); !r) return tl::make_unexpected(r.error());
    await_tier_up(marks);
    st.cached = true;
    // 2. Timed runs across the range, and the fits.
    if (auto r = time_across_range(st, sizes); !r) return r;
    // 3. The shipped code's first call: evicted everywhere, then one call at the smallest size.
    st.entry.model.cold_ns = 0;
    const auto shipped = std::find_if(st.strategies.begin(), st.strategies.end(), ships_code);
    if (shipped != st.strategies.end()) {
        if (auto e = evict_code(op); !e) return e;
        marks = compile_marks();
        auto cold = timed(op, b.min_size, *shipped, false);
        if (!cold) return tl::make_unexpected(cold.error());
        const auto work = op.work(b.min_size);
        const double cached_ns = estimate_ns(st.entry.model, *shipped, work, true);
        const double agents_compiling = work.forwards > 0 ? std::max<std::uint32_t>(work.agents_touched, 1) : 1;
        st.entry.model.cold_ns = std::max(0.0, static_cast<double>(cold->second.count()) - cached_ns) / agents_compiling;
        await_tier_up(marks);
        // 4. A walk that reaches every agent, all cold: what each agent after the first adds.
        // On a host with few cores it is dearer than the first (the agents behind compile
        // while those before recompile their code optimised in the background).
        if (auto r = calibrate_cold_walk(st, sizes, *shipped, agents_compiling == 1); !r) return r;
    }
    ++stats.calibrations;
    return {};
}

/// Calibration's step 2: timed runs across the range, and the fits. At each size the
/// strategies take turns, a run each a round (the order rotated every round), and each
/// strategy's median at that size is its sample. One strategy's runs back to back let a
/// spell of slow calls fall on it alone: on a host with few cores, a client's caller and an
/// agent's leader that share a core (core_sharing.hpp) make every call 4-11 µs over shared
/// memory instead of 2 for a few dozen calls, and the fixed cost of whichever strategy ran
/// then read 4-10 µs too high (shm × 1, reduce and filter: xrdma's fixed 8.5 µs against
/// native's 1.9, the crossover two octaves off). In turns, such a spell costs every
/// strategy at that size alike, and their order stays right.
///
/// First kCalibrationWarmRounds untimed rounds of every strategy at the smallest size (or
/// kCalibrationWarmTime of them): the agents may have gone to sleep since step 1, and the
/// first calibration after the agents started timed its small remote runs at 5.5-6 µs over
/// shared memory where the later ones read 2.6-3 in the same process (with one run each
/// first; 2.6-3 for both with 64 rounds: the polling threads' places on the cores settle).
/// A remote run after a GET over mapped memory that outlasted the agents' spin window comes
/// after an untimed one (the GET woke no agent). The answers are checked against one
/// reference a size, computed before its runs (computed between runs, it would let the
/// agents fall asleep too).
Result<void> Planner::Impl::time_across_range(OpState& st, const std::vector<std::uint64_t>& sizes) {
    Op& op = *st.op;
    for (auto s : st.strategies) st.samples[index_of(s)].clear();
    const auto warm_until = Clock::now() + kCalibrationWarmTime;
    for (unsigned w = 0; w < kCalibrationWarmRounds && (w == 0 || Clock::now() < warm_until); ++w)
        for (auto s : st.strategies)
            if (auto r = timed(op, sizes.front(), s, false); !r) return tl::make_unexpected(r.error());
    std::vector<Strategy> going = st.strategies; // those still measured at larger sizes
    const unsigned runs = std::max(options.calibration_runs, 1u);
    for (auto size : sizes) {
        if (going.empty()) break;
        const Bytes want = op.expected(size);
        std::array<std::vector<double>, kStrategies> times;
        bool agents_may_sleep = false;
        for (unsigned r = 0; r < runs; ++r) {
            for (std::size_t i = 0; i < going.size(); ++i) {
                const Strategy s = going[(i + r) % going.size()];
                if (agents_may_sleep && s != Strategy::get)
                    if (auto w = timed(op, sizes.front(), s, false); !w) return tl::make_unexpected(w.error());
                auto run = timed(op, size, s, false);
                if (!run) return tl::make_unexpected(run.error());
                if (run->first != want)
                    return fail(Errc::internal, fmt::format("op {} by {} at {} {}: the answer differs from the reference", op.name(),
                                                            to_string(s), op.size_name(), size));
                times[index_of(s)].push_back(static_cast<double>(run->second.count()));
                if (s != Strategy::get) agents_may_sleep = false;
                // A GET over mapped memory as long as an agent's spin window (xagent's default)
                // may leave the agents asleep.
                else if (st.entry.model.link.mapped && run->second >= kDefaultSpin) agents_may_sleep = true;
            }
        }
        std::erase_if(going, [&](Strategy s) {
            auto& samples = st.samples[index_of(s)];
            const double m = median(times[index_of(s)]);
            samples.push_back({size, m});
            return samples.size() >= 2 && m > static_cast<double>(std::chrono::nanoseconds(kCalibrationRunLimit).count());
        });
    }
    // The GET latency first: every fit takes the link's terms off.
    if (std::find(st.strategies.begin(), st.strategies.end(), Strategy::get) != st.strategies.end())
        if (auto latency = fit_get_latency(op, st.entry.model.link, st.samples[index_of(Strategy::get)]))
            st.entry.model.link.get_ns = *latency;
    for (auto s : st.strategies) {
        const auto& samples = st.samples[index_of(s)];
        st.entry.model.fits[index_of(s)] = fit(op, st.entry.model.link, s, samples);
        if (spdlog::should_log(spdlog::level::debug)) {
            std::string medians;
            for (const auto& smp : samples) medians += fmt::format(" {}:{}", smp.size, format_ns(smp.ns));
            const auto& f = st.entry.model.fits[index_of(s)];
            spdlog::debug("planner: {} calibration {}:{} -> fixed {} + {:.3g} ns/unit", st.label, to_string(s), medians,
                          format_ns(f.fixed_ns), f.per_unit_ns);
        }
    }
    return {};
}

/// The cold walk of calibrate()'s step 4: model.cold_next_ns from the smallest size of
/// `sizes` whose walk reaches every agent (left 0, meaning cold_ns, when none does or the
/// first cold run was already such a walk).
Result<void> Planner::Impl::calibrate_cold_walk(OpState& st, const std::vector<std::uint64_t>& sizes, Strategy shipped, bool first_was_one) {
    Op& op = *st.op;
    auto& model = st.entry.model;
    model.cold_next_ns = 0;
    if (!first_was_one) return {};
    const auto walk = std::find_if(sizes.begin(), sizes.end(), [&](std::uint64_t size) {
        const auto w = op.work(size);
        return w.forwards > 0 && w.agents_touched >= std::max<std::size_t>(agents.size(), 2);
    });
    if (walk == sizes.end()) return {};
    if (auto e = evict_code(op); !e) return e;
    const auto marks = compile_marks();
    auto cold = timed(op, *walk, shipped, false);
    if (!cold) return tl::make_unexpected(cold.error());
    const auto work = op.work(*walk);
    const double cached_ns = estimate_ns(model, shipped, work, true);
    const double further = static_cast<double>(work.agents_touched - 1);
    // At least 1 ns: 0 reads as "each agent at cold_ns".
    model.cold_next_ns = std::max(1.0, (static_cast<double>(cold->second.count()) - cached_ns - model.cold_ns) / further);
    await_tier_up(marks);
    return {};
}

/// Probes every agent's link (one at a time: probes running at once would measure each
/// other). The first probe's failure is the error; later ones keep what was measured.
Result<void> Planner::Impl::probe_all() {
    const bool first = links.empty();
    if (!first) ++probes;
    for (std::size_t i = 0; i < agents.size(); ++i) {
        auto figures = probe_link(*client, agents[i], probe_regions[i], options.probe_budget);
        if (i == 0) owner_heard = Clock::now(); // the probe's last ping reached the owner, answered or not
        if (!figures) {
            if (first) return tl::make_unexpected(figures.error());
            continue;
        }
        if (first) {
            links.push_back(*figures);
            continue;
        }
        // The lower of each latency: an agent descheduled for a moment (a loaded host; a
        // progress thread found asleep) spoils a whole probe's round trips.
        auto& l = links[i];
        l.rtt_ns = std::min(l.rtt_ns, figures->rtt_ns);
        l.get_ns = std::min(l.get_ns, figures->get_ns);
        const std::array<const GetCurve*, 2> curves{&l.get_curve, &figures->get_curve};
        const std::array<double, 2> per_byte{l.get_ns_per_byte, figures->get_ns_per_byte};
        l.get_curve = GetCurve::combine(curves, per_byte, GetCurve::Combine::least);
        l.get_ns_per_byte = std::min(l.get_ns_per_byte, figures->get_ns_per_byte);
        l.wake_ns = std::min(l.wake_ns, figures->wake_ns);
    }
    link = combined(links);
    link.lanes = lanes_of(agents);
    return {};
}

/// How many agents can compute at once (LinkFigures::lanes): on each host, as many as it
/// has cores (WELCOME's); 0 when that is every agent.
std::uint32_t Planner::Impl::lanes_of(const std::vector<Target>& agents) {
    std::map<std::string_view, std::pair<std::uint32_t, std::uint32_t>> hosts; // host: agents, cores
    for (const auto& a : agents) {
        const std::string_view address = a.info().address;
        auto& [count, cores] = hosts[address.substr(0, address.rfind(':'))];
        ++count;
        cores = std::max(cores, a.info().cores);
    }
    std::uint32_t lanes = 0;
    for (const auto& [host, h] : hosts) lanes += h.second > 0 ? std::min(h.first, h.second) : h.first;
    return lanes >= agents.size() ? 0 : lanes;
}

/// The agents' figures as one link: their mean (a walk visits them alike; a fan-out waits
/// on all of them at once), the GET curve's at every size any of them was measured at.
/// Mapped only when every agent is.
LinkFigures Planner::Impl::combined(const std::vector<LinkFigures>& all) {
    LinkFigures out = all.front();
    if (all.size() == 1) return out;
    std::vector<const GetCurve*> curves;
    std::vector<double> per_byte;
    for (const auto& l : all) {
        curves.push_back(&l.get_curve);
        per_byte.push_back(l.get_ns_per_byte);
    }
    out.get_curve = GetCurve::combine(curves, per_byte, GetCurve::Combine::mean);
    out.rtt_ns = out.get_ns = out.get_ns_per_byte = out.wake_ns = 0;
    for (const auto& l : all) {
        out.rtt_ns += l.rtt_ns / static_cast<double>(all.size());
        out.wake_ns += l.wake_ns / static_cast<double>(all.size());
        out.get_ns += l.get_ns / static_cast<double>(all.size());
        out.get_ns_per_byte += l.get_ns_per_byte / static_cast<double>(all.size());
        out.mapped = out.mapped && l.mapped;
    }
    return out;
}

/// The agents' compile counters now: await_tier_up(mark) waits for what comes after.
std::vector<std::uint64_t> Planner::Impl::compile_marks() {
    std::vector<std::uint64_t> marks;
    for (const auto& a : agents) marks.push_back(counters(a)["compiles"]);
    return marks;
}

/// An agent's counters by name (empty when it does not answer).
std::map<std::string, std::uint64_t> Planner::Impl::counters(const Target& a) {
    auto all = client->agent_stats(a);
    if (!all) return {};
    return {all->begin(), all->end()};
}

/// After a compile since `marks`: waits out the agents' background tier-1 compiles, so they
/// do not compete with the runs timed next: until every agent reports none pending
/// (tier_ups_pending), at most kTierUpWait. An agent too old to report it gets
/// kTierUpFactor times its fast compile's own time, at least kTierUpFloor.
void Planner::Impl::await_tier_up(const std::vector<std::uint64_t>& marks) {
    const auto deadline = Clock::now() + kTierUpWait;
    std::uint64_t guess_ns = 0;
    for (std::size_t i = 0; i < agents.size(); ++i) {
        auto c = counters(agents[i]);
        if (c.empty() || c["compiles"] == marks[i]) continue;
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
        auto idle = client->await_tier_ups(agents[i], std::max(left, std::chrono::milliseconds(0)), kTierUpPoll);
        if (idle || idle.error().code != Errc::unsupported_version) continue; // done, timed out, or unreachable
        std::uint64_t ns = 0;
        for (auto name : {"last_compile_verify_ns", "last_compile_parse_ns", "last_compile_optimise_ns",
                          "last_compile_codegen_ns", "last_compile_link_ns"})
            ns += c[name];
        guess_ns = std::max(guess_ns, ns);
    }
    if (guess_ns == 0) return;
    const auto wait = std::max<std::chrono::nanoseconds>(kTierUpFloor, std::chrono::nanoseconds(guess_ns * kTierUpFactor));
    std::this_thread::sleep_for(std::min<std::chrono::nanoseconds>(wait, kTierUpWait));
}

Result<void> Planner::Impl::evict_code(const Op& op) {
    auto hash = code_hash(op);
    if (!hash) return tl::make_unexpected(hash.error());
    Bytes payload(hash->size());
    std::memcpy(payload.data(), hash->data(), hash->size());
    for (const auto& a : agents)
        if (auto r = client->control(a, kCacheEvictType, payload); !r) return tl::make_unexpected(r.error());
    return {};
}

} // namespace bitship::xrdma
