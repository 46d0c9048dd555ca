// The measured facts the planner reads: running figures, and a link probe against real agents.

#include "launcher.hpp"
#include "link_probe.hpp"
#include "running_figure.hpp"

#include <algorithm>
#include <bitship/client.hpp>
#include <catch2/catch.hpp>
#include <cmath>
#include <fmt/format.h>
#include <limits>
#include <random>
#include <xrdma_test_kernels.hpp>

namespace link_probe_test_cpp {

using namespace bitship;
using namespace std::chrono_literals;
using xrdma::LinkFigures;
using xrdma::RunningFigure;

TEST_CASE("a running figure gives the window's median and p95 and a weighted mean", "[unit]") {
    RunningFigure f(0.5);
    CHECK(f.count() == 0);
    CHECK(f.mean() == 0);
    CHECK(f.p50() == 0);
    f.add(10);
    CHECK(f.mean() == 10); // the first sample sets the mean
    CHECK(f.p50() == 10);
    CHECK(f.p95() == 10);
    f.add(20);
    CHECK(f.mean() == 15); // 10 + 0.5 · (20 − 10)
    f.add(40);
    CHECK(f.mean() == 27.5);
    CHECK(f.p50() == 20);
    CHECK(f.p95() == Approx(38)); // sorted {10, 20, 40}: index 0.95 · 2 = 1.9 → 20 + 0.9 · 20

    SECTION("only the last 64 samples count for the percentiles") {
        RunningFigure g;
        for (int i = 0; i < 100; ++i)
            g.add(1e6); // pushed out of the window below
        for (int i = 1; i <= 64; ++i)
            g.add(i);
        CHECK(g.count() == 164);
        CHECK(g.p50() == Approx(32.5));  // 1..64: between 32 and 33
        CHECK(g.p95() == Approx(60.85)); // index 0.95 · 63 = 59.85 → 60 + 0.85
        CHECK(g.percentile(0) == 1);
        CHECK(g.percentile(1) == 64);
    }
    SECTION("the window's percentiles are those of its samples sorted, after any run of adds") {
        RunningFigure g;
        std::mt19937 random(7);
        std::vector<double> all;
        for (int i = 0; i < 300; ++i) {
            // Repeats as well: a leaving sample equal to others must take one of them out.
            const double x = static_cast<double>(random() % 40) + (i % 3 == 0 ? 0.5 : 0.0);
            g.add(x);
            all.push_back(x);
            std::vector<double> window(all.end() - std::min<std::ptrdiff_t>(std::ssize(all), RunningFigure::kWindow), all.end());
            std::sort(window.begin(), window.end());
            for (double q : {0.0, 0.25, 0.5, 0.95, 1.0}) {
                const double at = q * static_cast<double>(window.size() - 1);
                const auto below = static_cast<std::size_t>(at);
                const auto above = std::min(below + 1, window.size() - 1);
                const double want = window[below] + (at - static_cast<double>(below)) * (window[above] - window[below]);
                INFO("after " << i + 1 << " adds, q " << q);
                REQUIRE(g.percentile(q) == Approx(want));
            }
            REQUIRE(g.p50() == Approx(g.percentile(0.5)));
        }
    }
    SECTION("a sample that is not finite is ignored") {
        RunningFigure g;
        g.add(5);
        g.add(std::numeric_limits<double>::quiet_NaN());
        g.add(std::numeric_limits<double>::infinity());
        g.add(7);
        CHECK(g.count() == 2);
        CHECK(g.p50() == 6);
        CHECK(g.percentile(1) == 7);
    }
    SECTION("the mean follows new samples by its weight") {
        RunningFigure g(0.25);
        g.add(100);
        for (int i = 0; i < 3; ++i)
            g.add(0);
        CHECK(g.mean() == Approx(100 * 0.75 * 0.75 * 0.75));
    }
}

TEST_CASE("a probe's GET figures stand when a loaded host made its small GETs the slowest", "[unit]") {
    const auto ladder = xrdma::GetCurve::ladder(256u << 10);
    REQUIRE(!ladder.empty());
    LinkFigures out;
    out.bulk_bytes = 256u << 10;
    RunningFigure small, bulk;
    std::vector<RunningFigure> at_ladder(ladder.size());
    auto curve_checks = [&] {
        const auto& curve = out.get_curve.points();
        REQUIRE(curve.size() == ladder.size() + 1);
        CHECK(curve.back().bytes == out.bulk_bytes);
        for (std::size_t i = 1; i < curve.size(); ++i) CHECK(curve[i].extra_ns >= curve[i - 1].extra_ns);
        CHECK(curve.back().extra_ns > 0);
        CHECK(out.get_ns_per_byte > 0);
    };

    SECTION("as on CI: one round, its 8 B GET at 9.8 ms against 1.1 ms for 256 KiB") {
        small.add(9.8e6);
        for (std::size_t i = 0; i < ladder.size(); ++i) at_ladder[i].add(95e3 + 1e3 * static_cast<double>(i));
        bulk.add(1.1e6);
        const double least_small = xrdma::summarise_gets(small, ladder, at_ladder, bulk, out);
        // The small GET at no more than the least larger one, not 9.8 ms.
        CHECK(out.get_ns == 95e3);
        CHECK(least_small == 95e3);
        CHECK(out.get_curve.points().back().extra_ns == Approx(1.1e6 - 95e3));
        CHECK(out.get_ns_per_byte == Approx((1.1e6 - 95e3) / ((256u << 10) - 8)));
        curve_checks();
    }
    SECTION("every other GET slower than the bulk one: its point at the per-byte figure") {
        small.add(2e6);
        for (auto& g : at_ladder) g.add(3e6);
        bulk.add(1e6);
        xrdma::summarise_gets(small, ladder, at_ladder, bulk, out);
        CHECK(out.get_ns == 1e6);
        curve_checks();
    }
    SECTION("an idle host's samples are taken as they are") {
        for (double s : {1000.0, 1100.0, 1200.0}) small.add(s);
        for (std::size_t i = 0; i < ladder.size(); ++i) at_ladder[i].add(1100 + 100.0 * static_cast<double>(i));
        bulk.add(20e3);
        const double least_small = xrdma::summarise_gets(small, ladder, at_ladder, bulk, out);
        CHECK(out.get_ns == 1100);
        CHECK(least_small == 1000);
        CHECK(out.get_curve.points().front().extra_ns == Approx(100));
        CHECK(out.get_curve.points().back().extra_ns == Approx(19e3));
        CHECK(out.get_ns_per_byte == Approx((20e3 - 1100) / ((256u << 10) - 8)));
        curve_checks();
    }
}

TEST_CASE(
    "a link probe measures round trip, GET latency and bandwidth, and whether memory is mapped",
    "[integration]") {
    auto transport = GENERATE(as<std::string>{}, "tcp", "shm");
    INFO(transport);
    launch::AgentProcess agent(transport, {"--region", "probe=1M"});
    ClientOptions o;
    o.transport = *parse_transport(transport);
    o.loopback_only = true;
    o.call_timeout = 30s;
    auto client = Client::create(o);
    REQUIRE(client);
    auto target = client->connect(agent.address());
    INFO(agent.log());
    REQUIRE(target);
    auto region = client->region(*target, "probe");
    REQUIRE(region);

    auto began = std::chrono::steady_clock::now();
    auto link = xrdma::probe_link_async(*client, *target, *region).get();
    auto took = std::chrono::steady_clock::now() - began;
    INFO((link ? std::string() : link.error().describe()));
    REQUIRE(link);
    // Printed so a reader sees the figures this machine gives (no test depends on them).
    fmt::print("link probe over {}: rtt {:.0f} ns ({} pings), 8 B GET {:.0f} ns ({}), bulk GET "
               "{:.3f} ns/B ({} × {} B), "
               "mapped {}, waking the agent {:.0f} ns ({}), took {:.2f} ms\n",
               transport, link->rtt_ns, link->pings, link->get_ns, link->small_gets,
               link->get_ns_per_byte, link->bulk_gets, link->bulk_bytes, link->mapped, link->wake_ns,
               link->woken_pings, std::chrono::duration<double, std::milli>(took).count());
    CHECK(std::isfinite(link->rtt_ns));
    CHECK(link->rtt_ns > 0);
    CHECK(std::isfinite(link->get_ns));
    CHECK(link->get_ns > 0);
    CHECK(std::isfinite(link->get_ns_per_byte));
    CHECK(link->get_ns_per_byte > 0);
    CHECK(link->put_ns_per_byte == 0); // not probed: a PUT would change the region
    CHECK(link->pings >= 1);
    CHECK(link->small_gets >= 1);
    CHECK(link->bulk_gets >= 1);
    CHECK(link->bulk_bytes == 256u << 10);
    CHECK(link->mapped == (transport == "shm"));
    // The GET curve: every ladder size, the bulk GET last, never cheaper for more bytes.
    std::vector<std::string> points;
    for (const auto& p : link->get_curve.points()) points.push_back(fmt::format("{} B +{:.0f} ns", p.bytes, p.extra_ns));
    fmt::print("  GET curve over {}: {}\n", transport, fmt::join(points, ", "));
    const auto& curve = link->get_curve.points();
    REQUIRE(curve.size() >= xrdma::GetCurve::ladder(link->bulk_bytes).size() + 1);
    CHECK(curve.back().bytes == link->bulk_bytes);
    for (auto b : xrdma::GetCurve::ladder(link->bulk_bytes))
        CHECK(std::any_of(curve.begin(), curve.end(), [&](const xrdma::GetPoint& p) { return p.bytes == b; }));
    for (std::size_t i = 1; i < curve.size(); ++i) {
        CHECK(curve[i].bytes > curve[i - 1].bytes);
        CHECK(curve[i].extra_ns >= curve[i - 1].extra_ns);
    }
    CHECK(std::isfinite(curve.back().extra_ns));
    CHECK(curve.back().extra_ns > 0);
    auto mapped = client->mapped(*region);
    REQUIRE(mapped);
    CHECK(*mapped == link->mapped);
}

TEST_CASE("a link probe refuses a region of another agent or one too small", "[integration]") {
    launch::AgentProcess a("tcp", {"--region", "probe=4K"});
    launch::AgentProcess b("tcp", {"--region", "probe=4K"});
    ClientOptions o;
    o.transport = Transport::tcp;
    o.loopback_only = true;
    auto client = Client::create(o);
    REQUIRE(client);
    auto ta = client->connect(a.address());
    auto tb = client->connect(b.address());
    REQUIRE(ta);
    REQUIRE(tb);
    auto region_b = client->region(*tb, "probe");
    REQUIRE(region_b);
    auto wrong = xrdma::probe_link(*client, *ta, *region_b);
    REQUIRE_FALSE(wrong);
    CHECK(wrong.error().code == Errc::invalid_argument);

    auto small = client->region(*ta, "probe");
    REQUIRE(small);
    small->size = 4; // as if the agent had described 4 bytes
    auto tiny = xrdma::probe_link(*client, *ta, *small);
    REQUIRE_FALSE(tiny);
    CHECK(tiny.error().code == Errc::invalid_argument);

    // A region smaller than the bulk size is probed with what it has.
    auto whole = client->region(*ta, "probe");
    REQUIRE(whole);
    auto link = xrdma::probe_link(*client, *ta, *whole);
    REQUIRE(link);
    CHECK(link->bulk_bytes == std::min<std::uint64_t>(whole->size, 256u << 10));
    CHECK(link->get_ns_per_byte > 0);
}

TEST_CASE(
    "a forwarded call's answer reports the last agent's load against the target it was shipped to",
    "[integration]") {
    launch::AgentProcess first("tcp");
    launch::AgentProcess last("tcp");
    ClientOptions o;
    o.transport = Transport::tcp;
    o.loopback_only = true;
    auto client = Client::create(o);
    REQUIRE(client);
    auto t0 = client->connect(first.address());
    auto t1 = client->connect(last.address());
    REQUIRE(t0);
    REQUIRE(t1);
    ShipOptions options;
    options.peers = {*t0, *t1};
    auto r = client->ship(xrdma_test_kernels::hand_over, *t0, options).get(); // answered by `last`
    INFO((r ? std::string() : r.error().describe()));
    REQUIRE(r);
    auto shipped_to = client->load(*t0);
    CHECK(shipped_to.at != std::chrono::steady_clock::time_point{});
    CHECK(shipped_to.busy == 0); // the answering kernel has finished; nothing else runs
    CHECK(shipped_to.queued == 0);
    CHECK(client->load(*t1).at == std::chrono::steady_clock::time_point{}); // never called directly
}

}  // namespace link_probe_test_cpp
