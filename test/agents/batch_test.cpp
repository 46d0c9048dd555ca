// Many calls as one message (Engine::Cork, wire BATCH): a Client::batch() of small calls goes
// to the agent in a few BATCH messages and comes back the same way, every call with its own
// answer, cold code and errors included; a BATCH that is malformed is refused as a whole and
// the agent serves on.

#include <catch2/catch.hpp>

#include <chrono>
#include <cstring>
#include <thread>

#include <bitship/client.hpp>
#include <behaviour_kernels.hpp>

#include "core/wire.hpp"
#include "launcher.hpp"
#include "raw_peer.hpp"
#include "test_support.hpp"

namespace batch_test_cpp {

using namespace bitship;
using bitship::launch::AgentProcess;
using bitship::test::agent_counters;
using bitship::test::make_client;
using bitship::test::RawPeer;

namespace {

Bytes word(std::uint64_t v) {
    Bytes b(8);
    std::memcpy(b.data(), &v, 8);
    return b;
}

/// Sends `n` echo calls in one batch (every third fails on purpose) and checks each answer.
void batch_of_echoes(Client& client, const Target& t, std::uint64_t first, std::size_t n) {
    auto batch = client.batch();
    for (std::size_t i = 0; i < n; ++i) {
        if (i % 3 == 2) batch.add(behaviour_kernels::fail_with_42, t, std::uint64_t{0});
        else batch.add_bytes(behaviour_kernels::echo, t, word(first + i));
    }
    auto futures = batch.submit();
    REQUIRE(futures.size() == n);
    for (std::size_t i = 0; i < n; ++i) {
        auto r = futures[i].get();
        INFO("call " << i);
        if (i % 3 == 2) {
            REQUIRE_FALSE(r);
            CHECK(r.error().code == Errc::kernel_failed);
            CHECK_THAT(r.error().message, Catch::Contains("42"));
        } else {
            INFO((r ? std::string() : r.error().describe()));
            REQUIRE(r);
            CHECK(*r == word(first + i));
        }
    }
}

} // namespace

TEST_CASE("a Batch of small calls travels as BATCH messages both ways and every call gets its own answer",
          "[integration]") {
    for (const char* transport : {"tcp", "shm"}) {
        INFO(transport);
        AgentProcess agent(transport);
        auto client = make_client(transport);
        auto t = client.connect(agent.address());
        REQUIRE(t);
        // Cold: neither kernel's code is on the agent; the batch's first call of each carries
        // it and the others wait for it or are asked for it.
        batch_of_echoes(client, *t, 1000, 60);
        // Cached: 300 calls, several BATCHes of at most Engine::kBatchBytes.
        batch_of_echoes(client, *t, 5000, 300);
        auto c = agent_counters(client, *t);
        CHECK(c["batches_received"] >= 2);
        CHECK(c["runs"] == 360);
        // The answers go together when they are ready together: on the thread that took the
        // BATCH, or, when the engine's thread took it (it progresses while a kernel runs long,
        // e.g. one whose thread lost its core), as the pool's workers finish them. How many
        // are ready at once is the scheduler's say, so a loaded machine may take more rounds.
        std::uint64_t runs = 360;
        for (int round = 0; round < 10 && c["batches_sent"] < 2; ++round) {
            batch_of_echoes(client, *t, 9000, 300);
            runs += 300;
            c = agent_counters(client, *t);
        }
        CHECK(c["batches_sent"] >= 2);
        CHECK(c["runs"] == runs);
        // Calls one at a time are not batched: the counters do not move.
        REQUIRE(client.ship(behaviour_kernels::echo, *t, std::uint64_t{7}).get());
        auto after = agent_counters(client, *t);
        CHECK(after["batches_received"] == c["batches_received"]);
    }
}

TEST_CASE("a Batch the engine's thread took while the worker ran a long kernel is answered in BATCH messages too",
          "[integration]") {
    // One worker, busy with a long kernel: the engine's thread takes the BATCH (it progresses
    // while a kernel runs long) and queues its calls; the worker runs them when the long one
    // ends, and their answers go together as the worker finishes them.
    AgentProcess agent("shm", {"--workers", "1"});
    auto client = make_client("shm");
    auto t = client.connect(agent.address());
    REQUIRE(t);
    REQUIRE(client.ship(behaviour_kernels::busy_count, *t, std::uint64_t{1}).get()); // compiled
    batch_of_echoes(client, *t, 1, 3);
    const auto before = agent_counters(client, *t);
    std::uint64_t runs = 4;
    // How many answers are ready at once is the scheduler's say: a loaded machine may take
    // more rounds.
    auto c = before;
    for (int round = 0; round < 5 && c["batches_sent"] == before.at("batches_sent"); ++round) {
        auto blocker = client.ship(behaviour_kernels::busy_count, *t, std::uint64_t{300'000'000});
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        batch_of_echoes(client, *t, 100'000, 120);
        REQUIRE(blocker.get());
        runs += 121;
        c = agent_counters(client, *t);
    }
    CHECK(c["batches_sent"] > before.at("batches_sent"));
    CHECK(c["runs"] == runs);
}

TEST_CASE("a malformed BATCH is refused as a whole, naming why, and the agent serves on", "[integration]") {
    AgentProcess agent("shm");
    RawPeer raw("shm", agent.port());
    auto run = [](std::uint64_t id) {
        wire::Run r;
        r.hash.fill(7);
        r.entry = "echo";
        return wire::encode_run(id, r);
    };
    auto refused = [&raw](const wire::Encoded& b, const char* why) {
        raw.send(b);
        auto [code, message] = raw.error_for(b.header.request_id);
        CHECK(code == Errc::malformed_message);
        CHECK_THAT(message, Catch::Contains(why));
    };
    SECTION("a message cut short inside it") {
        auto b = wire::encode_request(wire::Type::batch, 77);
        wire::append_to_batch(b, run(51));
        wire::append_to_batch(b, run(52));
        b.payload.resize(b.payload.size() - 3);
        b.header.payload_size = static_cast<std::uint32_t>(b.payload.size());
        refused(b, "BATCH message 1");
    }
    SECTION("a BATCH inside a BATCH") {
        auto inner = wire::encode_request(wire::Type::batch, 0);
        wire::append_to_batch(inner, run(53));
        auto b = wire::encode_request(wire::Type::batch, 78);
        wire::append_to_batch(b, run(54));
        wire::append_to_batch(b, inner);
        refused(b, "inside a BATCH");
    }
    SECTION("a message with a bad header inside it") {
        auto bad = run(55);
        bad.header.magic = 0x12345678;
        auto b = wire::encode_request(wire::Type::batch, 79);
        wire::append_to_batch(b, bad);
        refused(b, "magic");
    }
    // Nothing of a refused batch ran; a good one is answered message by message.
    auto good = wire::encode_request(wire::Type::batch, 80);
    wire::append_to_batch(good, run(61));
    wire::append_to_batch(good, run(62));
    raw.send(good);
    CHECK(raw.wait(wire::Type::need_code, 61));
    CHECK(raw.wait(wire::Type::need_code, 62));
    auto client = make_client("shm");
    auto t = client.connect(agent.address());
    REQUIRE(t);
    auto c = agent_counters(client, *t);
    CHECK(c["malformed_messages"] == 1);
    CHECK(c["runs"] == 2); // the good batch's two RUNs; none of the refused one
    auto r = client.ship(behaviour_kernels::echo, *t, std::uint64_t{9}).get();
    REQUIRE(r);
}

}  // namespace batch_test_cpp
