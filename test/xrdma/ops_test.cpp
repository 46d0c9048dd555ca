// The X-RDMA operations the planner drives (chase, reduce, filter, hash lookup): every
// strategy gives the answer computed here from the same data, on 1 and 4 real agents over TCP
// and shared memory; sizes and argument blocks that are wrong get clear errors by code, and
// the agents keep serving.

#include <catch2/catch.hpp>

#include <csignal>
#include <cstring>
#include <memory>

#include <fmt/format.h>

#include <bitship/client.hpp>
#include <xrdma_filter_kernels.hpp>
#include <xrdma_hash_lookup_kernels.hpp>
#include <xrdma_reduce_kernels.hpp>

#include "chase_op.hpp"
#include "filter.hpp"
#include "hash_lookup.hpp"
#include "cluster.hpp"
#include "launcher.hpp"
#include "reduce.hpp"

namespace ops_test_cpp {

using namespace bitship;
using namespace std::chrono_literals;
using launch::AgentProcess;
using namespace bitship::xrdma;
using test::Cluster;

namespace {

constexpr std::uint64_t kItemsPerAgent = 1 << 16; // 512 KiB of array per agent
constexpr std::uint64_t kNodesPerAgent = 1 << 12;
constexpr std::uint64_t kBucketsPerAgent = 256;
constexpr std::uint32_t kChain = 16;
constexpr std::uint64_t kSeed = 77;
constexpr Strategy kStrategies[] = {Strategy::get, Strategy::native, Strategy::xrdma};

// What every op needs: regions for all four.
std::vector<std::string> op_regions() {
    return {"--region", "chase=64K", "--region", "array=512K", "--region",
            fmt::format("hash={}", HashTable::region_bytes(kBucketsPerAgent, kChain))};
}

Cluster start_cluster(const std::string& transport, unsigned n, const std::vector<std::string>& extra = op_regions()) {
    return test::start_cluster(transport, n, extra, 20s);
}

template <class T> T value_of(const Bytes& b) {
    REQUIRE(b.size() == sizeof(T));
    T out;
    std::memcpy(&out, b.data(), sizeof out);
    return out;
}

// Every strategy's answer for each size, byte for byte against expected(); reship too where
// the op offers it (a walk over several agents). A fan-out refuses reship by name.
void check_op(Op& op, std::initializer_list<std::uint64_t> sizes, const Cluster& cluster) {
    for (auto size : sizes) {
        if (size > op.max_size()) continue; // past one agent's block, with one agent
        auto want = op.expected(size);
        for (auto s : {Strategy::get, Strategy::native, Strategy::xrdma, Strategy::reship}) {
            INFO(op.name() << " " << op.size_name() << " " << size << " by " << to_string(s));
            auto got = op.start(s, size).get();
            INFO((got ? std::string("ok") : got.error().describe() + "\n" + cluster.logs()));
            const bool walk = op.name() == "chase" || op.name() == "lookup";
            CHECK(op.offers(s) == (s != Strategy::reship || (walk && cluster.targets.size() > 1)));
            if (s == Strategy::reship && !walk) {
                REQUIRE_FALSE(got);
                CHECK(got.error().code == Errc::invalid_argument);
                CHECK(got.error().message.find("reship is for walks") != std::string::npos);
                continue;
            }
            REQUIRE(got);
            CHECK(*got == want);
        }
    }
}

std::uint64_t agent_counter(Client& client, const Target& t, const std::string& name) {
    auto all = test::counters(client, t);
    REQUIRE(all.contains(name));
    return all[name];
}

} // namespace

TEST_CASE("every op gives the same answer by get, native and shipped on 1 and 4 agents", "[integration]") {
    auto transport = GENERATE(as<std::string>{}, "tcp", "shm");
    auto agents = GENERATE(1u, 4u);
    INFO(transport << ", " << agents << " agents");
    auto cluster = start_cluster(transport, agents);
    std::uint64_t total = kItemsPerAgent * agents;

    auto chase = ChaseOp::create(cluster.client, cluster.targets, kNodesPerAgent, kSeed);
    REQUIRE(chase);
    CHECK((*chase)->max_size() == kNodesPerAgent * agents);
    check_op(**chase, {0, 1, 9, 200}, cluster);

    for (auto kind : {ReduceKind::sum, ReduceKind::min, ReduceKind::max}) {
        auto reduce = ReduceOp::create(cluster.client, cluster.targets, kind, kItemsPerAgent, kSeed);
        REQUIRE(reduce);
        CHECK((*reduce)->max_size() == total);
        check_op(**reduce, {0, 1, 1000, kItemsPerAgent + 7, total}, cluster);
    }
    // An answer that is not trivially a constant: the sum of the whole array is the local one.
    auto whole = ReduceOp::create(cluster.client, cluster.targets, ReduceKind::sum, kItemsPerAgent, kSeed);
    REQUIRE(whole);
    auto sum = value_of<bs_reduce_result>((*whole)->expected(total));
    CHECK(sum.count == total);
    CHECK(sum.value != 0);

    for (double selectivity : {0.0, 0.1, 1.0}) {
        auto filter = FilterOp::create(cluster.client, cluster.targets, selectivity, kItemsPerAgent, kSeed);
        REQUIRE(filter);
        CHECK((*filter)->max_size() == total);
        check_op(**filter, {0, 1, 5000, kItemsPerAgent + 3, total}, cluster);
        auto all = (*filter)->expected(total);
        if (selectivity == 0.1) { // about a tenth of the items match
            CHECK(all.size() / 8 > total / 12);
            CHECK(all.size() / 8 < total / 8);
        }
    }

    auto lookup = HashLookupOp::create(cluster.client, cluster.targets, kBucketsPerAgent, kChain, kSeed);
    REQUIRE(lookup);
    CHECK((*lookup)->max_size() == kChain);
    check_op(**lookup, {1, 2, 7, kChain}, cluster);
    for (std::uint64_t p : {1u, 7u, 16u}) {
        auto r = value_of<bs_hash_result>((*lookup)->expected(p));
        CHECK(r.found == 1);
        CHECK(r.position == p);
    }
    CHECK(cluster.client.stats().stray_replies == 0);
}

TEST_CASE("reship walks come back here at every crossing between agents and never forward", "[integration]") {
    auto transport = GENERATE(as<std::string>{}, "tcp", "shm");
    INFO(transport);
    auto cluster = start_cluster(transport, 4);
    auto chase = ChaseOp::create(cluster.client, cluster.targets, kNodesPerAgent, kSeed);
    REQUIRE(chase);
    constexpr std::uint64_t depth = 300;
    // The calls a come-back walk makes: one, plus one per hop onto another agent's node.
    const auto& list = (*chase)->list();
    std::uint64_t crossings = 0, addr = ChaseList::address_of(0, 0);
    for (std::uint64_t i = 0; i < depth; ++i) {
        auto next = list.walk(addr, 1).addr;
        crossings += BS_CHASE_OWNER(next) != BS_CHASE_OWNER(addr) && i + 1 < depth;
        addr = next;
    }
    REQUIRE(crossings > depth / 2); // random sharding over 4 agents: about 3 in 4 hops cross

    auto forwards = [&] {
        std::uint64_t n = 0;
        for (const auto& t : cluster.targets) n += agent_counter(cluster.client, t, "forwards");
        return n;
    };
    const auto forwards_before = forwards();
    const auto runs_before = cluster.client.stats().runs_sent;
    auto got = (*chase)->start(Strategy::reship, depth).get();
    INFO((got ? std::string("ok") : got.error().describe() + "\n" + cluster.logs()));
    REQUIRE(got);
    CHECK(*got == (*chase)->expected(depth));
    CHECK(cluster.client.stats().runs_sent - runs_before == 1 + crossings);
    CHECK(forwards() == forwards_before);

    // The same walk by xrdma: one call from here, the crossings forwarded agent to agent.
    const auto runs_mid = cluster.client.stats().runs_sent;
    auto forwarded = (*chase)->start(Strategy::xrdma, depth).get();
    REQUIRE(forwarded);
    CHECK(*forwarded == *got);
    CHECK(cluster.client.stats().runs_sent - runs_mid == 1);
    CHECK(forwards() - forwards_before == crossings);
}

TEST_CASE("typed reduce and filter over ranges that start mid-agent, and a missing key is not found", "[integration]") {
    auto transport = GENERATE(as<std::string>{}, "tcp", "shm");
    auto cluster = start_cluster(transport, 4);
    auto data = ShardedArray::make(4, kItemsPerAgent, kSeed);
    auto reduce = Reduce::open(cluster.client, cluster.targets, kItemsPerAgent);
    REQUIRE(reduce);
    REQUIRE(reduce->load(data));
    auto filter = Filter::open(cluster.client, cluster.targets, kItemsPerAgent);
    REQUIRE(filter);
    std::uint64_t first = kItemsPerAgent - 5, count = 2 * kItemsPerAgent + 11; // spans three agents
    auto range = data.items().subspan(first, count);
    for (auto s : kStrategies) {
        INFO(to_string(s));
        for (auto kind : {ReduceKind::sum, ReduceKind::min, ReduceKind::max}) {
            auto got = reduce->run(s, kind, first, count);
            REQUIRE(got);
            auto want = Reduce::local(kind, range);
            CHECK(got->value == want.value);
            CHECK(got->count == count);
        }
        auto items = filter->run(s, Filter::threshold_for(0.25), first, count);
        REQUIRE(items);
        CHECK(*items == Filter::local(Filter::threshold_for(0.25), range));
    }

    auto table = HashTable::make(4, kBucketsPerAgent, kChain, kSeed);
    auto lookup = HashLookup::open(cluster.client, cluster.targets, kBucketsPerAgent, kChain);
    REQUIRE(lookup);
    REQUIRE(lookup->load(table));
    std::uint64_t missing = 0x5eed;
    for (std::uint64_t b = 0; b < table.buckets() && table.lookup(missing).found; ++b) ++missing;
    for (auto s : kStrategies) {
        INFO(to_string(s));
        auto r = lookup->run(s, missing);
        REQUIRE(r);
        CHECK(r->found == 0);
        CHECK(r->position == kChain); // the whole chain was read
        auto key = table.key_at(table.buckets() - 1, 3);
        auto hit = lookup->run(s, key);
        REQUIRE(hit);
        CHECK(hit->found == 1);
        CHECK(hit->position == 3);
        CHECK(hit->value == table.lookup(key).value);
    }
}

TEST_CASE("a size outside an op's range is refused by code, by every strategy", "[integration]") {
    auto cluster = start_cluster("tcp", 2);
    auto chase = ChaseOp::create(cluster.client, cluster.targets, kNodesPerAgent, kSeed);
    auto reduce = ReduceOp::create(cluster.client, cluster.targets, ReduceKind::sum, kItemsPerAgent, kSeed);
    auto filter = FilterOp::create(cluster.client, cluster.targets, 0.5, kItemsPerAgent, kSeed);
    auto lookup = HashLookupOp::create(cluster.client, cluster.targets, kBucketsPerAgent, kChain, kSeed);
    REQUIRE(chase);
    REQUIRE(reduce);
    REQUIRE(filter);
    REQUIRE(lookup);
    struct Case {
        Op* op;
        std::uint64_t size;
        const char* says;
    };
    for (auto c : {Case{chase->get(), 2 * kNodesPerAgent + 1, "depth"}, Case{reduce->get(), 2 * kItemsPerAgent + 1, "outside"},
                   Case{filter->get(), 2 * kItemsPerAgent + 1, "outside"}, Case{lookup->get(), 0, "outside the chain"},
                   Case{lookup->get(), kChain + 1, "outside the chain"}}) {
        for (auto s : kStrategies) {
            INFO(c.op->name() << " size " << c.size << " by " << to_string(s));
            auto r = c.op->start(s, c.size).get();
            REQUIRE_FALSE(r);
            CHECK(r.error().code == Errc::out_of_bounds);
            CHECK_THAT(r.error().message, Catch::Contains(c.says));
        }
    }
    auto ok = reduce->get()->start(Strategy::xrdma, 10).get();
    REQUIRE(ok);
    CHECK(*ok == reduce->get()->expected(10));
}

TEST_CASE("a filter whose worst case would pass an agent's result limit is refused before it is sent", "[integration]") {
    auto extra = op_regions();
    extra.insert(extra.end(), {"--max-result", "4096"}); // 512 items
    auto cluster = start_cluster("shm", 2, extra);
    auto filter = FilterOp::create(cluster.client, cluster.targets, 0.01, kItemsPerAgent, kSeed);
    REQUIRE(filter);
    CHECK((*filter)->max_size() == 512);
    for (auto s : kStrategies) {
        INFO(to_string(s));
        auto r = (*filter)->start(s, 513).get();
        REQUIRE_FALSE(r);
        CHECK(r.error().code == Errc::too_large);
        CHECK_THAT(r.error().message, Catch::Contains("result limit"));
        auto fits = (*filter)->start(s, 512).get();
        REQUIRE(fits);
        CHECK(*fits == (*filter)->expected(512));
    }
    // The typed API refuses a range whose part on one agent could overflow it, wherever it starts.
    auto typed = Filter::open(cluster.client, cluster.targets, kItemsPerAgent);
    REQUIRE(typed);
    auto r = typed->run(Strategy::native, 1024, kItemsPerAgent, 600);
    REQUIRE_FALSE(r);
    CHECK(r.error().code == Errc::too_large);
    CHECK_THAT(r.error().message, Catch::Contains(cluster.targets[1].info().address));
}

TEST_CASE("forged argument blocks get kernel_failed with a message, and the agent keeps serving", "[integration]") {
    auto transport = GENERATE(as<std::string>{}, "tcp", "shm");
    auto cluster = start_cluster(transport, 2);
    auto lookup = HashLookupOp::create(cluster.client, cluster.targets, kBucketsPerAgent, kChain, kSeed);
    auto reduce = ReduceOp::create(cluster.client, cluster.targets, ReduceKind::max, kItemsPerAgent, kSeed);
    REQUIRE(lookup);
    REQUIRE(reduce);
    const Target& agent = cluster.targets[0];
    std::uint64_t region_items = (512u << 10) / 8;
    struct Forged {
        const Kernel* kernel;
        const char* native;
        Bytes args;
        const char* says;
    };
    auto raw = [](auto v) { return Client::pack_args(v); };
    std::vector<Forged> cases{
        {&xrdma_reduce_kernels::reduce, "reduce", Bytes(5), "expected {first, count, op"},
        {&xrdma_reduce_kernels::reduce, "reduce", raw(bs_reduce_args{region_items - 1, 2, BS_REDUCE_SUM, 0}), "outside region 'array'"},
        {&xrdma_reduce_kernels::reduce, "reduce", raw(bs_reduce_args{~0ull, ~0ull, BS_REDUCE_SUM, 0}), "outside region 'array'"},
        {&xrdma_reduce_kernels::reduce, "reduce", raw(bs_reduce_args{0, 1, 7, 0}), "op must be"},
        {&xrdma_filter_kernels::filter, "filter", Bytes(40), "expected {first, count, threshold"},
        {&xrdma_filter_kernels::filter, "filter", raw(bs_filter_args{1, region_items, 10, 0}), "outside region 'array'"},
        {&xrdma_filter_kernels::filter, "filter", raw(bs_filter_args{0, 1, 5000, 0}), "threshold must be"},
        {&xrdma_hash_lookup_kernels::hash_lookup, "hash_lookup", Bytes(31), "expected {key, addr"},
        {&xrdma_hash_lookup_kernels::hash_lookup, "hash_lookup", raw(bs_hash_args{1, BS_HASH_ADDRESS(0, 1ull << 40), 0, 4, 0, 0}),
         "outside region 'hash'"},
        {&xrdma_hash_lookup_kernels::hash_lookup, "hash_lookup", raw(bs_hash_args{1, BS_HASH_ADDRESS(0, 3), 0, 4, 1, 0}),
         "misaligned"},
        {&xrdma_hash_lookup_kernels::hash_lookup, "hash_lookup", raw(bs_hash_args{1, BS_HASH_ADDRESS(9, 0), 0, 4, 1, 0}),
         "outside the peer table"},
        {&xrdma_hash_lookup_kernels::hash_lookup, "hash_lookup", raw(bs_hash_args{1, 0, 5, 4, 1, 0}), "position at most limit"},
    };
    for (const auto& c : cases) {
        INFO(c.native << ": " << c.says);
        auto shipped = cluster.client.ship_bytes(*c.kernel, agent, c.args).get();
        REQUIRE_FALSE(shipped);
        CHECK(shipped.error().code == Errc::kernel_failed);
        CHECK_THAT(shipped.error().message, Catch::Contains(c.says));
        auto native = cluster.client.ship_native(c.native, agent, c.args).get();
        REQUIRE_FALSE(native);
        CHECK(native.error().code == Errc::kernel_failed);
        CHECK_THAT(native.error().message, Catch::Contains(c.says));
    }
    // Still serving, by every strategy.
    for (auto s : kStrategies) {
        auto r = (*reduce)->start(s, 3 * kItemsPerAgent / 2).get();
        REQUIRE(r);
        CHECK(*r == (*reduce)->expected(3 * kItemsPerAgent / 2));
        auto h = (*lookup)->start(s, 5).get();
        REQUIRE(h);
        CHECK(*h == (*lookup)->expected(5));
    }
}

TEST_CASE("a cycle written into the hash table stops at the walk's limit by every strategy", "[integration]") {
    auto cluster = start_cluster("tcp", 1);
    auto table = HashTable::make(1, kBucketsPerAgent, kChain, kSeed);
    auto lookup = HashLookup::open(cluster.client, cluster.targets, kBucketsPerAgent, kChain);
    REQUIRE(lookup);
    REQUIRE(lookup->load(table));
    // Point bucket 0's slot at an entry whose next is itself.
    auto region = cluster.client.region(cluster.targets[0], BS_HASH_REGION);
    REQUIRE(region);
    std::uint64_t entry_offset = kBucketsPerAgent * 8;
    std::uint64_t self = BS_HASH_ADDRESS(0, entry_offset);
    bs_hash_entry loop{~0ull - 1, 0, self};
    REQUIRE(cluster.client.put(*region, entry_offset, Client::pack_args(loop)).get());
    REQUIRE(cluster.client.put(*region, 0, Client::pack_args(self)).get());
    std::uint64_t key = 0; // a key of bucket 0 that is not the loop's
    while (bucket_of(key, kBucketsPerAgent) != 0 || key == loop.key) ++key;
    auto get = lookup->run(Strategy::get, key);
    REQUIRE_FALSE(get);
    CHECK_THAT(get.error().message, Catch::Contains("limit"));
    for (auto s : {Strategy::native, Strategy::xrdma}) {
        auto r = lookup->run(s, key);
        REQUIRE_FALSE(r);
        CHECK(r.error().code == Errc::kernel_failed);
        CHECK_THAT(r.error().message, Catch::Contains("limit"));
    }
}

TEST_CASE("a fan-out fails as soon as one agent's part fails, and the others still serve", "[integration]") {
    auto cluster = start_cluster("tcp", 2);
    auto reduce = ReduceOp::create(cluster.client, cluster.targets, ReduceKind::sum, kItemsPerAgent, kSeed);
    REQUIRE(reduce);
    cluster.agents[1]->stop(SIGKILL);
    for (auto s : kStrategies) {
        INFO(to_string(s));
        auto r = (*reduce)->start(s, 2 * kItemsPerAgent).get();
        REQUIRE_FALSE(r);
        INFO(r.error().describe());
        CHECK((r.error().code == Errc::disconnected || r.error().code == Errc::connect_failed ||
               r.error().code == Errc::transport_error));
        auto mine = (*reduce)->start(s, kItemsPerAgent).get(); // agent 0's block alone
        REQUIRE(mine);
        CHECK(*mine == (*reduce)->expected(kItemsPerAgent));
    }
}

}  // namespace ops_test_cpp
