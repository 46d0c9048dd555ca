// Groups of calls (Client::ship_each) through real agents: one RUN, one RESULT, every call its
// own — its result or its error, a crash or a timeout stopping that call alone — cold code and
// both sandbox modes, the counters and per-kernel stats counting calls, what is refused, and a
// drain in the middle of a group.

#include <catch2/catch.hpp>

#include <sys/wait.h>

#include <array>
#include <csignal>
#include <cstring>
#include <thread>

#include <bitship/client.hpp>
#include <behaviour_kernels.hpp>

#include "launcher.hpp"
#include "test_support.hpp"

namespace call_group_test_cpp {

using namespace bitship;
using bitship::launch::AgentProcess;
using bitship::test::agent_counters;
using bitship::test::make_client;

namespace {

enum What : std::uint64_t { kAnswer = 0, kFail = 1, kCrash = 2, kSpin = 3, kBytes = 4, kCount = 5 };
std::uint64_t member(What what, std::uint64_t value) { return (std::uint64_t{what} << 56) | value; }

const nlohmann::json* kernel_entry(const nlohmann::json& stats, std::string_view entry) {
    for (const auto& k : stats["kernels"])
        if (k["entry"] == entry) return &k;
    return nullptr;
}

} // namespace

TEST_CASE("a group of calls is one RUN and one RESULT, and every call has its own answer in order", "[integration]") {
    for (const char* transport : {"tcp", "shm"}) {
        for (const char* sandbox : {"sfi", "none"}) {
            INFO(transport << " --sandbox " << sandbox);
            AgentProcess agent(transport, {"--sandbox", sandbox, "--workers", "1"});
            auto client = make_client(transport);
            auto t = bitship::test::connect(client, agent);
            // Cold: the group's RUN carries the code; 1000 calls of `add` (16 bytes each).
            struct AddArgs {
                std::uint64_t a, b;
            };
            std::vector<AddArgs> adds;
            for (std::uint64_t i = 0; i < 1000; ++i) adds.push_back({i, 1000 * i});
            auto cold = client.ship_each(behaviour_kernels::add, t, adds).get();
            INFO((cold ? std::string() : cold.error().describe()) << agent.log());
            REQUIRE(cold);
            REQUIRE(cold->size() == 1000);
            CHECK(cold->failures() == 0);
            for (std::uint64_t i = 0; i < 1000; ++i) {
                auto v = cold->get_as<std::uint64_t>(i);
                REQUIRE(v);
                CHECK(*v == 1001 * i);
            }
            // Cached, 24-byte argument sets (padded to 32 on the wire): echo answers exactly its 24.
            std::vector<std::array<std::uint64_t, 3>> triples;
            for (std::uint64_t i = 0; i < 300; ++i) triples.push_back({i, ~i, i * i});
            auto echoes = client.ship_each(behaviour_kernels::echo, t, triples).get();
            REQUIRE(echoes);
            REQUIRE(echoes->size() == 300);
            for (std::size_t i = 0; i < 300; ++i) {
                auto v = echoes->get_as<std::array<std::uint64_t, 3>>(i);
                REQUIRE(v);
                CHECK(*v == triples[i]);
            }
            // Several groups in flight at once, each answered whole.
            std::vector<EachFuture> groups;
            for (std::uint64_t g = 0; g < 8; ++g) {
                std::vector<AddArgs> args(64, AddArgs{g, 0});
                groups.push_back(client.ship_each(behaviour_kernels::add, t, args));
            }
            for (std::uint64_t g = 0; g < 8; ++g) {
                auto r = groups[g].get();
                REQUIRE(r);
                for (std::size_t i = 0; i < r->size(); ++i) CHECK(r->get_as<std::uint64_t>(i).value_or(~0ull) == g);
            }
            auto c = agent_counters(client, t);
            CHECK(c["group_runs"] == 10);
            CHECK(c["group_calls"] == 1000 + 300 + 8 * 64);
            CHECK(c["runs"] == 10);
            CHECK(c["results"] == 1000 + 300 + 8 * 64);
            CHECK(c["errors"] == 0);
        }
    }
}

TEST_CASE("a call of a group that fails, crashes or runs too long stops alone and the others answer", "[integration]") {
    for (const char* sandbox : {"sfi", "none"}) {
        INFO("--sandbox " << sandbox);
        AgentProcess agent("shm", {"--sandbox", sandbox, "--workers", "1", "--kernel-timeout-ms", "300"});
        auto client = make_client("shm");
        auto t = bitship::test::connect(client, agent);
        const std::vector<std::uint64_t> args{member(kAnswer, 10), member(kFail, 7),  member(kAnswer, 20), member(kCrash, 0),
                                              member(kAnswer, 30), member(kBytes, 0), member(kAnswer, 40), member(kBytes, 3),
                                              member(kAnswer, 50), member(kSpin, 0)};
        auto r = client.ship_each(behaviour_kernels::group_member, t, args).get();
        INFO((r ? std::string() : r.error().describe()) << agent.log());
        REQUIRE(r);
        REQUIRE(r->size() == args.size());
        CHECK(r->failures() == 3);
        for (std::size_t i : {0u, 2u, 4u, 6u, 8u}) CHECK(r->get_as<std::uint64_t>(i).value_or(0) == (i / 2 + 1) * 10 + 1);
        auto failed = r->at(1);
        REQUIRE_FALSE(failed);
        CHECK(failed.error().code == Errc::kernel_failed);
        CHECK_THAT(failed.error().message, Catch::Contains("failed with code 7: group_member was told to fail"));
        // Named as a single call's error is: the agent, then which call of the group.
        CHECK_THAT(failed.error().message, Catch::StartsWith(fmt::format("agent {}: call 1 of 10: ", agent.address())));
        auto crashed = r->at(3);
        REQUIRE_FALSE(crashed);
        CHECK(crashed.error().code == Errc::kernel_crashed);
        CHECK_THAT(crashed.error().message, Catch::Contains("SIGSEGV"));
        auto spun = r->at(9);
        REQUIRE_FALSE(spun);
        CHECK(spun.error().code == Errc::kernel_timeout);
        CHECK_THAT(spun.error().message, Catch::Contains("ran past its 300 ms budget"));
        auto three = r->at(7);
        REQUIRE(three);
        CHECK(three->size() == 3);
        CHECK(std::all_of(three->begin(), three->end(), [](std::byte b) { return b == std::byte{0xab}; }));
        REQUIRE(r->at(5));
        CHECK(r->at(5)->empty());
        auto wrong = r->get_as<std::uint64_t>(7);
        REQUIRE_FALSE(wrong);
        CHECK_THAT(wrong.error().message, Catch::Contains("call 7's reply has 3 bytes, expected 8"));
        CHECK_FALSE(r->at(10));

        auto c = agent_counters(client, t);
        CHECK(c["kernel_failures"] == 1);
        CHECK(c["kernel_crashes"] == 1);
        CHECK(c["kernel_timeouts"] == 1);
        CHECK(c["errors"] == 3);
        CHECK(c["results"] == 7);
        // Per kernel: ten calls, three errors by code, the bytes each way.
        auto stats = bitship::test::xctl_json(agent, "stats");
        const auto* k = kernel_entry(stats, "group_member");
        INFO(stats.dump(2));
        REQUIRE(k);
        CHECK((*k)["calls"] == 10);
        CHECK((*k)["runs"] == 10);
        CHECK((*k)["errors"]["kernel_failed"] == 1);
        CHECK((*k)["errors"]["kernel_crashed"] == 1);
        CHECK((*k)["errors"]["kernel_timeout"] == 1);
        CHECK((*k)["bytes_in"] == 10 * 8); // the calls' arguments, not the padding between them
        // A call that runs past its budget stops the group there: the calls after it are not run,
        // so a group of hung calls holds the worker for one budget, not one per call.
        const std::vector<std::uint64_t> hung{member(kAnswer, 1), member(kSpin, 0), member(kSpin, 0), member(kAnswer, 2)};
        auto h = client.ship_each(behaviour_kernels::group_member, t, hung).get();
        REQUIRE(h);
        CHECK(h->get_as<std::uint64_t>(0).value_or(0) == 2);
        for (std::size_t i : {2u, 3u}) {
            auto skipped = h->at(i);
            REQUIRE_FALSE(skipped);
            CHECK(skipped.error().code == Errc::kernel_timeout);
            CHECK_THAT(skipped.error().message, Catch::Contains("not run: call 1 of the group ran past its budget"));
        }
        CHECK(agent_counters(client, t)["kernel_timeouts"] == 2); // the second spin never ran
        // The agent serves on: a single call after the groups.
        CHECK(client.ship(behaviour_kernels::add, t, std::uint64_t{2}, std::uint64_t{3}).get_as<std::uint64_t>().value_or(0) == 5);
    }
}

TEST_CASE("groups the client or the agent cannot make are refused naming why", "[integration]") {
    AgentProcess agent("tcp", {"--max-result", "4096"});
    auto client = make_client("tcp");
    auto t = bitship::test::connect(client, agent);
    SECTION("no calls: answered at once with none") {
        auto r = client.ship_each(behaviour_kernels::add, t, std::vector<std::uint64_t>{}).get();
        REQUIRE(r);
        CHECK(r->size() == 0);
        CHECK(agent_counters(client, t)["runs"] == 0);
    }
    SECTION("more calls than a group holds") {
        std::vector<std::uint32_t> many(65537);
        auto r = client.ship_each(behaviour_kernels::add, t, many).get();
        REQUIRE_FALSE(r);
        CHECK(r.error().code == Errc::too_large);
        CHECK_THAT(r.error().message, Catch::Contains("at most 65536 calls"));
    }
    SECTION("arguments that are not count × size bytes") {
        std::vector<std::byte> bytes(20);
        auto r = client.ship_each_bytes(behaviour_kernels::add, t, 3, 8, bytes).get();
        REQUIRE_FALSE(r);
        CHECK(r.error().code == Errc::invalid_argument);
        CHECK_THAT(r.error().message, Catch::Contains("needs 24 bytes, not 20"));
    }
    SECTION("calls that would forward, or ask for a GPU") {
        ShipOptions forward;
        forward.forward = true;
        auto r = client.ship_each(behaviour_kernels::add, t, std::vector<std::uint64_t>{1}, forward).get();
        REQUIRE_FALSE(r);
        CHECK_THAT(r.error().message, Catch::Contains("cannot forward"));
        ShipOptions gpu;
        gpu.device = Device::gpu;
        auto g = client.ship_each(behaviour_kernels::add, t, std::vector<std::uint64_t>{1}, gpu).get();
        REQUIRE_FALSE(g);
        CHECK_THAT(g.error().message, Catch::Contains("run on the agent's CPU"));
    }
    SECTION("a group whose answers cannot fit the agent's max_result") {
        // 4 + 400 × 11 bytes of the smallest answers exceed 4096.
        std::vector<std::uint64_t> args(400, member(kAnswer, 1));
        auto r = client.ship_each(behaviour_kernels::group_member, t, args).get();
        REQUIRE_FALSE(r);
        CHECK(r.error().code == Errc::too_large);
        CHECK_THAT(r.error().message, Catch::Contains("a group of 400 calls needs at least 4404 bytes of answers"));
    }
    SECTION("calls whose answers together outgrow max_result: the late ones fail, each with an answer") {
        // 20 calls of 256 bytes: 261 bytes each as results; the first 15 fit in 4096 with room
        // kept for the rest, which are refused their reply (bs_reply fails, so they answer nothing).
        std::vector<std::uint64_t> args(20, member(kBytes, 256));
        auto r = client.ship_each(behaviour_kernels::group_member, t, args).get();
        INFO((r ? std::string() : r.error().describe()));
        REQUIRE(r);
        REQUIRE(r->size() == 20);
        std::size_t full = 0;
        for (std::size_t i = 0; i < 20; ++i) full += r->at(i) && r->at(i)->size() == 256;
        CHECK(full >= 14);
        CHECK(full < 20);
        for (std::size_t i = 0; i < full; ++i) CHECK(r->at(i)->size() == 256);
    }
    // Whatever was refused, the agent serves on.
    CHECK(client.ship(behaviour_kernels::add, t, std::uint64_t{1}, std::uint64_t{1}).get_as<std::uint64_t>().value_or(0) == 2);
}

TEST_CASE("a drain or a stop in the middle of a long group runs none of its calls not yet started", "[integration]") {
    AgentProcess agent("shm", {"--workers", "1", "--kernel-timeout-ms", "20000"});
    auto client = make_client("shm");
    auto t = bitship::test::connect(client, agent);
    // The code is compiled first, so the drain cannot land while the group waits for its compile
    // (a slow sanitizer build took more than the old fixed 200 ms wait, and CI saw the group
    // refused whole as a new call to a draining agent).
    REQUIRE(client.ship(behaviour_kernels::group_member, t, member(kAnswer, 1)).get());
    // 2000 calls of 50 million counts each: the better part of a minute of work here.
    const std::vector<std::uint64_t> args(2000, member(kCount, 50));
    auto group = client.ship_each(behaviour_kernels::group_member, t, args);
    // Wait until the group is running (the agent counts a group as it starts it).
    bitship::test::wait_until([&] { return agent_counters(client, t)["group_runs"] >= 1; },
                              "the group to start", std::chrono::seconds(20),
                              std::chrono::milliseconds(20));
    SECTION("xctl drain: the group is answered, the calls not started as not run, and the agent exits") {
        auto drain = bitship::test::xctl_json(agent, "drain");
        REQUIRE(drain["ok"] == true);
        auto r = group.get();
        INFO((r ? std::string() : r.error().describe()) << agent.log());
        REQUIRE(r); // answered whole, not dropped
        REQUIRE(r->size() == args.size());
        CHECK(r->get_as<std::uint64_t>(0).value_or(0) == 50); // the first call ran
        auto last = r->at(args.size() - 1);
        REQUIRE_FALSE(last);
        CHECK(last.error().code == Errc::shutting_down);
        CHECK_THAT(last.error().message, Catch::Contains("not run: the agent is draining"));
        CHECK(r->failures() < args.size());
        auto status = bitship::test::wait_for_exit(agent);
        REQUIRE(status);
        CHECK(WIFEXITED(*status));
    }
    SECTION("SIGTERM: the agent exits at once, not after the rest of the group") {
        REQUIRE(kill(agent.pid(), SIGTERM) == 0);
        auto status = bitship::test::wait_for_exit(agent); // 10 s, where the rest would take tens
        INFO(agent.log());
        REQUIRE(status);
        CHECK(WIFEXITED(*status));
        // Answered or not (the answer races the agent's exit), the group ends: no hang.
        CHECK(group.wait_for(std::chrono::seconds(10)));
    }
}

}  // namespace call_group_test_cpp
