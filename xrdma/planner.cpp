#include "planner.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <deque>
#include <functional>
#include <thread>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <bitship/bundle.hpp>

#include "core/coarse_clock.hpp"

namespace bitship::xrdma {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::size_t kSamplesKept = 64;
/// A strategy whose run took longer than this stops going to larger sizes in calibration (the
/// fit extrapolates).
constexpr auto kCalibrationRunLimit = std::chrono::milliseconds(400);
/// How long an agent polls before it sleeps (ClientOptions::spin's default, which xagent's
/// follows): a GET over mapped memory this long may leave the agents asleep.
constexpr auto kAgentSpin = std::chrono::microseconds(200);
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
constexpr int kProbes = 4;
/// Remote runs within load_fresh needed before their lateness counts as a queue, and the runs
/// kept: only the newest count, so a queue that has gone is forgotten after two runs on time
/// (kept twice as many, an upper median of six let three late runs from a load that had ended
/// push the next calls back for the whole load_fresh window).
constexpr std::size_t kLateRuns = 3;
constexpr std::size_t kLateKept = kLateRuns;

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0 : v[v.size() / 2];
}

/// median() of v[0, n), in place (it reorders them): no allocation on a run's path.
template <std::size_t N>
double median_of_first(std::array<double, N>& v, std::size_t n) {
    if (n == 0) return 0;
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(n / 2), v.begin() + static_cast<std::ptrdiff_t>(n));
    return v[n / 2];
}

/// Refitted wisdom goes to the file at most this often (and when the planner goes): writing it
/// costs 0.1-0.3 ms, which after every refit (every 64 runs) cost each run a few µs on average,
/// more than the op itself over mapped memory.
constexpr auto kWisdomFlush = std::chrono::seconds(5);
} // namespace

double Plan::estimate_of(Strategy s) const noexcept {
    for (const auto& e : estimates)
        if (e.strategy == s) return e.ns;
    return 0;
}

struct Planner::Impl {
    struct OpState {
        Op* op = nullptr;
        std::string key;
        std::string label;
        Boundaries bounds;
        std::vector<Strategy> strategies; ///< the planner's that the op offers
        WisdomEntry entry;
        bool cached = false;
        std::array<std::vector<Sample>, kStrategies> samples; // calibration and real runs, newest last
        unsigned runs_since_refit = 0;
    };
    struct AgentRecord {
        RunningFigure ratio;     ///< actual ÷ predicted
        RunningFigure excess_ns; ///< actual − predicted, for runs sent while it reported a full house
        /// The latest runs (remote ones with cached code, and GETs): when, actual ÷ predicted,
        /// actual − predicted. A queue the agent cannot report (calls waiting in the transport
        /// while its one worker runs a long kernel) shows as remote runs late where GETs are not.
        struct Late {
            Clock::time_point at;
            double ratio, excess_ns;
        };
        std::deque<Late> recent, recent_gets;
        double late_ns = 0;            ///< what the recent remote runs say a call waits (update_lateness)
        double get_late = 1;           ///< meanwhile, the recent GETs' actual ÷ predicted (≥ 1)
        Clock::time_point late_until;  ///< until when both hold
        bool flagged = false;
    };

    Client* client = nullptr;
    std::vector<Target> agents;
    PlannerOptions options;
    std::vector<LinkFigures> links; ///< by agent, as probed (the lowest latencies of every probe)
    LinkFigures link;               ///< what the models start from: the agents' mean
    int probes = 1;
    std::vector<RemoteRegion> probe_regions; ///< by agent
    std::optional<Wisdom> wisdom;
    bool wisdom_dirty = false;         ///< entries put since the file was last written
    Clock::time_point wisdom_saved{};  ///< when it was
    std::map<const Op*, OpState> ops;
    std::map<std::uint64_t, AgentRecord> records; // by Target::id()
    AgentRecord* owner_record = nullptr;           // records' entry for agents.front(), once it has one
    PlannerStats stats;

    [[nodiscard]] const OpState* find(const Op& op) const {
        auto it = ops.find(&op);
        return it == ops.end() ? nullptr : &it->second;
    }
    OpState* find(const Op& op) {
        auto it = ops.find(&op);
        return it == ops.end() ? nullptr : &it->second;
    }

    [[nodiscard]] std::string agents_key() const {
        std::string key;
        for (const auto& a : agents) key += (key.empty() ? "" : ",") + a.info().address;
        return key;
    }

    Result<CodeHash> code_hash(const Op& op) const {
        auto view = BundleView::parse(op.kernel().bundle());
        if (!view) return tl::make_unexpected(view.error());
        auto slice = view->find_slice(agents.front().info().triple);
        if (!slice)
            return fail(Errc::no_matching_slice, fmt::format("op {}: its kernel has no slice for {}", op.name(), agents.front().info().triple));
        return view->slices[*slice].hash;
    }

    /// Calls ahead of a new one at the owner, by its last reply: 0 while a worker is free or
    /// the report is stale.
    [[nodiscard]] std::uint32_t calls_ahead(Clock::time_point now = Clock::now()) const {
        const Target& owner = agents.front();
        const auto load = client->load(owner);
        if (load.at == Clock::time_point{} || now - load.at > options.load_fresh) return 0;
        const std::uint32_t workers = std::max<std::uint32_t>(owner.info().workers, 1);
        const std::uint32_t taken = std::uint32_t(load.busy) + load.queued;
        return taken < workers ? 0 : taken + 1 - workers;
    }

    /// What a remote call waits at the owner: `ahead` reported calls, each at what such waits
    /// have cost, or what its recent remote runs were late by (AgentRecord::late_ns), whichever
    /// is more. Lateness needs no report: an agent running kernels inline replies as its worker
    /// frees, often before the next call in line is even received, so its replies show a free
    /// worker. A host too loaded to run the agent promptly makes its runs late as well: then
    /// fetching is right while GETs are not late too (update_lateness). A few loads: choose()
    /// calls this.
    [[nodiscard]] double queue_wait_ns(std::uint32_t ahead, Clock::time_point now) const {
        if (owner_record == nullptr) return 0;
        const auto& rec = *owner_record;
        double reported = 0;
        if (ahead > 0 && rec.excess_ns.count() > 0) reported = static_cast<double>(ahead) * std::max(rec.excess_ns.p50(), 0.0);
        const double late = rec.late_ns > 0 && now < rec.late_until ? rec.late_ns : 0;
        return std::max(reported, late);
    }

    /// After a run: whether the owner's latest remote runs (at least kLateRuns within
    /// load_fresh) took slow_factor × their prediction or more, and that many times more than
    /// its latest GETs took over theirs (a slow link or a model error makes both late; a queue,
    /// the remote runs only). If so, what they took beyond it (the median) counts as a queue
    /// while kLateRuns of them are still in the window.
    void update_lateness(AgentRecord& rec, Clock::time_point now) const {
        rec.late_ns = 0;
        rec.get_late = 1;
        // record() keeps at most kLateKept of each: fixed arrays, no allocation after every run.
        std::array<double, kLateKept> ratios{}, excess{}, get_ratios{};
        std::array<Clock::time_point, kLateKept> times{};
        std::size_t n = 0, gets = 0;
        for (const auto& late : rec.recent)
            if (n < kLateKept && now - late.at <= options.load_fresh) {
                ratios[n] = late.ratio;
                excess[n] = late.excess_ns;
                times[n] = late.at;
                ++n;
            }
        if (n < kLateRuns) return;
        for (const auto& late : rec.recent_gets)
            if (gets < kLateKept && now - late.at <= options.load_fresh) get_ratios[gets++] = late.ratio;
        const double get_late = gets == 0 ? 1.0 : std::max(1.0, median_of_first(get_ratios, gets));
        if (median_of_first(ratios, n) < options.slow_factor * get_late) return;
        rec.late_ns = std::max(0.0, median_of_first(excess, n));
        // A GET the owner serves itself (over TCP UCX emulates it in software on the target)
        // waits for the loaded owner too, less than a remote run: fetching pays that per GET.
        rec.get_late = get_late;
        // Until fewer than kLateRuns of them are left in the window: the kLateRuns-th newest
        // leaves it then.
        std::nth_element(times.begin(), times.begin() + (kLateRuns - 1), times.begin() + static_cast<std::ptrdiff_t>(n),
                         std::greater<>());
        rec.late_until = times[kLateRuns - 1] + options.load_fresh;
    }
    [[nodiscard]] double queue_wait_ns() const {
        if (owner_record == nullptr) return 0; // nothing learnt of the owner yet
        // The coarse clock (4 ns where steady_clock takes 27 on the reference VM; choose() is the
        // planner's whole run-time cost): a load, stamped by it too, or a lateness window (100 ms)
        // lasts up to a tick (4 ms) longer.
        const auto now = coarse_steady_now();
        return queue_wait_ns(calls_ahead(now), now);
    }
    /// While the owner's runs are late (a queue): how late its GETs are too, else 1.
    [[nodiscard]] double get_late_factor(Clock::time_point now = coarse_steady_now()) const {
        if (owner_record == nullptr) return 1;
        const auto& rec = *owner_record;
        return rec.late_ns > 0 && now < rec.late_until ? rec.get_late : 1;
    }

    [[nodiscard]] Strategy choose(const OpState& st, std::uint64_t size, double wait, bool* pushed = nullptr) const {
        const auto& bp = st.cached ? st.entry.cached : st.entry.cold;
        Strategy choice = bp.at(size);
        if (wait > 0 && choice != Strategy::get && std::find(st.strategies.begin(), st.strategies.end(), Strategy::get) != st.strategies.end()) {
            const auto work = st.op->work(size);
            if (get_late_factor() * estimate_ns(st.entry.model, Strategy::get, work, st.cached) <
                estimate_ns(st.entry.model, choice, work, st.cached, wait)) {
                choice = Strategy::get;
                if (pushed != nullptr) *pushed = true;
            }
        }
        return choice;
    }

    void recompute(OpState& st) {
        const auto& b = st.bounds;
        st.entry.cached = Breakpoints::compute(st.entry.model, *st.op, b.min_size, b.max_size, true, st.strategies);
        st.entry.cold = Breakpoints::compute(st.entry.model, *st.op, b.min_size, b.max_size, false, st.strategies);
    }

    /// Puts the op's entry in the wisdom, and writes the file when `now` (a calibration) or when
    /// the last write is kWisdomFlush old; else the planner's end writes it. A refit moves
    /// crossovers by tens of percent from one to the next on noisy runs, so "only when a
    /// breakpoint moves" would still write after nearly every one.
    void keep(const OpState& st, bool now = true) {
        if (!wisdom) return;
        wisdom->put(st.key, st.entry);
        wisdom_dirty = true;
        if (now || Clock::now() - wisdom_saved >= kWisdomFlush) save_wisdom();
    }
    void save_wisdom() {
        wisdom_dirty = false;
        wisdom_saved = Clock::now();
        if (auto saved = wisdom->save(); !saved) spdlog::warn("planner: {}", saved.error().describe());
    }
    ~Impl() {
        if (!wisdom || !wisdom_dirty) return;
        try {
            save_wisdom();
        } catch (const std::exception& e) { // a destructor must not throw: the refits are lost, said so
            spdlog::warn("planner: the wisdom's last refits were not written: {}", e.what());
        }
    }

    static void push_sample(std::vector<Sample>& v, Sample s) {
        v.push_back(s);
        if (v.size() > kSamplesKept) v.erase(v.begin());
    }

    /// Probes every agent's link (one at a time: probes running at once would measure each
    /// other). The first probe's failure is the error; later ones keep what was measured.
    Result<void> probe_all() {
        const bool first = links.empty();
        if (!first) ++probes;
        for (std::size_t i = 0; i < agents.size(); ++i) {
            auto figures = probe_link(*client, agents[i], probe_regions[i], options.probe_budget);
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
            l.get_ns_per_byte = std::min(l.get_ns_per_byte, figures->get_ns_per_byte);
        }
        link = combined(links);
        link.lanes = lanes_of(agents);
        return {};
    }

    /// How many agents can compute at once (LinkFigures::lanes): on each host, as many as it
    /// has cores (WELCOME's); 0 when that is every agent.
    static std::uint32_t lanes_of(const std::vector<Target>& agents) {
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
    /// on all of them at once). Mapped only when every agent is.
    static LinkFigures combined(const std::vector<LinkFigures>& all) {
        LinkFigures out = all.front();
        if (all.size() == 1) return out;
        out.rtt_ns = out.get_ns = out.get_ns_per_byte = 0;
        for (const auto& l : all) {
            out.rtt_ns += l.rtt_ns / static_cast<double>(all.size());
            out.get_ns += l.get_ns / static_cast<double>(all.size());
            out.get_ns_per_byte += l.get_ns_per_byte / static_cast<double>(all.size());
            out.mapped = out.mapped && l.mapped;
        }
        return out;
    }

    /// One run by `s`, timed; the answer checked against the op's own when `check`.
    Result<std::pair<Bytes, std::chrono::nanoseconds>> timed(Op& op, std::uint64_t size, Strategy s, bool check) {
        const auto t0 = Clock::now();
        auto answer = op.start(s, size).get();
        const auto took = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0);
        if (!answer) return tl::make_unexpected(answer.error());
        if (check && *answer != op.expected(size))
            return fail(Errc::internal, fmt::format("op {} by {} at {} {}: the answer differs from the reference", op.name(),
                                                    to_string(s), op.size_name(), size));
        return std::pair{std::move(*answer), took};
    }

    /// The agents' compile counters now: await_tier_up(mark) waits for what comes after.
    std::vector<std::uint64_t> compile_marks() {
        std::vector<std::uint64_t> marks;
        for (const auto& a : agents) marks.push_back(counters(a)["compiles"]);
        return marks;
    }
    /// An agent's counters by name (empty when it does not answer).
    std::map<std::string, std::uint64_t> counters(const Target& a) {
        auto all = client->agent_stats(a);
        if (!all) return {};
        return {all->begin(), all->end()};
    }
    /// After a compile since `marks`: waits out the agents' background tier-1 compiles, so they
    /// do not compete with the runs timed next: until every agent reports none pending
    /// (tier_ups_pending), at most kTierUpWait. An agent too old to report it gets
    /// kTierUpFactor times its fast compile's own time, at least kTierUpFloor.
    void await_tier_up(const std::vector<std::uint64_t>& marks) {
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

    Result<void> evict_code(const Op& op) {
        auto hash = code_hash(op);
        if (!hash) return tl::make_unexpected(hash.error());
        Bytes payload(hash->size());
        std::memcpy(payload.data(), hash->data(), hash->size());
        for (const auto& a : agents)
            if (auto r = client->control(a, kCacheEvictType, payload); !r) return tl::make_unexpected(r.error());
        return {};
    }

    /// The cold walk of calibrate()'s step 4: model.cold_next_ns from the smallest size of
    /// `sizes` whose walk reaches every agent (left 0, meaning cold_ns, when none does or the
    /// first cold run was already such a walk).
    Result<void> calibrate_cold_walk(OpState& st, const std::vector<std::uint64_t>& sizes, Strategy shipped, bool first_was_one) {
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
    Result<void> time_across_range(OpState& st, const std::vector<std::uint64_t>& sizes) {
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
                    else if (st.entry.model.link.mapped && run->second >= kAgentSpin) agents_may_sleep = true;
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

    /// Every strategy at sizes across the range; the fits; the first call's extra cost.
    Result<void> calibrate(OpState& st) {
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

    /// One run by `s`, timed, and what it teaches: `ahead` and `wait` are the owner's load as
    /// it was just before (calls_ahead, queue_wait_ns).
    Result<std::pair<Bytes, std::chrono::nanoseconds>> run_recorded(OpState& st, std::uint64_t size, Strategy s, std::uint32_t ahead,
                                                                   double wait) {
        const bool cached_before = st.cached;
        auto r = timed(*st.op, size, s, false);
        if (!r) return r;
        if (ships_code(s)) st.cached = true;
        ++stats.runs;
        record(st, size, s, cached_before, wait, ahead > 0, static_cast<double>(r->second.count()));
        return r;
    }

    void record(OpState& st, std::uint64_t size, Strategy s, bool cached_before, double wait, bool owner_full, double actual_ns) {
        const auto work = st.op->work(size);
        // Against what the agent's own report predicted: a wait the planner inferred from late
        // runs (update_lateness) must not hide an agent that stays slow.
        const double predicted = estimate_ns(st.entry.model, s, work, cached_before, owner_full ? wait : 0);
        auto& rec = records[agents.front().id()];
        owner_record = &rec;
        if (cached_before || !ships_code(s)) {
            auto& recent = s == Strategy::get ? rec.recent_gets : rec.recent;
            const double unloaded = estimate_ns(st.entry.model, s, work, cached_before);
            const auto now = Clock::now();
            if (unloaded > 0) recent.push_back({now, actual_ns / unloaded, actual_ns - unloaded});
            if (recent.size() > kLateKept) recent.pop_front();
            update_lateness(rec, now);
        }
        if (predicted > 0) rec.ratio.add(actual_ns / predicted);
        if (owner_full && s != Strategy::get) rec.excess_ns.add(std::max(0.0, actual_ns - estimate_ns(st.entry.model, s, work, cached_before)));
        // Loaded: the owner reported a full house, or its queue is inferred from late runs
        // (update_lateness). Such a run does not teach the model, which is the unloaded agent's
        // (the queue is added apart): learnt, a background load's runs (8x a GET over TCP beside
        // a busy worker) refit it, and the runs after the load ended were planned from it
        // (bench/results/planner_learn_ab_20261202.txt).
        const bool loaded = owner_full || wait > 0;
        // Looked at every 8 runs: a median costs a sort.
        if (rec.ratio.count() % 8 != 0) return learn(st, size, s, cached_before, loaded, actual_ns);
        const bool slow = rec.ratio.count() >= options.slow_window && rec.ratio.p50() >= options.slow_factor;
        if (slow && !rec.flagged) ++stats.slow_flags;
        if (slow && !rec.flagged)
            spdlog::warn("planner: agent {} runs {:.2f}× slower than predicted (median of its last {} runs)",
                         agents.front().info().address, rec.ratio.p50(), std::min<std::size_t>(rec.ratio.count(), 64));
        rec.flagged = slow;
        learn(st, size, s, cached_before, loaded, actual_ns);
    }

    /// Only unloaded (`loaded`: record()'s), cached runs teach the model.
    void learn(OpState& st, std::uint64_t size, Strategy s, bool cached_before, bool loaded, double actual_ns) {
        if (loaded || (ships_code(s) && !cached_before)) return;
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

};

Planner::Planner(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Planner::Planner(Planner&&) noexcept = default;
Planner& Planner::operator=(Planner&&) noexcept = default;
Planner::~Planner() = default;

Result<Planner> Planner::open(Client& client, std::vector<Target> agents, PlannerOptions options) {
    if (agents.empty()) return fail(Errc::invalid_argument, "a planner needs at least one agent");
    if (options.strategies.empty()) return fail(Errc::invalid_argument, "a planner needs at least one strategy to choose from");
    if (!(options.drift > 0)) return fail(Errc::invalid_argument, "the planner's drift fraction must be positive");
    auto impl = std::make_unique<Impl>();
    impl->client = &client;
    impl->agents = std::move(agents);
    impl->options = std::move(options);
    for (const auto& a : impl->agents) {
        auto region = client.region(a, impl->options.probe_region);
        if (!region) return tl::make_unexpected(region.error());
        impl->probe_regions.push_back(std::move(*region));
    }
    if (auto probed = impl->probe_all(); !probed) return tl::make_unexpected(probed.error());
    if (!impl->options.wisdom.empty()) {
        auto w = Wisdom::load(impl->options.wisdom);
        if (!w) return tl::make_unexpected(w.error());
        if (w->skipped() > 0) spdlog::warn("planner: {} lines of {} are not wisdom; ignored", w->skipped(), impl->options.wisdom.string());
        impl->wisdom = std::move(*w);
    }
    return Planner(std::move(impl));
}

Result<void> Planner::add(Op& op, Boundaries boundaries, std::string label) {
    auto& im = *impl_;
    if (boundaries.min_size == 0 || boundaries.max_size < boundaries.min_size)
        return fail(Errc::invalid_argument, fmt::format("op {}: boundaries [{}, {}] are not a size range", op.name(),
                                                        boundaries.min_size, boundaries.max_size));
    if (boundaries.max_size > op.max_size())
        return fail(Errc::out_of_bounds, fmt::format("op {}: {} {} is more than its data allows ({})", op.name(), op.size_name(),
                                                     boundaries.max_size, op.max_size()));
    auto hash = im.code_hash(op);
    if (!hash) return tl::make_unexpected(hash.error());
    Impl::OpState st;
    st.op = &op;
    st.label = label.empty() ? std::string(op.name()) : std::move(label);
    st.bounds = boundaries;
    for (auto s : im.options.strategies)
        if (op.offers(s)) st.strategies.push_back(s);
    if (st.strategies.empty())
        return fail(Errc::invalid_argument, fmt::format("op {} offers none of the planner's strategies", op.name()));
    st.key = fmt::format("{}@{}#{}", st.label, im.agents_key(), to_hex(*hash, 16));
    std::replace(st.key.begin(), st.key.end(), ' ', '_');
    const WisdomEntry* kept = im.wisdom ? im.wisdom->find(st.key) : nullptr;
    // Kept wisdom serves when it covers this range and fits every strategy planned over now.
    const bool same_range = kept != nullptr && kept->cached.lo() == boundaries.min_size && kept->cached.hi() == boundaries.max_size &&
                            std::all_of(st.strategies.begin(), st.strategies.end(),
                                        [&](Strategy s) { return kept->model.fits[index_of(s)].fitted; });
    // Before kept wisdom is set aside, or new wisdom made, the link is probed again
    // (kProbes in all, the lowest latencies kept): a change must show in every probe.
    const bool usable = kept != nullptr && same_range;
    while (im.probes < kProbes && !(usable && link_matches(kept->probed, im.link, im.options.drift))) (void)im.probe_all();
    if (kept != nullptr && same_range && link_matches(kept->probed, im.link, im.options.drift)) {
        st.entry = *kept;
        st.entry.probed.lanes = st.entry.model.link.lanes = im.link.lanes; // not kept: today's agents'
        ++im.stats.wisdom_hits;
        im.ops[&op] = std::move(st);
        return {};
    }
    if (kept != nullptr && same_range) {
        ++im.stats.drifted;
        spdlog::info("planner: {}: the link changed (rtt {} → {}, get {} → {}); measuring again", st.label,
                     format_ns(kept->probed.rtt_ns), format_ns(im.link.rtt_ns), format_ns(kept->probed.get_ns),
                     format_ns(im.link.get_ns));
    }
    st.entry.probed = im.link;
    st.entry.model.link = im.link;
    if (auto c = im.calibrate(st); !c) return c;
    im.recompute(st);
    im.keep(st);
    im.ops[&op] = std::move(st);
    return {};
}

Strategy Planner::choose(const Op& op, std::uint64_t size) const {
    const auto* st = impl_->find(op);
    if (st == nullptr) return Strategy::get;
    return impl_->choose(*st, size, impl_->queue_wait_ns());
}

Result<Plan> Planner::plan(const Op& op, std::uint64_t size) const {
    const auto& im = *impl_;
    const auto* st = im.find(op);
    if (st == nullptr) return fail(Errc::invalid_argument, fmt::format("op {} was not added to the planner", op.name()));
    Plan p;
    p.cached = st->cached;
    p.queue_wait_ns = im.queue_wait_ns();
    const double get_late = p.queue_wait_ns > 0 ? im.get_late_factor() : 1;
    bool pushed = false;
    p.choice = im.choose(*st, size, p.queue_wait_ns, &pushed);
    const auto work = op.work(size);
    for (auto s : st->strategies) {
        p.estimates.push_back(explain(st->entry.model, s, work, st->cached, p.queue_wait_ns));
        if (s == Strategy::get && get_late > 1) {
            p.estimates.back().ns *= get_late;
            p.estimates.back().terms = fmt::format("({}) × {:.2g} late at the loaded owner", p.estimates.back().terms, get_late);
        }
    }
    const auto& bp = st->cached ? st->entry.cached : st->entry.cold;
    p.breakpoint = bp.nearest(size);
    // The choice first, then the others cheapest first.
    auto others = p.estimates;
    std::sort(others.begin(), others.end(), [](const Estimate& a, const Estimate& b) { return a.ns < b.ns; });
    const auto chosen = std::find_if(others.begin(), others.end(), [&](const Estimate& e) { return e.strategy == p.choice; });
    p.reason = fmt::format("{}: {} est ({})", to_string(p.choice), format_ns(chosen->ns), chosen->terms);
    for (const auto& e : others)
        if (e.strategy != p.choice) p.reason += fmt::format(" vs {}: {} est ({})", to_string(e.strategy), format_ns(e.ns), e.terms);
    if (pushed) p.reason += "; the owner's queue pushes the work back";
    if (p.breakpoint) p.reason += fmt::format("; breakpoint {} {}", op.size_name(), *p.breakpoint);
    return p;
}

Result<Bytes> Planner::run(Op& op, std::uint64_t size, Strategy* chosen) {
    auto& im = *impl_;
    auto* st = im.find(op);
    if (st == nullptr) return fail(Errc::invalid_argument, fmt::format("op {} was not added to the planner", op.name()));
    // The owner's load is read once, for the choice and for what the run teaches.
    const auto now = Clock::now();
    const auto ahead = im.calls_ahead(now);
    const double wait = im.queue_wait_ns(ahead, now);
    bool pushed = false;
    const Strategy choice = im.choose(*st, size, wait, &pushed);
    auto r = im.run_recorded(*st, size, choice, ahead, wait);
    if (!r) return tl::make_unexpected(r.error());
    ++im.stats.chosen[index_of(choice)];
    if (pushed) ++im.stats.pushed_back;
    if (chosen != nullptr) *chosen = choice;
    return std::move(r->first);
}

Result<std::pair<Bytes, std::chrono::nanoseconds>> Planner::run_as(Op& op, std::uint64_t size, Strategy strategy) {
    auto& im = *impl_;
    auto* st = im.find(op);
    if (st == nullptr) return fail(Errc::invalid_argument, fmt::format("op {} was not added to the planner", op.name()));
    const auto now = Clock::now();
    const auto ahead = im.calls_ahead(now);
    return im.run_recorded(*st, size, strategy, ahead, im.queue_wait_ns(ahead, now));
}

void Planner::code_evicted(const Op& op) {
    if (auto* st = impl_->find(op)) st->cached = false;
}

bool Planner::code_cached(const Op& op) const {
    const auto* st = impl_->find(op);
    return st != nullptr && st->cached;
}

const LinkFigures& Planner::link() const noexcept { return impl_->link; }

const std::vector<LinkFigures>& Planner::links() const noexcept { return impl_->links; }

const WisdomEntry* Planner::entry(const Op& op) const {
    const auto* st = impl_->find(op);
    return st == nullptr ? nullptr : &st->entry;
}

std::vector<std::string> Planner::slow_agents() const {
    std::vector<std::string> out;
    for (const auto& a : impl_->agents)
        if (auto it = impl_->records.find(a.id()); it != impl_->records.end() && it->second.flagged) out.push_back(a.info().address);
    return out;
}

PlannerStats Planner::stats() const { return impl_->stats; }

} // namespace bitship::xrdma
