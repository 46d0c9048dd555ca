// The GET curve: what the planner charges a GET's bytes, from the sizes a link probe measured.

#include "cost_model.hpp"
#include "get_curve.hpp"
#include "wisdom.hpp"

#include <catch2/catch.hpp>

#include <cmath>

namespace get_curve_test_cpp {

using namespace bitship::xrdma;

// A TCP-like link: 0.3 ns a byte up to 7 KiB, a 5 µs step before 8 KiB, 0.7 ns a byte after.
double tcp_like(std::uint32_t bytes) {
    if (bytes < 7800) return 0.3 * (bytes - 8);
    return 0.3 * (7800 - 8) + 5000 + 0.7 * (bytes - 7800);
}

GetCurve measured_like_a_probe(double (*cost)(std::uint32_t), std::uint32_t bulk) {
    GetCurve c;
    for (auto b : GetCurve::ladder(bulk)) c.add(b, cost(b));
    c.add(bulk, cost(bulk));
    c.make_monotone();
    return c;
}

TEST_CASE("a GET curve interpolates between the sizes measured, and goes on at its last slope", "[unit]") {
    const auto ladder = GetCurve::ladder(256u << 10);
    REQUIRE(ladder.size() == 13); // 1 KiB to 64 KiB in half octaves
    CHECK(ladder.front() == 1024);
    CHECK(ladder.back() == 65536);
    CHECK(GetCurve::ladder(4096).back() < 4096); // below the bulk size, which the curve ends at
    CHECK(GetCurve::ladder(1024).empty());

    GetCurve empty;
    CHECK(empty.extra_ns(1000, 0.5) == Approx(500)); // no points: the straight line

    GetCurve c;
    c.add(8192, 8000);
    c.add(1024, 1000);
    c.add(65536, 50000);
    REQUIRE(c.points().size() == 3);
    CHECK(c.points().front().bytes == 1024); // kept sorted
    CHECK(c.extra_ns(8, 99) == 0);
    CHECK(c.extra_ns(516, 99) == Approx(500));            // from (8 B, 0) to the first point
    CHECK(c.extra_ns(4608, 99) == Approx(4500));          // between two points
    CHECK(c.extra_ns(65536 + 1000, 99) == Approx(50000 + 1000 * 42000.0 / 57344)); // the last slope
    c.add(1024, 900);                                     // replaces
    CHECK(c.points().size() == 3);
    CHECK(c.extra_ns(1024, 0) == Approx(900));

    GetCurve slow;
    slow.add(1024, 500); // timed in a slow moment
    slow.add(2048, 400);
    slow.add(4096, 90000); // the same
    slow.add(8192, 1200);
    slow.add(16384, -5); // a median below the small GET's
    slow.make_monotone();
    CHECK(slow.points()[0].extra_ns == 0);
    CHECK(slow.points()[1].extra_ns == 0);
    CHECK(slow.points()[2].extra_ns == 0);
    CHECK(slow.points()[4].extra_ns == 0);
    GetCurve rising;
    rising.add(1024, 500);
    rising.add(2048, 400);
    rising.add(4096, 90000);
    rising.add(8192, 120000);
    rising.make_monotone();
    CHECK(rising.points()[0].extra_ns == 400);
    CHECK(rising.points()[1].extra_ns == 400);
    CHECK(rising.points()[2].extra_ns == 90000);
    CHECK(rising.points()[3].extra_ns == 120000);
}

TEST_CASE("a step between two measured sizes is narrowed by bisection, and only a step is", "[unit]") {
    auto c = measured_like_a_probe(tcp_like, 256u << 10);
    // The half-octave ladder puts the step between 5792 and 8192 B: at 7 KiB the line between
    // them charges 3 µs too much.
    CHECK(c.extra_ns(7168, 0) - tcp_like(7168) > 2500);
    std::vector<std::uint32_t> asked;
    const auto measured = c.refine_step(
        [&](std::uint32_t b) {
            asked.push_back(b);
            return tcp_like(b);
        },
        2000, 3);
    CHECK(measured == 3);
    REQUIRE(asked.size() == 3);
    for (auto b : asked) {
        CHECK(b > 5792);
        CHECK(b < 8192);
    }
    // Within 300 bytes of the step: off by at most what those bytes' share of the step costs.
    CHECK(std::abs(c.extra_ns(7168, 0) - tcp_like(7168)) < 100);
    CHECK(std::abs(c.extra_ns(7500, 0) - tcp_like(7500)) < 100);
    CHECK(std::abs(c.extra_ns(9000, 0) - tcp_like(9000)) < 300);

    // A straight line (shared memory: a copy) has no step: nothing measured.
    auto line = measured_like_a_probe([](std::uint32_t b) { return 0.04 * b; }, 256u << 10);
    CHECK(line.refine_step([](std::uint32_t) -> double { FAIL("measured a line"); return 0; }, 80, 3) == 0);
}

TEST_CASE("the planner charges a GET's bytes by the curve, each GET its share", "[unit]") {
    LinkFigures link;
    link.get_ns = 11000;
    link.get_ns_per_byte = 0.8; // a 256 KiB GET's average
    OpWork one_get;
    one_get.dependent_gets = 1;
    one_get.get_bytes = 5000;
    // The straight line overcharges a 5000-byte GET over this link by 2.5 µs.
    CHECK(get_bytes_ns(link, one_get) == Approx(5000 * 0.8));
    link.get_curve = measured_like_a_probe(tcp_like, 256u << 10);
    CHECK(get_bytes_ns(link, one_get) == Approx(tcp_like(5000)).epsilon(0.01));
    CHECK(link_ns(link, Strategy::get, one_get) == Approx(11000 + tcp_like(5000)).epsilon(0.01));

    // A fan-out's GETs (one an agent, in flight at once) each pay for their share.
    OpWork fan = one_get;
    fan.get_bytes = 4 * 5000;
    fan.agents_touched = 4;
    CHECK(get_bytes_ns(link, fan) == Approx(4 * get_bytes_ns(link, one_get)));
    // A walk's dependent GETs of 16 bytes each: 16 B apiece, not one 16 KiB GET.
    OpWork walk;
    walk.dependent_gets = 1024;
    walk.get_bytes = 1024 * 16;
    walk.agents_touched = 4;
    walk.forwards = 3;
    CHECK(get_bytes_ns(link, walk) == Approx(1024 * link.get_curve.extra_ns(16, 0)));
    CHECK(get_bytes_ns(link, walk) < 1024 * 16 * 0.8);
}

TEST_CASE("agents' curves combine at every size any of them measured", "[unit]") {
    GetCurve a, b;
    a.add(1024, 1000);
    a.add(8192, 8000);
    b.add(1024, 3000);
    b.add(4096, 3000);
    const GetCurve* both[] = {&a, &b};
    const double per_byte[] = {1.0, 0.0};
    auto mean = GetCurve::combine(both, per_byte, GetCurve::Combine::mean);
    REQUIRE(mean.points().size() == 3);
    CHECK(mean.points()[0].extra_ns == Approx(2000));
    CHECK(mean.points()[1].extra_ns == Approx((a.extra_ns(4096, 1) + 3000) / 2));
    CHECK(mean.points()[2].extra_ns == Approx((8000 + b.extra_ns(8192, 0)) / 2));
    auto least = GetCurve::combine(both, per_byte, GetCurve::Combine::least);
    CHECK(least.points()[0].extra_ns == Approx(1000));
    CHECK(least.points()[2].extra_ns == Approx(std::min(8000.0, b.extra_ns(8192, 0))));
}

TEST_CASE("wisdom keeps a link's GET curve, and reads a line written before it had one", "[unit]") {
    WisdomEntry e;
    e.probed.rtt_ns = 11000;
    e.probed.get_ns = 10800;
    e.probed.get_ns_per_byte = 0.7;
    e.probed.get_curve = measured_like_a_probe(tcp_like, 256u << 10);
    e.model.link = e.probed;
    e.cached = Breakpoints(1, 4096, {{1, Strategy::get}, {300, Strategy::native}});
    e.cold = e.cached;
    const auto line = Wisdom::format("reduce@x#1", e);
    auto back = Wisdom::parse(line);
    REQUIRE(back);
    REQUIRE(back->second.probed.get_curve.points().size() == e.probed.get_curve.points().size());
    for (std::size_t i = 0; i < e.probed.get_curve.points().size(); ++i) {
        CHECK(back->second.probed.get_curve.points()[i].bytes == e.probed.get_curve.points()[i].bytes);
        CHECK(back->second.model.link.get_curve.points()[i].extra_ns == Approx(e.probed.get_curve.points()[i].extra_ns));
    }
    // Without the curves (as version 2 wrote it before): the straight line.
    WisdomEntry old = e;
    old.probed.get_curve = {};
    old.model.link.get_curve = {};
    auto plain = Wisdom::parse(Wisdom::format("reduce@x#1", old));
    REQUIRE(plain);
    CHECK(plain->second.probed.get_curve.empty());
    CHECK(plain->second.model.link.get_curve.empty());
    CHECK(plain->second.cached.segments().size() == 2);
    // A curve that goes down in size, or claims more points than it has, is not read.
    auto bad = line;
    bad.replace(bad.find(" curve "), 7, " curve 999999 ");
    CHECK_FALSE(Wisdom::parse(bad));
    auto unsorted = Wisdom::format("k", old);
    unsorted.replace(unsorted.find(" fit"), 0, " curve 2 4096 10 1024 20");
    CHECK_FALSE(Wisdom::parse(unsorted));
}

} // namespace get_curve_test_cpp
