// Same-host bulk data through the session's window (agents/bulk_windows.hpp): large arguments
// and results come back intact, many calls in flight share the window's slots, TCP and
// turned-off windows take UCX's path, and RUNs that misuse a window are refused by name.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <memory>
#include <thread>

#include <bitship/client.hpp>
#include <behaviour_kernels.hpp>
#include <bulk_kernels.hpp>

#include "core/bulk_window.hpp"
#include "core/memory_reuse.hpp"
#include "core/wire.hpp"
#include "launcher.hpp"
#include "raw_peer.hpp"
#include "test_support.hpp"

namespace bulk_window_test_cpp {

using namespace bitship;
using bitship::launch::AgentProcess;
using bitship::test::agent_counters;
using bitship::test::make_client;
using bitship::test::RawPeer;

namespace {

/// `size` bytes that differ from call to call and from place to place.
Bytes pattern(std::size_t size, std::uint64_t seed) {
    Bytes b(size);
    std::uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
    for (auto& v : b) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v = static_cast<std::byte>(x);
    }
    return b;
}

/// Echoes each size once; returns how many came back intact.
int echo_sizes(Client& client, const Target& t, std::initializer_list<std::size_t> sizes) {
    int intact = 0;
    std::uint64_t seed = 1;
    for (auto size : sizes) {
        auto args = pattern(size, seed++);
        auto r = client.ship_bytes(behaviour_kernels::echo, t, args).get();
        INFO(size << " bytes: " << (r ? "" : r.error().describe()));
        REQUIRE(r);
        if (*r != args) WARN(size << " bytes: got " << r->size() << " back, not the same");
        intact += *r == args;
    }
    return intact;
}

} // namespace

TEST_CASE("large arguments and results to a same-host agent over shared memory go through its bulk window intact",
          "[integration]") {
    AgentProcess agent("shm");
    auto client = make_client("shm");
    auto t = client.connect(agent.address());
    REQUIRE(t);
    // Small (in the messages), at the threshold, and up to the agent's 1 MiB argument limit.
    CHECK(echo_sizes(client, *t, {8, 4096, kWindowArgsMin - 1, kWindowArgsMin, 200'000, 1 << 20}) == 6);
    auto c = agent_counters(client, *t);
    // The first result of 16 KiB or more (kWindowArgsMin - 1 bytes) comes by UCX and makes
    // the client ask for the window; the next call is sent before its answer is in, so the
    // last two calls use it, both ways.
    CHECK(c["window_args"] == 2);
    CHECK(c["window_results"] == 2);
}

TEST_CASE("a result that fits its call's window slot is written there by bs_reply, a larger one comes in the message",
          "[integration]") {
    // A 1 MiB window: eight slots of 128 KiB.
    AgentProcess agent("shm", {"--bulk-window-mib", "1"});
    auto client = make_client("shm");
    auto t = client.connect(agent.address());
    REQUIRE(t);
    REQUIRE(echo_sizes(client, *t, {1 << 16}) == 1); // the window is there from here on
    const auto before = agent_counters(client, *t);
    // Under the result threshold (the message), at it, a whole slot, and past the slot.
    const std::size_t slot = (1u << 20) / kWindowSlots;
    CHECK(echo_sizes(client, *t, {kWindowResultMin - 1, kWindowResultMin, slot, slot + 1, 300'000}) == 5);
    const auto after = agent_counters(client, *t);
    CHECK(after.at("window_results") - before.at("window_results") == 2);
    // Arguments go through the slot up to its size, past it in the message.
    CHECK(after.at("window_args") - before.at("window_args") == 1);
}

TEST_CASE("once a session has a bulk window, small calls take no slot and go compact, and a kernel that has answered a "
          "large result gets a slot for its next ones",
          "[integration]") {
    AgentProcess agent("shm");
    auto client = make_client("shm");
    auto t = client.connect(agent.address());
    REQUIRE(t);
    REQUIRE(echo_sizes(client, *t, {1 << 16}) == 1); // the window is there from here on
    auto add = [&](std::uint64_t a) {
        auto r = client.ship(behaviour_kernels::add, *t, a, std::uint64_t{1}).get_as<std::uint64_t>();
        REQUIRE(r);
        CHECK(*r == a + 1);
    };
    add(1); // its code goes with the first call (the full RUN form)
    const auto compact_before = client.stats().compact_runs_sent;
    for (std::uint64_t i = 0; i < 4; ++i) add(i);
    CHECK(client.stats().compact_runs_sent - compact_before == 4);

    // Small arguments, a 64 KiB result: the kernel's first one comes in the message (nothing
    // said it would be large), and teaches the client to offer a slot to its later calls.
    auto many_bytes = [&](std::uint64_t n) {
        auto r = client.ship(bulk_kernels::many_bytes, *t, n).get();
        INFO((r ? "" : r.error().describe()));
        REQUIRE(r);
        REQUIRE(r->size() == n);
        std::size_t wrong = 0;
        for (std::size_t i = 0; i < n; ++i) wrong += (*r)[i] != static_cast<std::byte>(i);
        CHECK(wrong == 0);
    };
    const auto before = agent_counters(client, *t);
    many_bytes(1 << 16);
    CHECK(agent_counters(client, *t).at("window_results") == before.at("window_results"));
    const auto compact_between = client.stats().compact_runs_sent;
    many_bytes(1 << 16);
    many_bytes(1 << 17);
    CHECK(agent_counters(client, *t).at("window_results") - before.at("window_results") == 2);
    CHECK(client.stats().compact_runs_sent == compact_between); // a slot: the full RUN form
    // Small calls to other kernels still take none.
    add(5);
    CHECK(client.stats().compact_runs_sent == compact_between + 1);
}

TEST_CASE("more bulk calls in flight than window slots each get their own bytes back", "[integration]") {
    AgentProcess agent("shm", {"--workers", "2"});
    auto client = make_client("shm");
    auto t = client.connect(agent.address());
    REQUIRE(t);
    REQUIRE(echo_sizes(client, *t, {1 << 16}) == 1); // the window is there from here on
    constexpr int kCalls = 4 * kWindowSlots;
    std::vector<Bytes> sent;
    std::vector<Future> calls;
    for (int i = 0; i < kCalls; ++i) {
        sent.push_back(pattern(100'000 + 4096 * i, 100 + i));
        calls.push_back(client.ship_bytes(behaviour_kernels::echo, *t, sent.back()));
    }
    int intact = 0;
    for (int i = 0; i < kCalls; ++i) {
        auto r = calls[i].get();
        INFO("call " << i << ": " << (r ? "" : r.error().describe()));
        REQUIRE(r);
        intact += *r == sent[i];
    }
    CHECK(intact == kCalls);
    auto c = agent_counters(client, *t);
    CHECK(c["window_args"] >= kWindowSlots);
    // Slots free again once answered: later calls use the window too.
    const auto before = c["window_args"];
    CHECK(echo_sizes(client, *t, {1 << 17, 1 << 18}) == 2);
    CHECK(agent_counters(client, *t)["window_args"] == before + 2);
}

TEST_CASE("over TCP, or with windows turned off, bulk calls take UCX's path", "[integration]") {
    SECTION("tcp") {
        AgentProcess agent("tcp");
        auto client = make_client("tcp");
        auto t = client.connect(agent.address());
        REQUIRE(t);
        // Each size again after a larger one: landed in a slot an earlier call left (wiped),
        // every byte of it overwritten (echo checks them all).
        CHECK(echo_sizes(client, *t, {1 << 16, 1 << 20, 1 << 16, 300'000, 1 << 20}) == 5);
        auto c = agent_counters(client, *t);
        CHECK(c["window_args"] == 0);
        CHECK(c["window_results"] == 0);
        CHECK(c["landed_args"] >= 5); // in the sandbox arena, read there (and the first RUN, before NEED_CODE)
    }
    SECTION("tcp, no sandbox: arguments are received into kept buffers") {
        AgentProcess agent("tcp", {"--sandbox", "none"});
        auto client = make_client("tcp");
        auto t = client.connect(agent.address());
        REQUIRE(t);
        // Each size again after a larger one: received into a buffer an earlier RUN left,
        // every byte of it overwritten (echo checks them all).
        CHECK(echo_sizes(client, *t, {1 << 16, 1 << 20, 1 << 16, 300'000, 1 << 20}) == 5);
        auto c = agent_counters(client, *t);
        CHECK(c["landed_args"] == 0); // no arena to land in
        if (malloc_is_tunable())
            CHECK(c["receive_buffers_reused"] >= 1);
        else // a sanitizer's build keeps none (its use-after-free checks need them freed)
            CHECK(c["receive_buffers_reused"] == 0);
    }
    SECTION("xagent --bulk-window-mib 0") {
        AgentProcess agent("shm", {"--bulk-window-mib", "0"});
        auto client = make_client("shm");
        auto t = client.connect(agent.address());
        REQUIRE(t);
        CHECK(echo_sizes(client, *t, {1 << 16, 1 << 20, 1 << 16}) == 3);
        auto c = agent_counters(client, *t);
        CHECK(c["window_args"] == 0);
        CHECK(c["window_results"] == 0);
    }
}

TEST_CASE("a result handed back (Client::recycle) receives later large results, every byte of them", "[integration]") {
    AgentProcess agent("tcp");
    auto client = make_client("tcp");
    auto t = client.connect(agent.address());
    REQUIRE(t);
    auto echo = [&](std::size_t size, std::uint64_t seed) {
        auto args = pattern(size, seed);
        auto r = client.ship_bytes(behaviour_kernels::echo, *t, args).get();
        INFO(size << " bytes: " << (r ? "" : r.error().describe()));
        REQUIRE(r);
        CHECK(*r == args);
        return std::move(*r);
    };
    auto first = echo(1 << 20, 1);
    const auto* storage = first.data();
    const auto reused_before = client.stats().receive_buffers_reused;
    client.recycle(std::move(first));
    // Smaller, then as large again: what the kept buffer held is overwritten (echo compares
    // every byte), and nothing reads past a result's own size.
    auto second = echo(300'000, 2);
    const bool kept = malloc_is_tunable(); // a sanitizer's build keeps none
    CHECK((second.data() == storage) == kept);
    client.recycle(std::move(second));
    auto third = echo(1 << 20, 3);
    CHECK(client.stats().receive_buffers_reused == reused_before + (kept ? 2 : 0));
    client.recycle(Bytes(16)); // too small to keep: freed, and nothing else changes
    CHECK(echo(1 << 16, 4).size() == 1 << 16);
}

TEST_CASE("arguments shared by many calls (ship_shared) arrive intact and are let go once answered", "[integration]") {
    std::string transport = "tcp";
    std::vector<std::string> flags;
    bool split = true; // the large arguments go as split messages (the agent's WELCOME allows them)
    SECTION("tcp") {}
    SECTION("shm, through the window") {
        transport = "shm";
        split = false;
    }
    SECTION("shm, windows off") {
        transport = "shm";
        flags = {"--bulk-window-mib", "0"};
    }
    AgentProcess agent(transport, flags);
    auto client = make_client(transport);
    auto t = client.connect(agent.address());
    REQUIRE(t);
    // The first call brings the code (NEED_CODE, then the RUN again from the same buffer).
    // Sizes: by rendezvous (1 MiB, 100,000 B), just over the split threshold and over UCX's
    // 8 KiB segment (20,000 B), and too small to split (100 B).
    const std::vector<std::shared_ptr<const Bytes>> buffers = {
        std::make_shared<const Bytes>(pattern(1 << 20, 7)), std::make_shared<const Bytes>(pattern(100'000, 8)),
        std::make_shared<const Bytes>(pattern(20'000, 9)), std::make_shared<const Bytes>(pattern(100, 10))};
    for (int round = 0; round < 2; ++round) {
        std::vector<Future> calls;
        for (int i = 0; i < 16; ++i) calls.push_back(client.ship_shared(behaviour_kernels::echo, *t, buffers[i % 4]));
        int intact = 0;
        for (std::size_t i = 0; i < calls.size(); ++i) {
            auto r = calls[i].get();
            INFO("call " << i << ": " << (r ? "" : r.error().describe()));
            REQUIRE(r);
            intact += *r == *buffers[i % 4];
        }
        CHECK(intact == 16);
    }
    CHECK(*buffers[0] == pattern(1 << 20, 7)); // nobody wrote to the caller's buffer
    if (split) {
        CHECK(client.stats().split_runs_sent >= 24); // the three large buffers' calls, both rounds
        // Their arguments landed in the agent's sandbox arena and were read there, while slots were free.
        CHECK(agent_counters(client, *t)["landed_args"] > 0);
    }
    // Once answered (and UCX done sending), no call holds the buffers any more.
    auto held = [&] {
        return std::any_of(buffers.begin(), buffers.end(), [](const auto& b) { return b.use_count() > 1; });
    };
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (held() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    for (const auto& b : buffers) CHECK(b.use_count() == 1);
    // An empty or null buffer is a call with no arguments.
    auto none = client.ship_shared(behaviour_kernels::echo, *t, nullptr).get();
    REQUIRE(none);
    CHECK(none->empty());
}

TEST_CASE("a RUN that misuses a bulk window is refused, naming what was wrong", "[integration]") {
    AgentProcess agent("shm");
    RawPeer raw("shm", agent.port());
    auto run_with = [](std::uint64_t id, wire::WindowUse use) {
        wire::Run r;
        r.hash.fill(1);
        r.entry = "add";
        r.window = use;
        return wire::encode_run(id, r);
    };
    SECTION("a window the session never asked for") {
        raw.send(run_with(31, {0, 16, 0, 64}));
        auto [code, message] = raw.error_for(31);
        CHECK(code == Errc::invalid_argument);
        CHECK_THAT(message, Catch::Contains("bulk window"));
    }
    SECTION("ranges outside the window") {
        raw.send(wire::encode_request(wire::Type::window, 40));
        auto info = raw.wait(wire::Type::region_info, 40);
        REQUIRE(info);
        auto m = wire::decode(info->header, info->payload);
        REQUIRE(m);
        const auto size = std::get<wire::RegionInfo>(m->body).size;
        CHECK(size == 16u << 20);
        raw.send(run_with(41, {size - 8, 16, 0, 64}));
        auto [code, message] = raw.error_for(41);
        CHECK(code == Errc::out_of_bounds);
        CHECK_THAT(message, Catch::Contains("bulk window"));
        raw.send(run_with(42, {0, 16, ~std::uint64_t{0} - 4, 64}));
        auto [code2, message2] = raw.error_for(42);
        CHECK(code2 == Errc::out_of_bounds);
        raw.send(run_with(43, {0, (4u << 20), 0, 64}));
        auto [code3, message3] = raw.error_for(43);
        CHECK(code3 == Errc::too_large);
        // A good use of it still works: code is missing, so NEED_CODE.
        raw.send(run_with(44, {0, 16, 0, 64}));
        CHECK(raw.wait(wire::Type::need_code, 44));
    }
    auto client = make_client("shm");
    auto t = client.connect(agent.address());
    REQUIRE(t);
    CHECK(echo_sizes(client, *t, {1 << 20}) == 1);
}

TEST_CASE("a draining agent opens no bulk window: it is going, and the window's shared memory with it", "[integration]") {
    AgentProcess agent("shm", {"--workers", "1", "--kernel-timeout-ms", "2000"});
    {
        RawPeer before("shm", agent.port());
        before.send(wire::encode_request(wire::Type::window, 5));
        REQUIRE(before.wait(wire::Type::region_info, 5)); // a window, while the agent serves
    }
    auto client = make_client("shm");
    auto t = bitship::test::connect(client, agent);
    auto in_flight = client.ship(behaviour_kernels::spin_forever, t); // holds the drain up to its 2 s budget
    // Once its code has arrived the call is compiling or running, and the drain waits for it (a
    // drain before that would refuse the call, end at once and take the agent away).
    bitship::test::wait_until([&] { return agent_counters(client, t)["code_received"] >= 1; },
                              "the agent to receive the code", std::chrono::seconds(20),
                              std::chrono::milliseconds(5));
    REQUIRE(bitship::test::xctl_json(agent, "drain")["ok"] == true);
    RawPeer after("shm", agent.port());
    after.send(wire::encode_request(wire::Type::window, 6));
    auto refused = after.wait(wire::Type::error, 6);
    INFO(agent.log());
    REQUIRE(refused);
    auto m = wire::decode(refused->header, refused->payload);
    REQUIRE(m);
    const auto& e = std::get<wire::ErrorMsg>(m->body);
    CHECK(e.code == Errc::shutting_down);
    CHECK_THAT(std::string(e.message), Catch::Contains("opens no bulk window"));
    auto finished = in_flight.get();
    REQUIRE_FALSE(finished);
    CHECK(finished.error().code == Errc::kernel_timeout); // answered, not dropped
}

}  // namespace bulk_window_test_cpp
