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
#include <state_kernels.hpp>

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

TEST_CASE("4 client threads x 1000 ships: every result arrives, correct", "[integration]") {
    auto transport = GENERATE(as<std::string>{}, "tcp", "shm");
    AgentProcess agent(transport);
    auto client = make_client(transport);
    auto target = connect(client, agent);
    constexpr int kThreads = 4, kCalls = 1000;
    std::atomic<int> right{0}, wrong{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
        threads.emplace_back([&, t] {
            // Some in flight at once, some one by one.
            std::vector<std::pair<Future, std::uint64_t>> window;
            for (int i = 0; i < kCalls; ++i) {
                std::uint64_t a = static_cast<std::uint64_t>(t) << 32, b = static_cast<std::uint64_t>(i);
                window.emplace_back(client.ship(behaviour_kernels::add, target, a, b), a + b);
                if (window.size() == 16 || i == kCalls - 1) {
                    for (auto& [f, want] : window) {
                        auto r = f.get_as<std::uint64_t>();
                        (r && *r == want ? right : wrong).fetch_add(1);
                    }
                    window.clear();
                }
            }
        });
    }
    for (auto& th : threads) th.join();
    CHECK(wrong.load() == 0);
    CHECK(right.load() == kThreads * kCalls);
    auto c = agent_counters(client, target);
    CHECK(c["results"] == static_cast<std::uint64_t>(kThreads * kCalls));
    CHECK(client.stats().bundles_sent == 1);
    // Every call was completed by someone: a waiting thread leading progress (for itself or
    // for the others) or the background thread. (connect() adds its own two.)
    auto s = client.stats();
    CHECK(s.completed_by_waiter + s.completed_by_background >= static_cast<std::uint64_t>(kThreads * kCalls));
}

TEST_CASE("a caller waiting on its future receives its result itself, leading progress", "[integration]") {
    auto transport = GENERATE(as<std::string>{}, "tcp", "shm");
    for (auto mode : {ProgressMode::spin, ProgressMode::spin_then_block}) {
        AgentProcess agent(transport);
        ClientOptions o;
        o.transport = *parse_transport(transport);
        o.loopback_only = true;
        o.progress = mode;
        auto client = Client::create(o);
        REQUIRE(client);
        auto target = client->connect(agent.address());
        REQUIRE(target);
        REQUIRE(client->ship(behaviour_kernels::add, *target, std::uint64_t{1}, std::uint64_t{1}).get()); // code sent
        auto before = client->stats();
        constexpr int kCalls = 2000;
        for (int i = 0; i < kCalls; ++i) {
            auto r = client->ship(behaviour_kernels::add, *target, std::uint64_t(i), std::uint64_t{1}).get_as<std::uint64_t>();
            REQUIRE(r);
            REQUIRE(*r == std::uint64_t(i) + 1);
        }
        auto after = client->stats();
        auto by_waiter = after.completed_by_waiter - before.completed_by_waiter;
        auto by_background = after.completed_by_background - before.completed_by_background;
        INFO(to_string(mode) << ": " << by_waiter << " completed by the waiting caller, " << by_background
                             << " by the background thread");
        CHECK(by_waiter + by_background == kCalls);
        // The background thread only gets a reply that arrives before the caller starts waiting.
        CHECK(by_waiter > by_background);
    }
}

TEST_CASE("a caller polling ready() progresses itself: its calls complete without waiting for the background thread",
          "[integration]") {
    // Nobody waits on these futures: before, only the background thread could complete them,
    // and it looked only every Engine::kDeepWait (50 ms) while the caller came and went.
    auto transport = GENERATE(as<std::string>{}, "tcp", "shm");
    INFO("transport " << transport);
    AgentProcess agent(transport);
    auto client = make_client(transport);
    auto target = client.connect(agent.address());
    REQUIRE(target);
    REQUIRE(client.ship(behaviour_kernels::add, *target, std::uint64_t{1}, std::uint64_t{1}).get()); // code sent
    const auto before = client.stats();
    constexpr int kCalls = 200;
    for (int i = 0; i < kCalls; ++i) {
        auto f = client.ship(behaviour_kernels::add, *target, std::uint64_t(i), std::uint64_t{1});
        while (!f.ready()) {
        }
        auto r = f.get_as<std::uint64_t>();
        REQUIRE(r);
        REQUIRE(*r == std::uint64_t(i) + 1);
    }
    const auto after = client.stats();
    const auto by_poller = after.completed_by_waiter - before.completed_by_waiter;
    const auto by_background = after.completed_by_background - before.completed_by_background;
    INFO(by_poller << " completed by the polling caller, " << by_background << " by the background thread");
    CHECK(by_poller + by_background == kCalls);
    CHECK(by_poller > by_background);
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

TEST_CASE("several threads waiting at once: one leads, the others are handed their results", "[integration]") {
    AgentProcess agent("shm");
    auto client = make_client("shm");
    auto target = connect(client, agent);
    REQUIRE(client.ship(behaviour_kernels::add, target, std::uint64_t{1}, std::uint64_t{1}).get());
    // Each thread waits on a slow call and a fast one; whoever leads completes the others'.
    constexpr int kThreads = 4, kRounds = 50;
    std::atomic<int> right{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t)
        threads.emplace_back([&, t] {
            for (int i = 0; i < kRounds; ++i) {
                // Thread 0's slow call keeps it waiting (and likely leading) for milliseconds.
                auto slow = client.ship(behaviour_kernels::busy_count, target, std::uint64_t(t == 0 ? 5'000'000 : 0));
                auto fast = client.ship(behaviour_kernels::add, target, std::uint64_t(t), std::uint64_t(i));
                auto f = fast.get_as<std::uint64_t>();
                if (f && *f == std::uint64_t(t + i) && slow.get()) right.fetch_add(1);
            }
        });
    for (auto& th : threads) th.join();
    CHECK(right.load() == kThreads * kRounds);
}

TEST_CASE("an idle client uses no CPU", "[integration]") {
    AgentProcess agent("shm");
    auto client = make_client("shm");
    auto target = connect(client, agent);
    for (int i = 0; i < 100; ++i) REQUIRE(client.ship(behaviour_kernels::add, target, std::uint64_t{1}, std::uint64_t{1}).get());
    std::this_thread::sleep_for(200ms); // past the spin window
    auto cpu_ms = [] {
        rusage u{};
        getrusage(RUSAGE_SELF, &u);
        return (u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1e3 + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e3;
    };
    auto before = cpu_ms();
    std::this_thread::sleep_for(2s);
    auto used = cpu_ms() - before;
    INFO("idle client process used " << used << " ms of CPU in 2 s");
    CHECK(used < 100.0);
}

TEST_CASE("an idle agent sleeps instead of spinning", "[integration]") {
    AgentProcess agent("tcp");
    auto client = make_client("tcp");
    auto target = connect(client, agent);
    REQUIRE(client.ship(behaviour_kernels::add, target, std::uint64_t{1}, std::uint64_t{1}).get());
    std::this_thread::sleep_for(200ms); // past the spin window
    auto before = agent.cpu_ms();
    std::this_thread::sleep_for(2s);
    auto used = agent.cpu_ms() - before;
    INFO("idle agent used " << used << " ms of CPU in 2 s");
    CHECK(used < 100.0); // a spinning agent would use ~2000
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
