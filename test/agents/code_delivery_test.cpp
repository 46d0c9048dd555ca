// How shipped code reaches an agent and stays there: the tier-1 compile behind a first call and
// its swap, a kernel's state, one slice per triple, the code sent once, NEED_CODE after a
// restart, and a disk cache. Real xagent processes, real UCX over loopback, real LLVM JIT.

#include <dlfcn.h>
#include <sys/resource.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <thread>

#include <bitship/client.hpp>
#include <behaviour_kernels.hpp>
#include <state_kernels.hpp>

#include "core/wire.hpp"
#include "launcher.hpp"
#include "test_support.hpp"

namespace code_delivery_test_cpp {


using namespace bitship;
using bitship::test::make_client;
using bitship::test::agent_counters;
using bitship::test::connect;
using bitship::launch::AgentProcess;
using namespace std::chrono_literals;

TEST_CASE("an agent reports its background tier-1 compiles: pending after a first call, then finished", "[integration]") {
    AgentProcess agent("tcp");
    auto client = make_client("tcp");
    auto target = connect(client, agent);
    auto before = agent_counters(client, target);
    REQUIRE(before.contains("tier_ups_pending"));
    CHECK(before["tier_ups_pending"] == 0);
    CHECK(before["tier_ups"] == 0);
    REQUIRE(client.ship(behaviour_kernels::add, target, std::uint64_t{1}, std::uint64_t{2}).get());
    // The fast compile served the call; the optimised one follows in the background (queued
    // before the call was answered), and await_tier_ups waits it out.
    auto idle = client.await_tier_ups(target, 20s);
    INFO(agent.log());
    REQUIRE(idle);
    CHECK(*idle);
    auto now = agent_counters(client, target);
    CHECK(now["tier_ups_pending"] == 0);
    CHECK(now["tier_ups"] == 1);
    CHECK(now["last_compile_tier"] == 0); // the call's own compile was the fast one
}

namespace {
// The agent's per-kernel stats (KERNEL_STATS), for `entry`.
wire::KernelStat kernel_stat(Client& client, const Target& target, std::string_view entry) {
    auto bytes = client.control(target, static_cast<std::uint8_t>(wire::Type::kernel_stats));
    REQUIRE(bytes);
    wire::Header h;
    h.type = wire::Type::kernel_stats_reply;
    h.payload_size = static_cast<std::uint32_t>(bytes->size());
    auto msg = wire::decode(h, *bytes);
    REQUIRE(msg);
    for (const auto& k : std::get<wire::KernelStatsReply>(msg->body).kernels)
        if (k.entry == entry) return k;
    FAIL("no stats for kernel " << entry);
    return {};
}
} // namespace

TEST_CASE("back-to-back calls run the optimised code once it is swapped in, and code evicted meanwhile is fetched again",
          "[integration]") {
    // The agent runs a call to the code its last call ran without looking it up while its code
    // cache changed nothing (Agent::Impl::cached_code): a tier swap, or an eviction, must end that.
    // (Whether the first batch already ran the optimised code is a race with the tier-up.)
    auto transport = GENERATE(as<std::string>{}, "tcp", "shm");
    INFO(transport);
    AgentProcess agent(transport);
    auto client = make_client(transport);
    auto target = connect(client, agent);
    INFO(agent.log());
    auto add = [&](std::uint64_t a) { return client.ship(behaviour_kernels::add, target, a, std::uint64_t{1}).get_as<std::uint64_t>(); };
    for (std::uint64_t i = 0; i < 20; ++i) REQUIRE(add(i) == i + 1); // the first compile, and its tier-0 code kept
    auto idle = client.await_tier_ups(target, 20s);
    REQUIRE(idle);
    REQUIRE(*idle);
    for (std::uint64_t i = 0; i < 20; ++i) REQUIRE(add(i) == i + 1);
    auto stat = kernel_stat(client, target, "add");
    CHECK(stat.compile_ns_first > 0);
    CHECK(stat.compile_ns_optimised > 0); // a second code object ran: the optimised one
    CHECK(stat.runs == 40);
    // Evicted (xctl cache evict) between two back-to-back calls: the next call finds no code,
    // asks for it (NEED_CODE), and runs it compiled again.
    auto before = agent_counters(client, target);
    REQUIRE(add(1) == 2u);
    REQUIRE(client.control(target, static_cast<std::uint8_t>(wire::Type::cache_evict),
                           wire::encode_cache_evict(0, stat.hash).payload));
    REQUIRE(add(5) == 6u);
    auto after = agent_counters(client, target);
    CHECK(after["compiles"] > before["compiles"]);
    CHECK(after["cache_hits"] == before["cache_hits"] + 1); // the call before the eviction only
}

TEST_CASE("a kernel's state goes on from call to call: its slice is compiled optimised at once and never swapped",
          "[integration]") {
    auto transport = GENERATE(as<std::string>{}, "tcp", "shm");
    INFO(transport);
    AgentProcess agent(transport);
    auto client = make_client(transport);
    auto target = connect(client, agent);
    INFO(agent.log());
    for (std::uint64_t i = 1; i <= 3; ++i) CHECK(client.ship(state_kernels::count_calls, target).get_as<std::uint64_t>() == i);
    auto idle = client.await_tier_ups(target, 20s);
    REQUIRE(idle);
    CHECK(*idle);
    auto counters = agent_counters(client, target);
    CHECK(counters["compiles"] == 1);
    CHECK(counters["last_compile_tier"] == 1);
    CHECK(counters["tier_ups"] == 0); // nothing swapped in behind the first compile
    CHECK(client.ship(state_kernels::count_calls, target).get_as<std::uint64_t>() == std::uint64_t{4});
}

TEST_CASE("a second agent of the same triple takes the slice the first one did, and each gets it once", "[integration]") {
    // The client chooses a bundle's slice once per triple (Client::Impl::slice_by_triple), not
    // once per agent: the second agent's first call carries the same code, its own hash.
    auto transport = GENERATE(as<std::string>{}, "tcp", "shm");
    INFO(transport);
    AgentProcess a(transport), b(transport);
    auto client = make_client(transport);
    auto ta = connect(client, a), tb = connect(client, b);
    for (std::uint64_t i = 0; i < 3; ++i) {
        REQUIRE(client.ship(behaviour_kernels::add, ta, i, std::uint64_t{1}).get_as<std::uint64_t>() == i + 1);
        REQUIRE(client.ship(behaviour_kernels::add, tb, i, std::uint64_t{2}).get_as<std::uint64_t>() == i + 2);
    }
    CHECK(client.stats().bundles_sent == 2);
    for (const auto* t : {&ta, &tb}) {
        auto c = agent_counters(client, *t);
        CHECK(c["code_received"] == 1);
        CHECK(c["compiles"] == 1);
    }
}

TEST_CASE("a cached kernel is not resent", "[integration]") {
    auto transport = GENERATE(as<std::string>{}, "tcp", "shm");
    AgentProcess agent(transport);
    auto client = make_client(transport);
    auto target = connect(client, agent);
    for (std::uint64_t i = 0; i < 5; ++i) {
        auto r = client.ship(behaviour_kernels::add, target, i, i).get_as<std::uint64_t>();
        REQUIRE(r);
        CHECK(*r == 2 * i);
    }
    auto s = client.stats();
    CHECK(s.runs_sent == 5);
    CHECK(s.bundles_sent == 1);
    auto c = agent_counters(client, target);
    CHECK(c["code_received"] == 1);
    CHECK(c["compiles"] == 1);
    CHECK(c["cache_hits"] == 4);
    CHECK(c["need_code_sent"] == 0);
}

TEST_CASE("a restarted agent gets the code again through NEED_CODE, once", "[integration]") {
    AgentProcess first("tcp");
    auto port = first.port();
    auto client = make_client("tcp");
    auto target = connect(client, first);
    auto r = client.ship(behaviour_kernels::add, target, std::uint64_t{1}, std::uint64_t{2}).get_as<std::uint64_t>();
    REQUIRE(r);
    CHECK(*r == 3);
    first.stop(SIGKILL);

    AgentProcess second("tcp", {}, port);
    // The first call after the restart may race the client noticing the old connection died:
    // it then fails with `disconnected`; the one after reconnects and succeeds.
    Result<std::uint64_t> again = fail(Errc::internal, "not run");
    for (int attempt = 0; attempt < 3; ++attempt) {
        again = client.ship(behaviour_kernels::add, target, std::uint64_t{20}, std::uint64_t{22}).get_as<std::uint64_t>();
        if (again || again.error().code != Errc::disconnected) break;
    }
    INFO(second.log());
    REQUIRE(again);
    CHECK(*again == 42);
    auto s = client.stats();
    CHECK(s.need_code_received == 1);
    CHECK(s.bundles_sent == 2);
    CHECK(s.reconnects >= 1);
    auto c = agent_counters(client, target);
    CHECK(c["need_code_sent"] == 1);
    CHECK(c["code_received"] == 1);
}

TEST_CASE("a restarted agent with a disk cache needs no code at all", "[integration]") {
    auto cache = bitship::launch::make_temp_dir("bitship-cache-");
    std::uint16_t port = 0;
    auto client = make_client("tcp");
    {
        AgentProcess first("tcp", {"--cache-dir", cache.string()});
        port = first.port();
        auto target = connect(client, first);
        REQUIRE(client.ship(behaviour_kernels::add, target, std::uint64_t{1}, std::uint64_t{1}).get_as<std::uint64_t>());
    }
    // No preload: the call itself loads from the disk cache (preload has its own test).
    AgentProcess second("tcp", {"--cache-dir", cache.string(), "--cache-preload", "0"}, port);
    auto target = connect(client, second);
    auto r = client.ship(behaviour_kernels::add, target, std::uint64_t{2}, std::uint64_t{3}).get_as<std::uint64_t>();
    INFO(second.log());
    REQUIRE(r);
    CHECK(*r == 5);
    auto c = agent_counters(client, target);
    CHECK(c["need_code_sent"] == 0);
    CHECK(c["disk_loads"] == 1);
    CHECK(c["code_received"] == 0);
    std::filesystem::remove_all(cache);
}

} // namespace code_delivery_test_cpp
