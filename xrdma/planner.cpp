#include "planner.hpp"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <bitship/bundle.hpp>

#include "core/coarse_clock.hpp"
#include "planner_impl.hpp"

namespace bitship::xrdma {
namespace {

using Clock = std::chrono::steady_clock; // Planner::Impl::Clock, for Planner's own members
/// Probes of the link before kept wisdom is set aside or new wisdom made (the lowest
/// latencies kept): a change must show in every probe.
constexpr int kProbes = 4;
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

std::string Planner::Impl::agents_key() const {
    std::string key;
    for (const auto& a : agents) key += (key.empty() ? "" : ",") + a.info().address;
    return key;
}

Result<CodeHash> Planner::Impl::code_hash(const Op& op) const {
    auto view = BundleView::parse(op.kernel().bundle());
    if (!view) return tl::make_unexpected(view.error());
    auto slice = view->find_slice(agents.front().info().triple);
    if (!slice)
        return fail(Errc::no_matching_slice, fmt::format("op {}: its kernel has no slice for {}", op.name(), agents.front().info().triple));
    return view->slices[*slice].hash;
}

/// Calls ahead of a new one at the owner, by its last reply: 0 while a worker is free or
/// the report is stale.
std::uint32_t Planner::Impl::calls_ahead(const AgentLoad& reply, Clock::time_point now) const {
    if (reply.at == Clock::time_point{} || now - reply.at > options.load_fresh) return 0;
    const std::uint32_t workers = std::max<std::uint32_t>(agents.front().info().workers, 1);
    const std::uint32_t taken = std::uint32_t(reply.busy) + reply.queued;
    return taken < workers ? 0 : taken + 1 - workers;
}

/// What a remote call waits at the owner: `ahead` reported calls, each at what such waits
/// have cost, or what its recent remote runs were late by (AgentRecord::late_ns), whichever
/// is more. Lateness needs no report: an agent running kernels inline replies as its worker
/// frees, often before the next call in line is even received, so its replies show a free
/// worker. A host too loaded to run the agent promptly makes its runs late as well: then
/// fetching is right while GETs are not late too (update_lateness). A few loads: choose()
/// calls this.
double Planner::Impl::queue_wait_ns(std::uint32_t ahead, Clock::time_point now) const {
    if (owner_record == nullptr) return 0;
    const auto& rec = *owner_record;
    double reported = 0;
    if (ahead > 0 && rec.excess_ns.count() > 0) reported = static_cast<double>(ahead) * std::max(rec.excess_ns.p50(), 0.0);
    const double late = rec.late_ns > 0 && now < rec.late_until ? rec.late_ns : 0;
    return std::max(reported, late);
}

/// The owner's load as the choice weighs it, at one reading of the clock: the wait, and while
/// there is one and the owner's runs are late (update_lateness), how late its GETs are too.
OwnerLoad Planner::Impl::owner_load(const AgentLoad& reply, std::uint32_t ahead, Clock::time_point now) const {
    OwnerLoad load{queue_wait_ns(ahead, now), 1};
    if (load.wait_ns > 0 && owner_record != nullptr && owner_record->late_ns > 0 && now < owner_record->late_until)
        load.get_late = owner_record->get_late;
    load.wake_ns = wake_ns(reply, now);
    if (reaches_owner(Strategy::get)) load.get_wake_ns = load.wake_ns;
    return load;
}

/// What waking the owner adds to a call sent now: nothing while it has heard from this client
/// within the agents' spin window. Its last reply to the client (`reply`, Client::load) is stamped by
/// the coarse clock, so it counts as up to a tick later than stamped: an owner is taken to be
/// asleep only when it surely is, as far as this client knows (another client's calls may keep
/// it awake; then the planner errs towards GET). Reads steady_clock (the spin window is far
/// finer than the coarse clock's tick) unless `now` (either clock's reading: the coarse one is
/// never ahead) already says so; choose(), plan() and run() see the same.
double Planner::Impl::wake_ns(const AgentLoad& reply, Clock::time_point now) const {
    if (options.agent_spin.count() <= 0) return 0;
    const double wake = wake_cost_ns();
    if (wake <= 0) return 0;
    auto heard = owner_heard;
    if (reply.at != Clock::time_point{}) heard = std::max(heard, reply.at + std::chrono::duration_cast<Clock::duration>(coarse_tick()));
    // Past the window by `now`, the owner is surely asleep, and steady_clock (27 ns on the
    // reference VM) goes unread.
    if (now - heard > options.agent_spin) return wake;
    return Clock::now() - heard > options.agent_spin ? wake : 0;
}

OwnerLoad Planner::Impl::owner_load() const {
    // The coarse clock (4 ns where steady_clock takes 27 on the reference VM; choose() is the
    // planner's whole run-time cost): a load, stamped by it too, or a lateness window (100 ms)
    // lasts up to a tick (4 ms) longer.
    const auto now = coarse_steady_now();
    const auto reply = owner_reply();
    return owner_load(reply, calls_ahead(reply, now), now);
}

Strategy Planner::Impl::choose(const OpState& st, std::uint64_t size, OwnerLoad load, Shift* shift) const {
    const auto& bp = st.cached ? st.entry.cached : st.entry.cold;
    const Strategy by_breakpoints = bp.at(size);
    if (load.wait_ns <= 0 && load.wake_ns <= 0) return by_breakpoints;
    // Asleep, no queue, cached code: a lookup too, where the asleep breakpoints were worked out
    // for this wake-up (a later probe may have moved it). Adding the same wake-up to every
    // remote strategy keeps their order: what moves, moves to GET.
    if (load.wait_ns <= 0 && st.cached && !st.asleep.empty() && load.wake_ns == st.asleep_wake_ns) {
        const Strategy s = st.asleep.at(size);
        if (s != by_breakpoints && shift != nullptr) *shift = Shift::asleep;
        return s;
    }
    return loaded_choice(st.entry.model, st.op->work(size), st.cached, st.strategies, by_breakpoints, load, shift);
}

void Planner::Impl::recompute(OpState& st) {
    const auto& b = st.bounds;
    st.entry.cached = Breakpoints::compute(st.entry.model, *st.op, b.min_size, b.max_size, true, st.strategies);
    st.entry.cold = Breakpoints::compute(st.entry.model, *st.op, b.min_size, b.max_size, false, st.strategies);
    recompute_asleep(st);
}

/// The cached breakpoints with the wake-up (as wake_ns() would give it) in every strategy that
/// reaches the owner; none where the owner is never taken to be asleep.
void Planner::Impl::recompute_asleep(OpState& st) {
    st.asleep = {};
    st.asleep_wake_ns = wake_cost_ns();
    if (options.agent_spin.count() <= 0 || st.asleep_wake_ns <= 0) return;
    OpModel woken = st.entry.model;
    for (auto s : st.strategies)
        if (reaches_owner(s)) woken.fits[index_of(s)].fixed_ns += st.asleep_wake_ns;
    st.asleep = Breakpoints::compute(woken, *st.op, st.bounds.min_size, st.bounds.max_size, true, st.strategies);
}

/// Puts the op's entry in the wisdom, and writes the file when `now` (a calibration) or when
/// the last write is kWisdomFlush old; else the planner's end writes it. A refit moves
/// crossovers by tens of percent from one to the next on noisy runs, so "only when a
/// breakpoint moves" would still write after nearly every one.
void Planner::Impl::keep(const OpState& st, bool now) {
    if (!wisdom) return;
    wisdom->put(st.key, st.entry);
    wisdom_dirty = true;
    if (now || Clock::now() - wisdom_saved >= kWisdomFlush) save_wisdom();
}

void Planner::Impl::save_wisdom() {
    wisdom_dirty = false;
    wisdom_saved = Clock::now();
    if (auto saved = wisdom->save(); !saved) spdlog::warn("planner: {}", saved.error().describe());
}

Planner::Impl::~Impl() {
    if (!wisdom || !wisdom_dirty) return;
    try {
        save_wisdom();
    } catch (const std::exception& e) { // a destructor must not throw: the refits are lost, said so
        spdlog::warn("planner: the wisdom's last refits were not written: {}", e.what());
    }
}

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
        im.recompute_asleep(st);
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
    return impl_->choose(*st, size, impl_->owner_load());
}

Result<Plan> Planner::plan(const Op& op, std::uint64_t size) const {
    const auto& im = *impl_;
    const auto* st = im.find(op);
    if (st == nullptr) return fail(Errc::invalid_argument, fmt::format("op {} was not added to the planner", op.name()));
    Plan p;
    p.cached = st->cached;
    const OwnerLoad load = im.owner_load(); // one reading, for the choice and its estimates
    p.queue_wait_ns = load.wait_ns;
    p.wake_ns = load.wake_ns;
    Shift shift = Shift::none;
    p.choice = im.choose(*st, size, load, &shift);
    const auto work = op.work(size);
    for (auto s : st->strategies) {
        auto& e = p.estimates.emplace_back(explain(st->entry.model, s, work, st->cached, p.queue_wait_ns));
        if (s == Strategy::get && load.get_late > 1) {
            e.ns *= load.get_late;
            e.terms = fmt::format("({}) × {:.2g} late at the loaded owner", e.terms, load.get_late);
        }
        if (const double wake = s == Strategy::get ? load.get_wake_ns : load.wake_ns; wake > 0) {
            e.ns += wake;
            e.terms += fmt::format(" + waking the owner {}", format_ns(wake));
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
    if (shift == Shift::pushed_back) p.reason += "; the owner's queue pushes the work back";
    if (shift == Shift::late_gets) p.reason += "; the loaded owner's GETs are late too: its queue costs less";
    if (shift == Shift::asleep) p.reason += "; the owner is asleep (idle past its spin window): fetching costs less than waking it";
    if (p.breakpoint) p.reason += fmt::format("; breakpoint {} {}", op.size_name(), *p.breakpoint);
    return p;
}

Result<Bytes> Planner::run(Op& op, std::uint64_t size, Strategy* chosen) {
    auto& im = *impl_;
    auto* st = im.find(op);
    if (st == nullptr) return fail(Errc::invalid_argument, fmt::format("op {} was not added to the planner", op.name()));
    // The owner's load is read once, for the choice and for what the run teaches.
    const auto now = Clock::now();
    const auto reply = im.owner_reply();
    const auto ahead = im.calls_ahead(reply, now);
    const OwnerLoad load = im.owner_load(reply, ahead, now);
    Shift shift = Shift::none;
    const Strategy choice = im.choose(*st, size, load, &shift);
    auto r = im.run_recorded(*st, size, choice, ahead, load.wait_ns, choice == Strategy::get ? load.get_wake_ns : load.wake_ns);
    if (!r) return tl::make_unexpected(r.error());
    ++im.stats.chosen[index_of(choice)];
    if (shift == Shift::pushed_back) ++im.stats.pushed_back;
    if (shift == Shift::late_gets) ++im.stats.past_late_gets;
    if (shift == Shift::asleep) ++im.stats.let_sleep;
    if (chosen != nullptr) *chosen = choice;
    return std::move(r->first);
}

Result<std::pair<Bytes, std::chrono::nanoseconds>> Planner::run_as(Op& op, std::uint64_t size, Strategy strategy) {
    auto& im = *impl_;
    auto* st = im.find(op);
    if (st == nullptr) return fail(Errc::invalid_argument, fmt::format("op {} was not added to the planner", op.name()));
    const auto now = Clock::now();
    const auto reply = im.owner_reply();
    const auto ahead = im.calls_ahead(reply, now);
    const double wake = im.reaches_owner(strategy) ? im.wake_ns(reply, now) : 0;
    return im.run_recorded(*st, size, strategy, ahead, im.queue_wait_ns(ahead, now), wake);
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
