// Real runs: timed, checked, and what they teach the planner (the owner's lateness, refits of
// the model, agents persistently slower than predicted).
#include <algorithm>
#include <functional>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "planner_impl.hpp"

namespace bitship::xrdma {
namespace {

constexpr std::size_t kSamplesKept = 64;
/// Remote runs within load_fresh needed before their lateness counts as a queue, and the runs
/// kept: only the newest count, so a queue that has gone is forgotten after two runs on time
/// (kept twice as many, an upper median of six let three late runs from a load that had ended
/// push the next calls back for the whole load_fresh window).
constexpr std::size_t kLateRuns = 3;
constexpr std::size_t kLateKept = kLateRuns;
/// How old (in load_fresh) the late runs may be, and the longest a lateness holds. Counted
/// within load_fresh alone, runs spaced half of it or more apart never showed a queue:
/// bench/planner's cold busy rows, three runs a point between awaited compiles, shipped into a
/// 1-2 ms wait where GET took 10 us (regret 50-222x, bench/results/planner_getcurve_ab_20261204.txt),
/// and so would any caller that ships every 50 ms or more to a busy owner.
constexpr int kLateHorizon = 30;
/// A run that took more than this many times the model's estimate does not teach it: what
/// made it that slow is a load or a stall the model does not hold (it is the unloaded agent's;
/// the queue is added apart), not a cost of the op. Before update_lateness counted remote
/// runs this late as a queue whatever the GETs took, a load that makes every strategy late
/// alike (over TCP a GET waits for the loaded agent to progress as a remote run waits for its
/// worker: 250-500 µs against 7-8 predicted) passed as no load, and the refits after a busy
/// spell fitted its runs: native reduce at 21 ns an item against 1 measured, chosen wrong for
/// five octaves after the load had ended (bench/results/planner_learn_limit_20261202.txt).
/// Late runs still pass as unloaded (GETs alone, or fewer than kLateRuns remote runs in the
/// window): this keeps them out. The fits' own error is within 2x at p90.
constexpr double kLearnLimit = 4;

/// The median of v[0, n), in place (it reorders them): no allocation on a run's path.
template <std::size_t N>
double median_of_first(std::array<double, N>& v, std::size_t n) {
    if (n == 0) return 0;
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(n / 2), v.begin() + static_cast<std::ptrdiff_t>(n));
    return v[n / 2];
}
} // namespace

/// One run by `s`, timed; the answer checked against the op's own when `check`. A run that
/// reached the owner (reaches_owner) leaves it awake: owner_heard.
Result<std::pair<Bytes, std::chrono::nanoseconds>> Planner::Impl::timed(Op& op, std::uint64_t size, Strategy s, bool check) {
    const auto t0 = Clock::now();
    auto answer = op.start(s, size).get();
    const auto t1 = Clock::now();
    const auto took = std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0);
    last_run_end = t1;
    if (reaches_owner(s)) owner_heard = t1;
    if (!answer) return tl::make_unexpected(answer.error());
    if (check && *answer != op.expected(size))
        return fail(Errc::internal, fmt::format("op {} by {} at {} {}: the answer differs from the reference", op.name(),
                                                to_string(s), op.size_name(), size));
    return std::pair{std::move(*answer), took};
}

/// One run by `s`, timed, and what it teaches: `ahead` and `wait` are the owner's load as
/// it was just before (calls_ahead, queue_wait_ns), `wake` what waking it was taken to add
/// (wake_ns; 0: awake, or a strategy that does not reach it).
Result<std::pair<Bytes, std::chrono::nanoseconds>> Planner::Impl::run_recorded(OpState& st, std::uint64_t size, Strategy s,
                                                                                std::uint32_t ahead, double wait, double wake) {
    const bool cached_before = st.cached;
    // After a spell of this planner's own idle past the spin window, every strategy is slower
    // than in steady use (the client's caches too: a GET over mapped memory after 2 ms asleep
    // took 12-80 us where it takes 0.7-5 awake, bench/results/planner_wake_ab_20261203.txt).
    const auto began = Clock::now();
    const bool rested = options.agent_spin.count() > 0 && last_run_end != Clock::time_point{} &&
                        began - last_run_end > options.agent_spin;
    auto r = timed(*st.op, size, s, false);
    if (!r) return r;
    if (ships_code(s)) st.cached = true;
    ++stats.runs;
    if (wake > 0) ++stats.woke;
    if (wake > 0 || rested) ++stats.after_idle;
    record(st, size, s, cached_before, wait, ahead > 0, wake > 0, rested, static_cast<double>(r->second.count()));
    return r;
}

/// `woke`: the run found the owner asleep and paid for waking it: it teaches nothing (the
/// model, the lateness and the slow-agent record are all of an awake agent's), and is only
/// counted. `rested`: it came after an idle spell of this planner's: neither learnt nor in the
/// slow-agent record (both are of steady use), and still says what it says of the owner's load
/// (a loaded owner's runs are late however they are spaced: bench/planner's cold rows await
/// the compiles between runs; taught nothing, those rows chose native where GET was 8-159x
/// cheaper, bench/results/planner_wake_ab_20261203.txt).
void Planner::Impl::record(OpState& st, std::uint64_t size, Strategy s, bool cached_before, double wait, bool owner_full, bool woke,
                           bool rested, double actual_ns) {
    auto& rec = records[agents.front().id()];
    owner_record = &rec;
    if (woke) return;
    const auto work = st.op->work(size);
    // Against what the agent's own report predicted: a wait the planner inferred from late
    // runs (update_lateness) must not hide an agent that stays slow.
    const double predicted = estimate_ns(st.entry.model, s, work, cached_before, owner_full ? wait : 0);
    const double unloaded = estimate_ns(st.entry.model, s, work, cached_before);
    if (cached_before || !ships_code(s)) {
        auto& recent = s == Strategy::get ? rec.recent_gets : rec.recent;
        const auto now = Clock::now();
        if (unloaded > 0) recent.push_back({now, actual_ns / unloaded, actual_ns - unloaded});
        if (recent.size() > kLateKept) recent.pop_front();
        update_lateness(rec, now);
    }
    if (predicted > 0 && !rested) rec.ratio.add(actual_ns / predicted); // the agent's record, not the client's rest
    if (owner_full && s != Strategy::get) rec.excess_ns.add(std::max(0.0, actual_ns - unloaded));
    // Loaded: the owner reported a full house, or its queue is inferred from late runs
    // (update_lateness); or rested. Such a run does not teach the model, which is the unloaded agent's
    // (the queue is added apart): learnt, a background load's runs (8x a GET over TCP beside
    // a busy worker) refit it, and the runs after the load ended were planned from it
    // (bench/results/planner_learn_ab_20261202.txt).
    const bool loaded = owner_full || wait > 0 || rested;
    // Judged every 8 runs: re-judged on every one, a median near slow_factor would raise the
    // flag (and its warning) again and again.
    if (rec.ratio.count() % 8 != 0) return learn(st, size, s, cached_before, loaded, actual_ns, unloaded);
    const bool slow = rec.ratio.count() >= options.slow_window && rec.ratio.p50() >= options.slow_factor;
    if (slow && !rec.flagged) {
        ++stats.slow_flags;
        spdlog::warn("planner: agent {} runs {:.2f}× slower than predicted (median of its last {} runs)",
                     agents.front().info().address, rec.ratio.p50(), std::min<std::size_t>(rec.ratio.count(), 64));
    }
    rec.flagged = slow;
    learn(st, size, s, cached_before, loaded, actual_ns, unloaded);
}

/// Only unloaded (`loaded`: record()'s), cached runs teach the model, and of those only runs
/// within kLearnLimit of what it estimates (`unloaded_ns`).
void Planner::Impl::learn(OpState& st, std::uint64_t size, Strategy s, bool cached_before, bool loaded, double actual_ns,
                          double unloaded_ns) {
    if (loaded || (ships_code(s) && !cached_before)) return;
    if (unloaded_ns > 0 && actual_ns > kLearnLimit * unloaded_ns) return;
    push_sample(st.samples[index_of(s)], {size, actual_ns});
    if (options.refit_every == 0 || ++st.runs_since_refit < options.refit_every) return;
    st.runs_since_refit = 0;
    for (auto strategy : st.strategies) {
        const auto& samples = st.samples[index_of(strategy)];
        if (samples.size() >= 2) st.entry.model.fits[index_of(strategy)] = fit(*st.op, st.entry.model.link, strategy, samples);
    }
    recompute(st);
    keep(st, false);
    ++stats.refits;
}

/// After a run: whether the owner's latest remote runs (at least kLateRuns within
/// kLateHorizon × load_fresh) took slow_factor × their prediction or more and that many times
/// more than its latest GETs took over theirs (a slow link or a model error makes both late; a
/// queue, the remote runs only), or kLearnLimit × (slow_factor × where that is more) whatever
/// the GETs took. If so, what they took beyond it (the median) counts as a queue for `hold`
/// after the newest late one (AgentRecord::hold): load_fresh at first; when the first remote run
/// after a hold ran out (a retry: pushed back to GET, the planner tries shipping again) is late
/// too, twice as long, up to kLateHorizon × load_fresh; a retry on time ends the lateness at
/// once. Only the newest count, so without retries two runs on time end it too.
void Planner::Impl::update_lateness(AgentRecord& rec, Clock::time_point now) const {
    const bool was_late = rec.late_ns > 0;
    const auto was_until = rec.late_until;
    rec.late_ns = 0;
    rec.get_late = 1;
    const auto horizon = options.load_fresh * kLateHorizon;
    // record() keeps at most kLateKept of each: fixed arrays, no allocation after every run.
    std::array<double, kLateKept> ratios{}, excess{}, get_ratios{};
    std::array<Clock::time_point, kLateKept> times{};
    std::size_t n = 0, gets = 0, newest = 0;
    for (const auto& late : rec.recent)
        if (n < kLateKept && now - late.at <= horizon) {
            ratios[n] = late.ratio;
            excess[n] = late.excess_ns;
            times[n] = late.at;
            if (times[n] > times[newest]) newest = n;
            ++n;
        }
    auto end_lateness = [&] { rec.hold = {}; };
    if (n < kLateRuns) return end_lateness();
    for (const auto& late : rec.recent_gets)
        if (gets < kLateKept && now - late.at <= horizon) get_ratios[gets++] = late.ratio;
    const double get_late = gets == 0 ? 1.0 : std::max(1.0, median_of_first(get_ratios, gets));
    // Late by kLearnLimit or more is load whatever the GETs did (a model is never that far
    // off: learn()): over TCP a loaded owner makes its GETs nearly as late as its remote runs
    // (it progresses both), and judged against them alone the queue came and went with every
    // run, so the choice flipped between the breakpoints' and GET at one point (cold busy
    // rows: native at 450-545 us chosen two runs of three where GET took 50;
    // bench/results/planner_late_gate_20261202.txt). choose() then weighs GET by its own
    // lateness against the remote run and its wait, both as measured.
    const auto is_late = [&](double ratio) {
        return ratio >= options.slow_factor * get_late || ratio >= std::max(kLearnLimit, options.slow_factor);
    };
    const auto newest_at = times[newest];
    const bool newest_late = is_late(ratios[newest]);
    // A retry: a remote run not judged before, made after the last hold had run out.
    const bool retry = was_late && newest_at != rec.judged_newest && newest_at > was_until;
    rec.judged_newest = newest_at;
    if (retry && !newest_late) return end_lateness();
    Clock::time_point last_late{}; // the newest late run (one on time, not yet enough to end it, does not extend it)
    for (std::size_t i = 0; i < n; ++i)
        if (is_late(ratios[i])) last_late = std::max(last_late, times[i]);
    const double late = median_of_first(ratios, n); // (reorders ratios)
    if (!is_late(late)) return end_lateness();
    rec.late_ns = std::max(0.0, median_of_first(excess, n));
    // A GET the owner serves itself (over TCP UCX emulates it in software on the target)
    // waits for the loaded owner too, less than a remote run: fetching pays that per GET.
    rec.get_late = get_late;
    const Clock::duration fresh = options.load_fresh;
    if (retry) rec.hold = std::min<Clock::duration>(2 * std::max(rec.hold, fresh), horizon);
    rec.late_until = last_late + std::max(rec.hold, fresh);
}

void Planner::Impl::push_sample(std::vector<Sample>& v, Sample s) {
    v.push_back(s);
    if (v.size() > kSamplesKept) v.erase(v.begin());
}

} // namespace bitship::xrdma
