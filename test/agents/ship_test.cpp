#include <dlfcn.h>
#include <sys/resource.h>
#include <unistd.h>
// Integration tests: real xagent processes, real UCX over loopback (TCP and shared memory),
// real LLVM JIT. Nothing here is pre-installed on the agents: every kernel travels as bitcode.

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
#include <forbidden_kernels.hpp>
#include <forged_kernels.hpp>
#include <other_arch_kernels.hpp>

#include "core/wire.hpp"
#include "launcher.hpp"
#include "test_support.hpp"

namespace ship_test_cpp {

using namespace bitship;
using bitship::test::make_client;
using bitship::test::agent_counters;
using bitship::test::connect;
using bitship::launch::AgentProcess;
using namespace std::chrono_literals;

TEST_CASE("a shipped kernel returns the right result", "[integration]") {
    auto transport = GENERATE(as<std::string>{}, "tcp", "shm");
    INFO("transport " << transport);
    AgentProcess agent(transport);
    auto client = make_client(transport);
    auto target = connect(client, agent);
    CHECK(target.info().triple.find("x86_64") == 0);
    CHECK(target.info().llvm.major >= 19);

    auto sum = client.ship(behaviour_kernels::add, target, std::uint64_t{40}, std::uint64_t{2}).get_as<std::uint64_t>();
    INFO(agent.log());
    REQUIRE(sum);
    CHECK(*sum == 42);
}

TEST_CASE("ship() arguments arrive as the C struct of their members, small ones (kept in the call) and larger ones alike",
          "[integration]") {
    AgentProcess agent("shm");
    auto client = make_client("shm");
    auto target = connect(client, agent);
    auto echoed = [&](auto... args) {
        auto r = client.ship(behaviour_kernels::echo, target, args...).get();
        INFO((r ? "" : r.error().describe()));
        REQUIRE(r);
        CHECK(*r == Client::pack_args(args...));
        return r->size();
    };
    CHECK(echoed() == 0);
    // Padding between and after members, zeroed: {u8, u64, u16} is 24 bytes.
    CHECK(echoed(std::uint8_t{0xab}, std::uint64_t{0x1122334455667788}, std::uint16_t{0xcdef}) == 24);
    std::array<std::uint64_t, 8> eight{};
    std::array<std::uint64_t, 9> nine{};
    for (std::size_t i = 0; i < nine.size(); ++i) nine[i] = (i + 1) * 0x0101010101010101ull;
    std::copy_n(nine.begin(), eight.size(), eight.begin());
    CHECK(echoed(eight) == 64); // the most a call keeps in its state
    CHECK(echoed(nine) == 72);  // one word more: a buffer of their own
    CHECK(echoed(eight, std::uint32_t{7}) == 72);
    // With options too (a peer table of one: the full RUN form).
    auto r = client.ship(behaviour_kernels::echo, target, ShipOptions{.peers = {target}}, eight).get();
    REQUIRE(r);
    CHECK(*r == Client::pack_args(eight));
    // And through a Batch, the same way.
    auto batch = client.batch();
    batch.add(behaviour_kernels::echo, target);
    batch.add(behaviour_kernels::echo, target, std::uint8_t{1}, std::uint64_t{2});
    batch.add(behaviour_kernels::echo, target, eight);
    batch.add(behaviour_kernels::echo, target, nine);
    const std::vector<Bytes> want{{}, Client::pack_args(std::uint8_t{1}, std::uint64_t{2}), Client::pack_args(eight),
                                  Client::pack_args(nine)};
    auto answers = batch.submit();
    REQUIRE(answers.size() == want.size());
    for (std::size_t i = 0; i < want.size(); ++i) {
        auto a = answers[i].get();
        REQUIRE(a);
        CHECK(*a == want[i]);
    }
}

TEST_CASE("a kernel that calls system is refused at link time, naming the symbol", "[integration]") {
    auto transport = GENERATE(as<std::string>{}, "tcp", "shm");
    AgentProcess agent(transport);
    auto client = make_client(transport);
    auto target = connect(client, agent);
    auto r = client.ship(forbidden_kernels::run_shell, target).get();
    REQUIRE_FALSE(r);
    CHECK(r.error().code == Errc::unresolved_symbol);
    CHECK_THAT(r.error().message, Catch::Contains("'system'"));
    CHECK_THAT(r.error().message, Catch::Contains(agent.address()));
    // The agent keeps serving.
    auto ok = client.ship(behaviour_kernels::add, target, std::uint64_t{2}, std::uint64_t{2}).get_as<std::uint64_t>();
    REQUIRE(ok);
    CHECK(*ok == 4);
}

TEST_CASE("a kernel that forges a call to system from an exported function's address is stopped before the call",
          "[integration]") {
    auto transport = GENERATE(as<std::string>{}, "tcp", "shm");
    AgentProcess agent(transport);
    auto client = make_client(transport);
    auto target = connect(client, agent);
    // The agent runs the same libc as this test: labs + offset is system there too.
    struct {
        std::int64_t offset;
        char command[64];
    } args{};
    auto* labs_at = reinterpret_cast<char*>(::dlsym(RTLD_DEFAULT, "labs"));
    auto* system_at = reinterpret_cast<char*>(::dlsym(RTLD_DEFAULT, "system"));
    REQUIRE(labs_at != nullptr);
    REQUIRE(system_at != nullptr);
    args.offset = system_at - labs_at;
    const auto witness = std::filesystem::temp_directory_path() / fmt::format("bitship-forged-{}", ::getpid());
    std::filesystem::remove(witness);
    std::snprintf(args.command, sizeof args.command, "touch %s", witness.c_str());
    auto r = client.ship(forged_kernels::forged_call, target, args).get();
    REQUIRE_FALSE(r);
    CHECK(r.error().code == Errc::policy_violation);
    CHECK_THAT(r.error().message, Catch::Contains("no-forged-call"));
    CHECK_FALSE(std::filesystem::exists(witness));
    // Indirect calls to the kernel's own functions still run, and the agent keeps serving.
    auto twice = client.ship(behaviour_kernels::apply, target, std::uint64_t{0}, std::uint64_t{21}).get_as<std::uint64_t>();
    auto square = client.ship(behaviour_kernels::apply, target, std::uint64_t{1}, std::uint64_t{9}).get_as<std::uint64_t>();
    REQUIRE(twice);
    REQUIRE(square);
    CHECK(*twice == 42);
    CHECK(*square == 81);
}

TEST_CASE("a bundle with no slice for the agent's architecture fails with both triples named", "[integration]") {
    AgentProcess agent("tcp");
    auto client = make_client("tcp");
    auto target = connect(client, agent);
    // The client sees it first...
    auto r = client.ship(other_arch_kernels::answer, target).get();
    REQUIRE_FALSE(r);
    CHECK(r.error().code == Errc::no_matching_slice);
    CHECK_THAT(r.error().message, Catch::Contains("aarch64"));
    CHECK_THAT(r.error().message, Catch::Contains(target.info().triple));
    // ... and the agent checks too, when a client sends the slice anyway.
    auto forced = client.ship_slice(other_arch_kernels::bundle(), 0, "answer", target, {}).get();
    REQUIRE_FALSE(forced);
    CHECK(forced.error().code == Errc::no_matching_slice);
    CHECK_THAT(forced.error().message, Catch::Contains("aarch64"));
    auto ok = client.ship(behaviour_kernels::add, target, std::uint64_t{1}, std::uint64_t{1}).get_as<std::uint64_t>();
    REQUIRE(ok);
}

TEST_CASE("kernel failures, crashes and overruns reach the caller and the agent goes on", "[integration]") {
    auto transport = GENERATE(as<std::string>{}, "tcp", "shm");
    AgentProcess agent(transport, {"--kernel-timeout-ms", "300"});
    auto client = make_client(transport);
    auto target = connect(client, agent);

    auto failed = client.ship(behaviour_kernels::fail_with_42, target).get();
    REQUIRE_FALSE(failed);
    CHECK(failed.error().code == Errc::kernel_failed);
    CHECK_THAT(failed.error().message, Catch::Contains("42") && Catch::Contains("the answer is not allowed here"));

    auto crashed = client.ship(behaviour_kernels::write_null, target).get();
    REQUIRE_FALSE(crashed);
    CHECK(crashed.error().code == Errc::kernel_crashed);
    CHECK_THAT(crashed.error().message, Catch::Contains("SIGSEGV"));

    auto spun = client.ship(behaviour_kernels::spin_forever, target).get();
    REQUIRE_FALSE(spun);
    CHECK(spun.error().code == Errc::kernel_timeout);

    // Twice, so a worker that was stopped is known to work again.
    for (int i = 0; i < 2; ++i) {
        auto ok = client.ship(behaviour_kernels::add, target, std::uint64_t{5}, std::uint64_t{6}).get_as<std::uint64_t>();
        INFO(agent.log());
        REQUIRE(ok);
        CHECK(*ok == 11);
    }
    auto c = agent_counters(client, target);
    CHECK(c["kernel_crashes"] == 1);
    CHECK(c["kernel_timeouts"] == 1);
    CHECK(c["kernel_failures"] == 1);
}

TEST_CASE("a kernel answers once: a second reply is refused, silence is an empty result", "[integration]") {
    AgentProcess agent("tcp");
    auto client = make_client("tcp");
    auto target = connect(client, agent);
    auto first = client.ship(behaviour_kernels::reply_twice, target).get_as<std::uint32_t>();
    REQUIRE(first);
    CHECK(*first == 1);
    auto silent = client.ship(behaviour_kernels::silent, target).get();
    REQUIRE(silent);
    CHECK(silent->empty());
    auto missing = client.ship(Kernel{&behaviour_kernels::bundle, "no_such_kernel"}, target).get();
    REQUIRE_FALSE(missing);
    CHECK(missing.error().code == Errc::entry_not_found);
    CHECK_THAT(missing.error().message, Catch::Contains("no_such_kernel"));
}

TEST_CASE("large arguments and results travel by rendezvous, intact", "[integration]") {
    auto transport = GENERATE(as<std::string>{}, "tcp", "shm");
    AgentProcess agent(transport);
    auto client = make_client(transport);
    auto target = connect(client, agent);
    for (std::size_t size : {std::size_t{0}, std::size_t{100}, std::size_t{9000}, std::size_t{300000}}) {
        Bytes args(size);
        for (std::size_t i = 0; i < size; ++i) args[i] = static_cast<std::byte>((i * 131) ^ (i >> 8));
        auto r = client.ship_bytes(behaviour_kernels::echo, target, args).get();
        INFO("size " << size);
        REQUIRE(r);
        CHECK(*r == args);
    }
}

TEST_CASE("get on a future done with moves its result out, and a future shared with copies copies it", "[integration]") {
    AgentProcess agent("tcp");
    auto client = make_client("tcp");
    auto target = connect(client, agent);
    Bytes args(300000);
    for (std::size_t i = 0; i < args.size(); ++i) args[i] = static_cast<std::byte>(i * 7);
    auto shared = client.ship_bytes(behaviour_kernels::echo, target, args);
    auto copy = shared;
    auto first = std::move(shared).get(); // another Future shares the call: a copy
    REQUIRE(first);
    CHECK(*first == args);
    auto again = copy.get(); // so this one still reads it
    REQUIRE(again);
    CHECK(*again == args);
    auto last = std::move(copy).get(); // alone now: moved out
    REQUIRE(last);
    CHECK(*last == args);
    // A future alone from the start, and one that failed.
    auto alone = client.ship_bytes(behaviour_kernels::echo, target, args).get();
    REQUIRE(alone);
    CHECK(*alone == args);
    auto failed = client.ship(behaviour_kernels::fail_with_42, target).get();
    REQUIRE_FALSE(failed);
    CHECK(failed.error().code == Errc::kernel_failed);
    CHECK_FALSE(Future{}.get());
}

TEST_CASE("connecting where no agent listens fails within the connect timeout", "[integration]") {
    ClientOptions o;
    o.loopback_only = true;
    o.connect_timeout = 2s;
    auto client = Client::create(o);
    REQUIRE(client);
    // A port nothing listens on: bind one, learn it, close it.
    AgentProcess briefly("tcp");
    auto port = briefly.port();
    briefly.stop(SIGKILL);
    auto start = std::chrono::steady_clock::now();
    auto t = client->connect("127.0.0.1:" + std::to_string(port));
    auto took = std::chrono::steady_clock::now() - start;
    REQUIRE_FALSE(t);
    CHECK(t.error().code == Errc::connect_failed);
    CHECK_THAT(t.error().message, Catch::Contains(std::to_string(port)));
    CHECK(took < 2s + 1s);
}

TEST_CASE("an agent that dies mid-call fails the pending futures instead of hanging them", "[integration]") {
    auto transport = GENERATE(as<std::string>{}, "tcp", "shm");
    AgentProcess agent(transport, {"--kernel-timeout-ms", "0", "--workers", "2"});
    auto client = make_client(transport, 60s);
    auto target = connect(client, agent);
    auto a = client.ship(behaviour_kernels::spin_forever, target);
    auto b = client.ship(behaviour_kernels::spin_forever, target);
    std::this_thread::sleep_for(300ms); // both are running
    CHECK_FALSE(a.ready());
    agent.stop(SIGKILL);
    REQUIRE(a.wait_for(10s));
    REQUIRE(b.wait_for(10s));
    auto ra = a.get();
    REQUIRE_FALSE(ra);
    CHECK(ra.error().code == Errc::disconnected);
    CHECK_FALSE(b.get());
}

TEST_CASE("ship_chain: dependent calls come back here between them, and any failure ends the walk with it", "[integration]") {
    auto transport = GENERATE(as<std::string>{}, "tcp", "shm");
    INFO("transport " << transport);
    AgentProcess a(transport), b(transport);
    auto client = make_client(transport);
    const std::vector<Target> agents{connect(client, a), connect(client, b)};
    auto u64 = [](std::span<const std::byte> bytes) {
        std::uint64_t v = 0;
        REQUIRE(bytes.size() == sizeof v);
        std::memcpy(&v, bytes.data(), sizeof v);
        return v;
    };
    // Count to 10 one call at a time, alternating agents: each call's answer makes the next.
    const auto runs_before = client.stats().runs_sent;
    unsigned calls = 0;
    auto counted = client.ship_chain(behaviour_kernels::add, {},
                                     [&](std::span<const std::byte> last, Bytes& result) -> Result<std::optional<ShipStep>> {
                                         const std::uint64_t v = last.empty() ? 0 : u64(last);
                                         if (v == 10) {
                                             result.assign(last.begin(), last.end());
                                             return std::nullopt;
                                         }
                                         return ShipStep{&agents[calls++ % 2], Client::pack_args(v, std::uint64_t{1})};
                                     });
    auto ten = counted.get_as<std::uint64_t>();
    INFO(a.log() << b.log());
    REQUIRE(ten);
    CHECK(*ten == 10);
    CHECK(calls == 10);
    CHECK(client.stats().runs_sent - runs_before == 10);

    // A call's error ends the walk with it, naming the kernel's message.
    auto failing = client.ship_chain(behaviour_kernels::fail_with_42, {},
                                     [&](std::span<const std::byte> last, Bytes&) -> Result<std::optional<ShipStep>> {
                                         if (!last.empty()) FAIL("a failed call must not be followed");
                                         return ShipStep{&agents[0], {}};
                                     });
    auto r = failing.get();
    REQUIRE_FALSE(r);
    CHECK(r.error().code == Errc::kernel_failed);
    CHECK(r.error().message.find("not allowed here") != std::string::npos);

    // An error from the walk's own step, a throw, a step without a target.
    auto refused = client.ship_chain(behaviour_kernels::add, {}, [&](std::span<const std::byte> last, Bytes&) -> Result<std::optional<ShipStep>> {
        if (last.empty()) return ShipStep{&agents[1], Client::pack_args(std::uint64_t{1}, std::uint64_t{2})};
        return fail(Errc::malformed_message, "the walk did not like " + std::to_string(u64(last)));
    });
    r = refused.get();
    REQUIRE_FALSE(r);
    CHECK(r.error().code == Errc::malformed_message);
    CHECK(r.error().message == "the walk did not like 3");
    auto thrown = client.ship_chain(behaviour_kernels::add, {}, [](std::span<const std::byte>, Bytes&) -> Result<std::optional<ShipStep>> {
        throw std::runtime_error("step exploded");
    });
    r = thrown.get();
    REQUIRE_FALSE(r);
    CHECK(r.error().code == Errc::internal);
    CHECK(r.error().message.find("step exploded") != std::string::npos);
    auto nowhere = client.ship_chain(behaviour_kernels::add, {}, [](std::span<const std::byte>, Bytes&) -> Result<std::optional<ShipStep>> {
        return ShipStep{nullptr, {}};
    });
    r = nowhere.get();
    REQUIRE_FALSE(r);
    CHECK(r.error().code == Errc::invalid_argument);
    // A target outside the walk's peer table is refused before anything is sent.
    ShipOptions only_a;
    only_a.peers = {agents[0]};
    auto outside = client.ship_chain(behaviour_kernels::add, only_a, [&](std::span<const std::byte>, Bytes&) -> Result<std::optional<ShipStep>> {
        return ShipStep{&agents[1], Client::pack_args(std::uint64_t{1}, std::uint64_t{2})};
    });
    r = outside.get();
    REQUIRE_FALSE(r);
    CHECK(r.error().code == Errc::invalid_argument);
    CHECK(client.stats().stray_replies == 0);
}

TEST_CASE("SIGTERM stops an agent whose kernel never returns and that has no kernel timeout", "[integration]") {
    // Before, the agent waited for the kernel for ever: only SIGKILL ended it.
    AgentProcess agent("tcp", {"--kernel-timeout-ms", "0", "--workers", "1"});
    auto client = make_client("tcp", 60s);
    auto target = connect(client, agent);
    auto spinning = client.ship(behaviour_kernels::spin_forever, target);
    bitship::test::wait_until([&] { return agent_counters(client, target)["code_received"] >= 1; },
                              "the agent to receive the code", 20s, 5ms);
    std::this_thread::sleep_for(200ms); // compiled and running
    CHECK_FALSE(spinning.ready());
    const auto began = std::chrono::steady_clock::now();
    REQUIRE(kill(agent.pid(), SIGTERM) == 0);
    auto status = bitship::test::wait_for_exit(agent, 10s);
    INFO(agent.log());
    REQUIRE(status);
    CHECK(WIFEXITED(*status));
    CHECK(WEXITSTATUS(*status) == 0);
    CHECK(std::chrono::steady_clock::now() - began < 5s); // the grace (1 s), then the kernel is stopped
    REQUIRE(spinning.wait_for(10s));
    auto r = spinning.get();
    REQUIRE_FALSE(r);
    INFO(r.error().describe());
    // Answered as stopped when the answer left before the agent did; else the connection's end.
    CHECK((r.error().code == Errc::shutting_down || r.error().code == Errc::disconnected));
    if (r.error().code == Errc::shutting_down) CHECK_THAT(r.error().message, Catch::Contains("the kernel was stopped"));
}

}  // namespace ship_test_cpp
