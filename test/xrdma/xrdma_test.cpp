// X-RDMA with real agents: regions, one-sided RDMA, the pointer chase by three strategies,
// kernels that forward themselves with the caller's reply-to kept, and what goes wrong.

#include <catch2/catch.hpp>

#include <cstring>
#include <csignal>
#include <map>
#include <random>
#include <memory>
#include <thread>

#include <fmt/format.h>

#include <bitship/client.hpp>
#include <xrdma_kernels.hpp>
#include <xrdma_test_kernels.hpp>

#include "chase.hpp"
#include "core/wire.hpp"
#include "cluster.hpp"
#include "launcher.hpp"

namespace xrdma_test_cpp {

using namespace bitship;
using namespace std::chrono_literals;
using launch::AgentProcess;
using xrdma::Chase;
using xrdma::ChaseList;
using xrdma::Strategy;

using test::Cluster;
using test::counters;

namespace {

constexpr std::uint64_t kNodesPerAgent = 1 << 12;
constexpr std::uint64_t kSeed = 2026;

Cluster start_cluster(const std::string& transport, unsigned n, const std::vector<std::string>& extra = {"--region", "chase=1M"}) {
    return test::start_cluster(transport, n, extra);
}

} // namespace

TEST_CASE("all three strategies walk to the same node and sum as a local walk", "[integration]") {
    auto transport = GENERATE(as<std::string>{}, "tcp", "shm");
    auto agents = GENERATE(1u, 2u, 4u);
    INFO(transport << ", " << agents << " agents");
    auto cluster = start_cluster(transport, agents);
    auto list = ChaseList::make(agents, kNodesPerAgent, kSeed);
    auto chase = Chase::open(cluster.client, cluster.targets);
    REQUIRE(chase);
    REQUIRE(chase->load(list));
    std::mt19937_64 rng(7);
    for (std::uint64_t depth : {0u, 1u, 17u, 300u}) {
        for (int trial = 0; trial < 3; ++trial) {
            auto start = ChaseList::address_of(static_cast<unsigned>(rng() % agents), rng() % kNodesPerAgent);
            auto want = list.walk(start, depth);
            for (auto s : {Strategy::get, Strategy::native, Strategy::xrdma}) {
                INFO("strategy " << xrdma::to_string(s) << " depth " << depth);
                auto got = chase->run(s, start, depth);
                INFO((got ? std::string("ok") : got.error().describe()));
                INFO((got ? std::string() : cluster.agents[0]->log()));
                REQUIRE(got);
                CHECK(got->addr == want.addr);
                CHECK(got->sum == want.sum);
            }
        }
    }
    CHECK(cluster.client.stats().stray_replies == 0);
}

TEST_CASE("a chase across 4 agents answers once, from the last agent, to the caller", "[integration]") {
    auto transport = GENERATE(as<std::string>{}, "tcp", "shm");
    auto cluster = start_cluster(transport, 4);
    auto list = ChaseList::make(4, kNodesPerAgent, kSeed);
    auto chase = Chase::open(cluster.client, cluster.targets);
    REQUIRE(chase);
    REQUIRE(chase->load(list));
    std::uint64_t start = ChaseList::address_of(0, 5), depth = 200;
    auto got = chase->run(Strategy::xrdma, start, depth);
    REQUIRE(got);
    CHECK(got->addr == list.walk(start, depth).addr);
    std::this_thread::sleep_for(200ms); // a duplicate answer would arrive by now
    CHECK(cluster.client.stats().stray_replies == 0);

    // The walk's last node tells which agent finished it; only that one answered.
    auto last = list.walk(start, depth - 1).addr;
    unsigned finisher = static_cast<unsigned>(BS_CHASE_OWNER(last));
    std::uint64_t forwards = 0;
    for (unsigned a = 0; a < 4; ++a) {
        auto c = counters(cluster.client, cluster.targets[a]);
        INFO("agent " << a);
        CHECK(c["results"] == (a == finisher ? 1u : 0u));
        forwards += c["forwards"];
    }
    CHECK(forwards > 100); // random sharding: about 3/4 of 200 hops cross agents
    CHECK(cluster.client.stats().bundles_sent == 1); // the agents passed the code on themselves
}

TEST_CASE("a kernel hands the call to another kernel of its bundle on a peer (bs_ship)", "[integration]") {
    auto transport = GENERATE(as<std::string>{}, "tcp", "shm");
    auto cluster = start_cluster(transport, 2);
    ShipOptions options;
    options.peers = cluster.targets;
    auto r = cluster.client.ship(xrdma_test_kernels::hand_over, cluster.targets[0], options).get();
    REQUIRE(r);
    REQUIRE(r->size() == 16);
    std::uint64_t out[2];
    std::memcpy(out, r->data(), sizeof out);
    CHECK(out[0] == 1); // ran on peer 1 ...
    CHECK(out[1] == 0); // ... handed over by peer 0
    CHECK(counters(cluster.client, cluster.targets[1])["results"] == 1);
    CHECK(counters(cluster.client, cluster.targets[0])["results"] == 0);
}

TEST_CASE("code evicted from a peer travels again between agents by NEED_CODE", "[integration]") {
    auto cluster = start_cluster("tcp", 2);
    ShipOptions options;
    options.peers = cluster.targets;
    auto hand_over = [&] {
        auto r = cluster.client.ship(xrdma_test_kernels::hand_over, cluster.targets[0], options).get();
        REQUIRE(r);
        REQUIRE(r->size() == 16);
        std::uint64_t out[2];
        std::memcpy(out, r->data(), sizeof out);
        CHECK(out[0] == 1);
        CHECK(out[1] == 0);
    };
    hand_over(); // agent 0 sent the code on to agent 1 with the first forward
    CHECK(counters(cluster.client, cluster.targets[0])["code_forwarded"] == 1);

    // The operator evicts everything agent 1 compiled (xctl cache evict, through the client).
    auto listed = cluster.client.control(cluster.targets[1], static_cast<std::uint8_t>(wire::Type::cache_list), {});
    REQUIRE(listed);
    wire::Header h;
    h.type = wire::Type::cache_list_reply;
    h.payload_size = static_cast<std::uint32_t>(listed->size());
    auto list = wire::decode(h, *listed);
    REQUIRE(list);
    const auto& entries = std::get<wire::CacheList>(list->body).entries;
    REQUIRE_FALSE(entries.empty());
    for (const auto& e : entries) {
        auto evict = wire::encode_cache_evict(0, e.hash);
        REQUIRE(cluster.client.control(cluster.targets[1], static_cast<std::uint8_t>(wire::Type::cache_evict),
                                       std::move(evict.payload)));
    }

    // Agent 0 still believes agent 1 holds the code and forwards the hash alone; agent 1 asks
    // it (not the client) for the code, and the call still answers correctly.
    hand_over();
    auto a0 = counters(cluster.client, cluster.targets[0]);
    auto a1 = counters(cluster.client, cluster.targets[1]);
    CHECK(a1["need_code_sent"] == 1);
    CHECK(a0["code_forwarded"] == 2);
    CHECK(cluster.client.stats().need_code_received == 0);
    CHECK(a1["results"] == 2);
}

TEST_CASE("a peer that dies with a forwarded call fails the caller's future at once", "[integration]") {
    auto cluster = start_cluster("tcp", 2, {"--region", "chase=1M", "--kernel-timeout-ms", "0"});
    ShipOptions options;
    options.peers = cluster.targets;
    auto f = cluster.client.ship(xrdma_test_kernels::forward_then_spin, cluster.targets[0], options);
    std::this_thread::sleep_for(300ms); // forwarded, spinning on peer 1
    CHECK_FALSE(f.ready());
    cluster.agents[1]->stop(SIGKILL);
    REQUIRE(f.wait_for(10s)); // well before the 30 s call deadline
    auto r = f.get();
    REQUIRE_FALSE(r);
    CHECK(r.error().code == Errc::disconnected);
    CHECK_THAT(r.error().message, Catch::Contains("went away"));
}

TEST_CASE("a forwarding loop stops at the hop budget with a clear error", "[integration]") {
    auto cluster = start_cluster("tcp", 2);
    ShipOptions options;
    options.peers = cluster.targets;
    options.hop_budget = 5;
    auto r = cluster.client.ship(xrdma_test_kernels::ping_pong, cluster.targets[0], options, std::uint64_t{0}).get();
    REQUIRE_FALSE(r);
    CHECK(r.error().code == Errc::hop_budget_exceeded);
    CHECK_THAT(r.error().message, Catch::Contains("5 hops"));
}

TEST_CASE("kernels forward through the agents' configured peers when the call ships none", "[integration]") {
    std::uint16_t p0 = launch::free_port(), p1 = launch::free_port();
    std::vector<std::string> peers{"--peer", fmt::format("127.0.0.1:{}", p0), "--peer", fmt::format("127.0.0.1:{}", p1)};
    AgentProcess a0("tcp", peers, p0), a1("tcp", peers, p1);
    ClientOptions o;
    o.transport = Transport::tcp;
    o.loopback_only = true;
    auto client = Client::create(o);
    REQUIRE(client);
    auto t0 = client->connect(a0.address());
    auto t1 = client->connect(a1.address());
    REQUIRE(t0);
    REQUIRE(t1);
    ShipOptions options;
    options.forward = true;
    options.hop_budget = 3;
    auto r = client->ship(xrdma_test_kernels::ping_pong, *t0, options, std::uint64_t{0}).get();
    INFO(a0.log() << a1.log());
    REQUIRE_FALSE(r);
    CHECK(r.error().code == Errc::hop_budget_exceeded);
    auto c1 = counters(*client, *t1);
    CHECK(c1["runs"] >= 1); // the forwards reached the other agent
    // Without a reply-to the answer could not come back: refused, not lost.
    auto lost = client->ship(xrdma_test_kernels::ping_pong, *t0, std::uint64_t{0}).get();
    REQUIRE_FALSE(lost);
    CHECK(lost.error().code == Errc::invalid_argument);
    CHECK_THAT(lost.error().message, Catch::Contains("reply-to"));
}

TEST_CASE("a missing region or an address outside every region is a clear error", "[integration]") {
    SECTION("no region on the agent") {
        auto cluster = start_cluster("tcp", 1, {});
        auto chase = Chase::open(cluster.client, cluster.targets);
        REQUIRE_FALSE(chase);
        CHECK(chase.error().code == Errc::region_not_found);
        CHECK_THAT(chase.error().message, Catch::Contains("'chase'"));
        // The kernels say so too, and the agent goes on.
        bs_chase_args args{0, 3, 0};
        Bytes packed(sizeof args);
        std::memcpy(packed.data(), &args, sizeof args);
        auto shipped = cluster.client.ship_bytes(xrdma_kernels::chase, cluster.targets[0], packed).get();
        REQUIRE_FALSE(shipped);
        CHECK(shipped.error().code == Errc::kernel_failed);
        CHECK_THAT(shipped.error().message, Catch::Contains("no region 'chase'"));
        auto native = cluster.client.ship_native("chase", cluster.targets[0], packed).get();
        REQUIRE_FALSE(native);
        CHECK(native.error().code == Errc::kernel_failed);
    }
    SECTION("an address past the end of the region") {
        auto cluster = start_cluster("tcp", 1);
        auto chase = Chase::open(cluster.client, cluster.targets);
        REQUIRE(chase);
        auto outside = ChaseList::address_of(0, (1u << 20) / sizeof(bs_chase_node) + 3);
        auto get = chase->run(Strategy::get, outside, 4);
        REQUIRE_FALSE(get);
        CHECK(get.error().code == Errc::out_of_bounds);
        for (auto s : {Strategy::native, Strategy::xrdma}) {
            auto r = chase->run(s, outside, 4);
            REQUIRE_FALSE(r);
            CHECK(r.error().code == Errc::kernel_failed);
            CHECK_THAT(r.error().message, Catch::Contains("outside region"));
        }
        auto elsewhere = ChaseList::address_of(9, 0); // an agent the chase does not have
        CHECK_FALSE(chase->run(Strategy::get, elsewhere, 1));
        auto x = chase->run(Strategy::xrdma, elsewhere, 1);
        REQUIRE_FALSE(x);
        CHECK(x.error().code == Errc::kernel_failed);
        auto ok = chase->run(Strategy::xrdma, ChaseList::address_of(0, 0), 0);
        CHECK(ok);
    }
}

TEST_CASE("regions are readable and writable by RDMA, and kernels can make them", "[integration]") {
    auto transport = GENERATE(as<std::string>{}, "tcp", "shm");
    auto cluster = start_cluster(transport, 1);
    auto& client = cluster.client;
    auto region = client.region(cluster.targets[0], "chase");
    REQUIRE(region);
    CHECK(region->size == 1u << 20);
    Bytes data(5000);
    for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::byte>(i ^ 0x5a);
    REQUIRE(client.put(*region, 12345, data).get());
    auto back = client.get(*region, 12345, 5000).get();
    REQUIRE(back);
    CHECK(*back == data);
    auto past = client.get(*region, region->size - 4, 8).get();
    REQUIRE_FALSE(past);
    CHECK(past.error().code == Errc::out_of_bounds);

    auto made = client.ship(xrdma_test_kernels::make_scratch, cluster.targets[0]).get_as<std::uint64_t>();
    REQUIRE(made);
    CHECK(*made == 4096);
    auto scratch = client.region(cluster.targets[0], "scratch");
    REQUIRE(scratch);
    auto bytes = client.get(*scratch, 0, 16).get();
    REQUIRE(bytes);
    CHECK((*bytes)[3] == static_cast<std::byte>(21));
    auto none = client.region(cluster.targets[0], "nope");
    REQUIRE_FALSE(none);
    CHECK(none.error().code == Errc::region_not_found);
}

}  // namespace xrdma_test_cpp
