// The planner's pieces that need no agent: fitting the cost model to timed runs, working out
// breakpoints from it, and keeping them in the wisdom file.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include <xrdma_kernels.hpp>

#include "breakpoints.hpp"
#include "cost_model.hpp"
#include "launcher.hpp"
#include "loaded_choice.hpp"
#include "wisdom.hpp"

namespace planner_model_test_cpp {

using namespace bitship;
using namespace bitship::xrdma;

namespace {

/// A walk of `size` hops: one GET per hop, one unit per hop at the agent. Never run here.
class WalkShape final : public Op {
public:
    std::string_view name() const noexcept override { return "walk"; }
    std::string_view size_name() const noexcept override { return "depth"; }
    std::uint64_t max_size() const noexcept override { return 1u << 20; }
    const Kernel& kernel() const noexcept override { return xrdma_kernels::chase; }
    OpWork work(std::uint64_t size) const override { return {size, 16 * size, size, 0, 16, 1}; }
    Future start(Strategy, std::uint64_t) override { return {}; }
    Bytes expected(std::uint64_t) const override { return {}; }
};

/// The same walk over 4 agents: 3 hops in 4 cross to another agent.
class SpreadWalk final : public Op {
public:
    std::string_view name() const noexcept override { return "spread"; }
    std::string_view size_name() const noexcept override { return "depth"; }
    std::uint64_t max_size() const noexcept override { return 1u << 20; }
    const Kernel& kernel() const noexcept override { return xrdma_kernels::chase; }
    OpWork work(std::uint64_t size) const override { return {size, 16 * size, size, size * 3 / 4, 16, 4}; }
    bool offers(Strategy) const noexcept override { return true; }
    Future start(Strategy, std::uint64_t) override { return {}; }
    Bytes expected(std::uint64_t) const override { return {}; }
};

OpModel tcp_like() {
    OpModel m;
    m.link = {20'000, 25'000, 0.1, 0, false};
    m.fits[index_of(Strategy::get)] = {500, 0, true};
    m.fits[index_of(Strategy::native)] = {3'000, 10, true};
    m.fits[index_of(Strategy::xrdma)] = {10'000, 12, true};
    m.cold_ns = 3'000'000;
    return m;
}

} // namespace

TEST_CASE("a fit recovers the per-unit and fixed costs of timed runs beyond the link's own terms", "[unit]") {
    WalkShape op;
    const auto model = tcp_like();
    std::vector<Sample> samples;
    for (std::uint64_t size : {1, 4, 16, 64, 256, 1024})
        samples.push_back({size, estimate_ns(model, Strategy::xrdma, op.work(size), true)});
    auto f = fit(op, model.link, Strategy::xrdma, samples);
    CHECK(f.fitted);
    CHECK(f.per_unit_ns == Approx(12).epsilon(1e-6));
    CHECK(f.fixed_ns == Approx(10'000).epsilon(1e-6));
    // GET: the link's latency per hop is the whole slope; what is left is fixed.
    samples.clear();
    for (std::uint64_t size : {1, 8, 64, 512})
        samples.push_back({size, estimate_ns(model, Strategy::get, op.work(size), true)});
    f = fit(op, model.link, Strategy::get, samples);
    CHECK(f.per_unit_ns == Approx(0).margin(1e-6));
    CHECK(f.fixed_ns == Approx(500).epsilon(1e-6));
}

TEST_CASE("the agents a random walk reaches: the formula, and every agent once its shortcut applies", "[unit]") {
    CHECK(expected_agents(1, 100) == 1);
    CHECK(expected_agents(4, 0) == 1);
    CHECK(expected_agents(4, 1) == 1);
    CHECK(expected_agents(4, 4) == 3);  // 4 × (1 − 0.75⁴) = 2.73
    CHECK(expected_agents(4, 7) == 3);  // 3.47
    CHECK(expected_agents(4, 8) == 4);  // 3.60
    CHECK(expected_agents(16, 8) == 6); // 16 × (1 − (15/16)⁸) = 6.45
    // Past a·(bit_width(a) + 1) visits the shortcut answers `a`; the formula agrees.
    for (std::uint32_t a : {2u, 3u, 4u, 5u, 16u, 100u, 1000u})
        for (std::uint64_t v = 2; v < std::uint64_t{a} * 40; v += 1 + v / 64) {
            const double reached = a * (1.0 - std::pow(1.0 - 1.0 / a, static_cast<double>(v)));
            const auto formula = static_cast<std::uint32_t>(std::clamp<long long>(std::llround(reached), 1, a));
            INFO("agents " << a << ", visits " << v);
            REQUIRE(expected_agents(a, v) == formula);
        }
}

TEST_CASE("a fan-out over agents that share a host's cores costs the shares that wait their turn", "[unit]") {
    // 4000 items over 4 agents, no forwards: 1000 each.
    OpWork w{1, 8 * 4000, 4000, 0, 8, 4};
    CHECK(serial_units(w) == 1000);    // each agent on cores of its own: one share
    CHECK(serial_units(w, 0) == 1000);
    CHECK(serial_units(w, 4) == 1000);
    CHECK(serial_units(w, 8) == 1000);
    CHECK(serial_units(w, 2) == 2000); // 4 agents, 2 at once: two shares one after the other
    CHECK(serial_units(w, 3) == 2000);
    CHECK(serial_units(w, 1) == 4000);
    // A share that does not divide evenly rounds up: 4001 items, 1001 on the fullest agent.
    OpWork uneven{1, 8 * 4001, 4001, 0, 8, 4};
    CHECK(serial_units(uneven) == 1001);
    CHECK(serial_units(uneven, 3) == 2002);
    // A walk is serial whatever the lanes.
    OpWork walk{100, 1600, 100, 75, 16, 4};
    CHECK(serial_units(walk, 2) == 100);
    // The estimate follows: native's per-unit term doubles on two lanes.
    auto model = tcp_like();
    const double apart = estimate_ns(model, Strategy::native, w, true);
    model.link.lanes = 2;
    const double shared = estimate_ns(model, Strategy::native, w, true);
    CHECK(shared - apart == Approx(1000 * model.fits[index_of(Strategy::native)].per_unit_ns));
}

TEST_CASE("a GET cheaper in the runs than in the probe is fitted down, and still never costs nothing", "[unit]") {
    // A reduce's shape: its chunks' GETs all in flight at once (one dependent GET), bytes
    // growing with the size. The probe's GET took 11 µs; in the runs the GET part took 8 µs.
    class OneGet final : public Op {
    public:
        std::string_view name() const noexcept override { return "one_get"; }
        std::string_view size_name() const noexcept override { return "items"; }
        std::uint64_t max_size() const noexcept override { return 1u << 20; }
        const Kernel& kernel() const noexcept override { return xrdma_kernels::chase; }
        OpWork work(std::uint64_t size) const override { return {1, 8 * size, size, 0, 8, 1}; }
        Future start(Strategy, std::uint64_t) override { return {}; }
        Bytes expected(std::uint64_t) const override { return {}; }
    } op;
    LinkFigures link{11'000, 11'000, 0.5, 0, false};
    std::vector<Sample> samples;
    for (std::uint64_t size : {1, 16, 256, 4096}) samples.push_back({size, 8'000 + 8.0 * size * 0.5 + 0.25 * size});
    auto f = fit(op, link, Strategy::get, samples);
    REQUIRE(f.fitted);
    CHECK(f.fixed_ns == Approx(-3'000));
    CHECK(f.per_unit_ns == Approx(0.25));
    OpModel m;
    m.link = link;
    m.fits[index_of(Strategy::get)] = f;
    for (const auto& smp : samples) CHECK(estimate_ns(m, Strategy::get, op.work(smp.size), true) == Approx(smp.ns));
    // Runs that took nothing at all cannot take back more than the one GET.
    samples.assign({{1, 1}, {16, 2}, {256, 3}, {4096, 4}});
    f = fit(op, link, Strategy::get, samples);
    CHECK(f.fixed_ns >= -11'000);
}

TEST_CASE("a walk of random hops reaches the expected number of distinct agents", "[unit]") {
    CHECK(expected_agents(4, 0) == 1);
    CHECK(expected_agents(4, 1) == 1);
    CHECK(expected_agents(4, 2) == 2);  // 1.75
    CHECK(expected_agents(4, 4) == 3);  // 2.73: not all four
    CHECK(expected_agents(4, 16) == 4); // 3.96
    CHECK(expected_agents(1, 1000) == 1);
    CHECK(expected_agents(64, 1u << 20) == 64);
}

TEST_CASE("a link probed slower than the runs went never makes a strategy cost nothing", "[unit]") {
    // Probed on a loaded host: a 20 µs round trip. The short runs went in 1 µs and the long
    // ones grew 3.5 µs a hop: a line through them gives back more than the round trip.
    WalkShape op;
    const auto model = tcp_like();
    std::vector<Sample> samples{{1, 1'000}, {2, 1'100}, {256, 3'500.0 * 256}, {1024, 3'500.0 * 1024}};
    auto f = fit(op, model.link, Strategy::native, samples);
    REQUIRE(f.fitted);
    CHECK(f.per_unit_ns > 0);
    CHECK(f.fixed_ns == Approx(-20'000)); // the link's round trip given back, no more
    OpModel probed = model;
    probed.fits[index_of(Strategy::native)] = f;
    // One hop: the hop and the answer's 16 bytes, not 0.
    CHECK(estimate_ns(probed, Strategy::native, op.work(1), true) == Approx(f.per_unit_ns + 16 * 0.1));
}

TEST_CASE("reship pays a round trip here per crossing, and it wins where agent-to-agent forwards cost more", "[unit]") {
    SpreadWalk op;
    auto model = tcp_like();
    model.fits[index_of(Strategy::reship)] = model.fits[index_of(Strategy::xrdma)];
    const auto w = op.work(100);
    REQUIRE(w.forwards == 75);
    // Same fits: reship is xrdma plus 75 client round trips, and its terms say so.
    CHECK(estimate_ns(model, Strategy::reship, w, true) - estimate_ns(model, Strategy::xrdma, w, true) ==
          Approx(75 * model.link.rtt_ns));
    CHECK(explain(model, Strategy::reship, w, true).terms.find("76 × rtt") != std::string::npos);
    // Cold, both pay the code once per agent the walk reaches.
    CHECK(estimate_ns(model, Strategy::reship, w, false) - estimate_ns(model, Strategy::reship, w, true) ==
          Approx(4 * model.cold_ns));
    // Measured dearer for the agents after the first (their compiles meet the earlier agents'
    // background recompiles): the first pays cold_ns, the three others cold_next_ns each.
    auto contended = model;
    contended.cold_next_ns = 2.5 * model.cold_ns;
    CHECK(estimate_ns(contended, Strategy::xrdma, w, false) - estimate_ns(contended, Strategy::xrdma, w, true) ==
          Approx(model.cold_ns + 3 * contended.cold_next_ns));
    // A walk of one agent (no forward) pays cold_ns alone.
    const auto one = op.work(1);
    REQUIRE(one.forwards == 0);
    CHECK(estimate_ns(contended, Strategy::xrdma, one, false) - estimate_ns(contended, Strategy::xrdma, one, true) ==
          Approx(model.cold_ns));
    const std::vector<Strategy> both{Strategy::xrdma, Strategy::reship};
    auto near = Breakpoints::compute(model, op, 1, 4096, true, both);
    REQUIRE(near.segments().size() == 1);
    CHECK(near.at(1000) == Strategy::xrdma);
    // Agents far from each other (a forward costs 200 µs a hop) and near this client: come back.
    model.fits[index_of(Strategy::xrdma)].per_unit_ns = 200'000;
    auto far = Breakpoints::compute(model, op, 4, 4096, true, both);
    CHECK(far.at(4) == Strategy::reship);
    CHECK(far.at(4096) == Strategy::reship);
}

TEST_CASE("breakpoints sit where the cheapest strategy changes, cold code moving them up", "[unit]") {
    WalkShape op;
    const auto model = tcp_like();
    const std::vector<Strategy> ship_or_get{Strategy::get, Strategy::xrdma};
    auto cached = Breakpoints::compute(model, op, 1, 4096, true, ship_or_get);
    // get: 25 µs × d + 1.6 ns × d + 0.5 µs; xrdma: 20 µs + 1.6 ns + 10 µs + 12 ns × d: d = 1 is get, 2 on ship.
    REQUIRE(cached.segments().size() == 2);
    CHECK(cached.segments()[0] == Breakpoints::Segment{1, Strategy::get});
    CHECK(cached.segments()[1] == Breakpoints::Segment{2, Strategy::xrdma});
    const auto b = cached.segments()[1].from;
    auto ns = [&](Strategy s, std::uint64_t d, bool c) { return estimate_ns(model, s, op.work(d), c); };
    CHECK(ns(Strategy::xrdma, b, true) < ns(Strategy::get, b, true));
    CHECK(ns(Strategy::xrdma, b - 1, true) >= ns(Strategy::get, b - 1, true));
    CHECK(cached.at(4096) == Strategy::xrdma);
    CHECK(cached.at(1) == Strategy::get);
    auto cold = Breakpoints::compute(model, op, 1, 4096, false, ship_or_get);
    REQUIRE(cold.segments().size() == 2);
    CHECK(cold.segments()[1].from > 100); // 3 ms of code to amortise at 25 µs a hop
    CHECK(ns(Strategy::xrdma, cold.segments()[1].from, false) < ns(Strategy::get, cold.segments()[1].from, false));
    CHECK(ns(Strategy::xrdma, cold.segments()[1].from - 1, false) >= ns(Strategy::get, cold.segments()[1].from - 1, false));
}

TEST_CASE("wisdom written to a file reads back the same, and lines that do not parse are skipped", "[unit]") {
    WalkShape op;
    const auto dir = launch::make_temp_dir("bitship-wisdom-");
    const auto path = dir / "sub" / "planner.wisdom";
    const std::vector<Strategy> all{kAllStrategies.begin(), kAllStrategies.end()};
    WisdomEntry e{tcp_like().link, tcp_like(), {}, {}};
    e.model.cold_next_ns = 7'500'000;
    e.cached = Breakpoints::compute(e.model, op, 1, 4096, true, all);
    e.cold = Breakpoints::compute(e.model, op, 1, 4096, false, all);
    {
        auto w = Wisdom::load(path);
        REQUIRE(w);
        CHECK(w->size() == 0);
        w->put("walk@127.0.0.1:1#00ff", e);
        REQUIRE(w->save());
    }
    {
        std::ofstream out(path, std::ios::app);
        out << "walk@x probed 1 2 3\n"                                     // cut short
            << "walk@y probed 1 1 1 0 link nan 1 1 0 fit get 0 0 1 native 0 0 1 xrdma 0 0 1 cold_ns 0 range 1 2 cached 1 1:get cold 1 1:get\n"
            << "walk@z probed 1 1 1 0 link 1 1 1 0 fit get 0 0 1 native 0 0 1 xrdma 0 0 1 cold_ns 0 range 1 2 cached 1 1:teleport cold 1 1:get\n"
            << "walk@dup probed 1 1 1 0 link 1 1 1 0 fit get 0 0 1 get 0 0 1 cold_ns 0 range 1 2 cached 1 1:get cold 1 1:get\n"
            // Written before reship existed: reads, with reship unfitted.
            << "walk@old probed 1 1 1 0 link 1 1 1 0 fit get 5 0 1 native 6 0 1 xrdma 7 0 1 cold_ns 0 range 1 2 cached 1 1:get cold 1 1:get\n";
    }
    auto w = Wisdom::load(path);
    REQUIRE(w);
    CHECK(w->size() == 2);
    CHECK(w->skipped() == 4);
    const auto* old = w->find("walk@old");
    REQUIRE(old != nullptr);
    CHECK(old->model.fits[index_of(Strategy::xrdma)].fixed_ns == 7);
    CHECK(old->model.fits[index_of(Strategy::xrdma)].fitted);
    CHECK_FALSE(old->model.fits[index_of(Strategy::reship)].fitted);
    const auto* back = w->find("walk@127.0.0.1:1#00ff");
    REQUIRE(back != nullptr);
    CHECK(back->cached == e.cached);
    CHECK(back->cold == e.cold);
    CHECK(back->model.link.rtt_ns == e.model.link.rtt_ns);
    CHECK(back->model.fits[index_of(Strategy::xrdma)].per_unit_ns == e.model.fits[index_of(Strategy::xrdma)].per_unit_ns);
    CHECK(back->model.cold_ns == e.model.cold_ns);
    CHECK(back->model.cold_next_ns == e.model.cold_next_ns);
    CHECK(old->model.cold_next_ns == 0); // written before it existed

    std::ofstream(dir / "other") << "not wisdom\n";
    auto other = Wisdom::load(dir / "other");
    REQUIRE_FALSE(other);
    CHECK(other.error().code == Errc::invalid_argument);
    std::filesystem::remove_all(dir);
}

TEST_CASE("a link matches kept wisdom within the drift fraction and not past it", "[unit]") {
    LinkFigures then{20'000, 25'000, 0.1, 0, false};
    auto now = then;
    now.rtt_ns *= 1.3;
    CHECK(link_matches(then, now, 0.5));
    now.rtt_ns = then.rtt_ns / 1.6; // as far the other way: past 1.5×
    CHECK_FALSE(link_matches(then, now, 0.5));
    now.rtt_ns = then.rtt_ns / 10; // shared memory where TCP was
    CHECK_FALSE(link_matches(then, now, 0.5));
    now = then;
    now.mapped = true;
    CHECK_FALSE(link_matches(then, now, 0.5));
}

TEST_CASE("an estimate's terms show its fitted fixed cost where it is 100 ns or more so that they add up", "[unit]") {
    WalkShape op;
    auto model = tcp_like();
    const auto w = op.work(1);
    // native: fixed 3 µs beside the round trip and the hop.
    const auto native = explain(model, Strategy::native, w, true);
    CHECK(native.terms.find("+ fixed 3 µs") != std::string::npos);
    // Negative (a probe slower than the runs): taken off, and said so.
    model.fits[index_of(Strategy::xrdma)].fixed_ns = -2'500;
    CHECK(explain(model, Strategy::xrdma, w, true).terms.find("− fixed 2.5 µs") != std::string::npos);
    // get: fixed 500 ns.
    CHECK(explain(model, Strategy::get, w, true).terms.find("+ fixed 500 ns") != std::string::npos);
    // Under 100 ns it is noise beside the other terms: left out.
    model.fits[index_of(Strategy::get)].fixed_ns = 60;
    CHECK(explain(model, Strategy::get, w, true).terms.find("fixed") == std::string::npos);
}

TEST_CASE("a loaded owner whose GETs are late too gets the work where fetching costs more than its queue", "[unit]") {
    WalkShape op;
    const auto model = tcp_like();
    const std::vector<Strategy> ship_or_get{Strategy::get, Strategy::xrdma};
    const auto bp = Breakpoints::compute(model, op, 1, 4096, true, ship_or_get);
    // At depth 1 GET (25.5 µs) beats shipping (30 µs); at 64, shipping (31 µs) beats 64 GETs (1.6 ms).
    REQUIRE(bp.at(1) == Strategy::get);
    REQUIRE(bp.at(64) == Strategy::xrdma);
    auto choose = [&](std::uint64_t depth, OwnerLoad load, Shift& shift) {
        shift = Shift::none;
        return loaded_choice(model, op.work(depth), true, ship_or_get, bp.at(depth), load, &shift);
    };
    Shift shift{};
    CHECK(choose(1, {0, 50}, shift) == Strategy::get); // no queue: the breakpoints, whatever the GETs did
    CHECK(shift == Shift::none);
    // The owner's runs wait 200 µs, its GETs on time: fetching stays cheaper.
    CHECK(choose(1, {200'000, 1}, shift) == Strategy::get);
    CHECK(shift == Shift::none);
    // Its GETs 50x late (1.3 ms) too: shipping, 30 µs + the 200 µs wait, is cheaper.
    CHECK(choose(1, {200'000, 50}, shift) == Strategy::xrdma);
    CHECK(shift == Shift::late_gets);
    // A queue (5 ms) longer than the late GETs take: fetching still.
    CHECK(choose(1, {5'000'000, 50}, shift) == Strategy::get);
    CHECK(shift == Shift::none);
    // Shipping by the breakpoints, GETs on time and the queue long: pushed back to GET.
    CHECK(choose(64, {5'000'000, 1}, shift) == Strategy::get);
    CHECK(shift == Shift::pushed_back);
    // The same with the GETs 50x late (80 ms): the queue costs less, and shipping stays.
    CHECK(choose(64, {5'000'000, 50}, shift) == Strategy::xrdma);
    CHECK(shift == Shift::none);
    // No GET to fall back on: the breakpoints' choice.
    const std::vector<Strategy> ship_only{Strategy::xrdma};
    CHECK(loaded_choice(model, op.work(64), true, ship_only, Strategy::xrdma, {5'000'000, 1}) == Strategy::xrdma);
}

TEST_CASE("a sleeping owner gets the work only where shipping saves more than waking it costs", "[unit]") {
    WalkShape op;
    const auto model = tcp_like();
    const std::vector<Strategy> ship_or_get{Strategy::get, Strategy::xrdma};
    const auto bp = Breakpoints::compute(model, op, 1, 4096, true, ship_or_get);
    auto est = [&](Strategy s, std::uint64_t depth) { return estimate_ns(model, s, op.work(depth), true); };
    // Depth 4: shipping (~30 µs) beats 4 GETs (~100 µs) by ~70 µs; depth 64 by ~1.6 ms.
    REQUIRE(bp.at(4) == Strategy::xrdma);
    REQUIRE(bp.at(64) == Strategy::xrdma);
    const double saved_at_4 = est(Strategy::get, 4) - est(Strategy::xrdma, 4);
    REQUIRE(saved_at_4 > 10'000);
    auto choose = [&](std::uint64_t depth, OwnerLoad load, Shift& shift) {
        shift = Shift::none;
        return loaded_choice(model, op.work(depth), true, ship_or_get, bp.at(depth), load, &shift);
    };
    Shift shift{};
    // Waking it costs more than shipping saves at depth 4, and GETs over mapped memory wake
    // nobody: fetch, and say why.
    OwnerLoad asleep{0, 1, saved_at_4 + 5'000, 0};
    CHECK(choose(4, asleep, shift) == Strategy::get);
    CHECK(shift == Shift::asleep);
    // At depth 64 shipping saves far more than the wake-up: ship all the same.
    CHECK(choose(64, asleep, shift) == Strategy::xrdma);
    CHECK(shift == Shift::none);
    // A wake-up cheaper than what shipping saves at depth 4: ship.
    CHECK(choose(4, {0, 1, saved_at_4 - 5'000, 0}, shift) == Strategy::xrdma);
    CHECK(shift == Shift::none);
    // Where the owner serves the GETs (TCP), the walk wakes it too: the breakpoints' choice.
    CHECK(choose(4, {0, 1, saved_at_4 + 5'000, saved_at_4 + 5'000}, shift) == Strategy::xrdma);
    CHECK(shift == Shift::none);
    // Asleep where the breakpoints chose GET: GET, whatever the wake-up.
    CHECK(bp.at(1) == Strategy::get);
    CHECK(choose(1, asleep, shift) == Strategy::get);
    CHECK(shift == Shift::none);
    // A queue and a wake-up together push back as the queue: pushed_back.
    CHECK(choose(4, {10'000, 1, saved_at_4, 0}, shift) == Strategy::get);
    CHECK(shift == Shift::pushed_back);
}

}  // namespace planner_model_test_cpp
