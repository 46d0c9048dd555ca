#include "hash_lookup.hpp"

#include "come_back.hpp"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <numeric>
#include <random>
#include <stdexcept>

#include <fmt/format.h>

#include <xrdma_hash_lookup_kernels.hpp>

#include "come_back.hpp"
#include "kernels/array_abi.h"
#include "region_io.hpp"

namespace bitship::xrdma {
namespace {

// The inverse of x -> x * c modulo 2^64 (c odd), by Newton's iteration.
constexpr std::uint64_t inverse(std::uint64_t c) {
    std::uint64_t x = c;
    for (int i = 0; i < 6; ++i) x *= 2 - c * x;
    return x;
}

// The inverse of y = x ^ (x >> s).
constexpr std::uint64_t unxorshift(std::uint64_t y, unsigned s) {
    std::uint64_t x = y;
    for (unsigned k = s; k < 64; k += s) x ^= y >> k;
    return x;
}

// The inverse of bs_mix64: makes a key whose hash is any value we like.
constexpr std::uint64_t unmix64(std::uint64_t x) {
    x = unxorshift(x, 31);
    x *= inverse(0x94d049bb133111ebull);
    x = unxorshift(x, 27);
    x *= inverse(0xbf58476d1ce4e5b9ull);
    return unxorshift(x, 30);
}

Result<bs_hash_result> result_of(const Bytes& b) {
    if (b.size() != sizeof(bs_hash_result))
        return fail(Errc::malformed_message,
                    fmt::format("hash_lookup answered {} bytes, expected {}", b.size(), sizeof(bs_hash_result)));
    bs_hash_result r;
    std::memcpy(&r, b.data(), sizeof r);
    return r;
}

std::uint64_t entry_address(unsigned agent, std::uint64_t index, std::uint64_t buckets_per_agent) {
    return BS_HASH_ADDRESS(agent, buckets_per_agent * sizeof(std::uint64_t) + index * sizeof(bs_hash_entry));
}

} // namespace

std::uint64_t bucket_of(std::uint64_t key, std::uint64_t buckets) noexcept { return bs_mix64(key) % buckets; }

std::uint64_t bucket_slot(std::uint64_t bucket, std::uint64_t buckets_per_agent) noexcept {
    return BS_HASH_ADDRESS(bucket / buckets_per_agent, (bucket % buckets_per_agent) * sizeof(std::uint64_t));
}

HashTable HashTable::make(unsigned agents, std::uint64_t buckets_per_agent, std::uint32_t chain_length, std::uint64_t seed) {
    if (agents == 0 || agents > (1u << 15) || buckets_per_agent == 0 || chain_length == 0)
        throw std::invalid_argument("a hash table needs 1..32768 agents, a bucket and a chain length each");
    HashTable t;
    t.per_agent_ = buckets_per_agent;
    t.chain_ = chain_length;
    std::uint64_t buckets = agents * buckets_per_agent, per_agent_entries = buckets_per_agent * chain_length;
    t.shards_.assign(agents, Bytes(region_bytes(buckets_per_agent, chain_length)));
    t.keys_.resize(buckets * chain_length);
    // Random sharding: entry k of the table takes slot order[k], slots packed as
    // agent * per_agent_entries + index.
    std::vector<std::uint64_t> order(buckets * chain_length);
    std::iota(order.begin(), order.end(), std::uint64_t{0});
    std::mt19937_64 rng(seed);
    std::shuffle(order.begin(), order.end(), rng);
    auto address = [&](std::uint64_t slot) {
        return entry_address(static_cast<unsigned>(slot / per_agent_entries), slot % per_agent_entries, buckets_per_agent);
    };
    auto place = [&](std::uint64_t address, const void* what, std::size_t n) {
        std::memcpy(t.shards_[BS_HASH_OWNER(address)].data() + BS_HASH_OFFSET(address), what, n);
    };
    // Keys of bucket b hash to b + buckets * m, distinct m per position: distinct keys.
    std::uint64_t spread = std::max<std::uint64_t>(1, (UINT64_MAX - buckets) / buckets / chain_length);
    for (std::uint64_t b = 0; b < buckets; ++b) {
        std::uint64_t head = address(order[b * chain_length]);
        place(bucket_slot(b, buckets_per_agent), &head, sizeof head);
        std::uint64_t base = rng() % spread;
        for (std::uint32_t j = 0; j < chain_length; ++j) {
            std::uint64_t k = b * chain_length + j;
            bs_hash_entry e{unmix64(b + buckets * (base * chain_length + j)), rng(),
                            j + 1 < chain_length ? address(order[k + 1]) : BS_HASH_NULL};
            if (bucket_of(e.key, buckets) != b) throw std::logic_error("hash table: unmix64 is not bs_mix64's inverse");
            place(address(order[k]), &e, sizeof e);
            t.keys_[k] = e.key;
        }
    }
    return t;
}

std::uint64_t HashTable::key_at(std::uint64_t bucket, std::uint32_t position) const {
    if (bucket >= buckets() || position == 0 || position > chain_)
        throw std::out_of_range(fmt::format("no position {} of bucket {} (buckets {}, chains of {})", position, bucket,
                                            buckets(), chain_));
    return keys_[bucket * chain_ + position - 1];
}

bs_hash_result HashTable::lookup(std::uint64_t key) const {
    std::uint64_t slot = bucket_slot(bucket_of(key, buckets()), per_agent_);
    std::uint64_t addr;
    std::memcpy(&addr, shards_[BS_HASH_OWNER(slot)].data() + BS_HASH_OFFSET(slot), sizeof addr);
    bs_hash_result r{0, 0, 0};
    while (addr != BS_HASH_NULL) {
        bs_hash_entry e;
        std::memcpy(&e, shards_[BS_HASH_OWNER(addr)].data() + BS_HASH_OFFSET(addr), sizeof e);
        ++r.position;
        if (e.key == key) {
            r.found = 1;
            r.value = e.value;
            break;
        }
        addr = e.next;
    }
    return r;
}

Result<HashLookup> HashLookup::open(Client& client, std::vector<Target> agents, std::uint64_t buckets_per_agent,
                                    std::uint32_t chain_limit) {
    if (agents.empty() || agents.size() > (1u << 15))
        return fail(Errc::invalid_argument, "a hash lookup needs between 1 and 32768 agents");
    if (buckets_per_agent == 0) return fail(Errc::invalid_argument, "a hash table needs at least one bucket per agent");
    auto regions = open_regions(client, agents, BS_HASH_REGION);
    if (!regions) return tl::make_unexpected(regions.error());
    for (std::size_t a = 0; a < agents.size(); ++a)
        if ((*regions)[a].size < buckets_per_agent * sizeof(std::uint64_t))
            return fail(Errc::out_of_bounds, fmt::format("region '{}' of agent {} holds {} bytes, too few for {} buckets",
                                                         BS_HASH_REGION, agents[a].info().address, (*regions)[a].size,
                                                         buckets_per_agent));
    return HashLookup(client, std::move(agents), std::move(*regions), buckets_per_agent, chain_limit);
}

Result<void> HashLookup::load(const HashTable& table) {
    if (table.agents() != agents_.size() || table.buckets_per_agent() != per_agent_)
        return fail(Errc::invalid_argument,
                    fmt::format("table of {} × {} buckets does not match a lookup over {} × {}", table.agents(),
                                table.buckets_per_agent(), agents_.size(), per_agent_));
    for (unsigned a = 0; a < agents_.size(); ++a)
        if (auto r = fill_region(*client_, regions_[a], table.shard(a), agents_[a].info()); !r) return r;
    return {};
}

Future HashLookup::start(Strategy strategy, std::uint64_t key) {
    std::uint64_t slot = bucket_slot(bucket_of(key, per_agent_ * agents_.size()), per_agent_);
    if (strategy == Strategy::reship) {
        // come_back = 1 in the walk's state: the kernel answers the state to go on with.
        bs_hash_args args{key, slot, 0, limit_, 1, 1};
        return come_back_walk(*client_, xrdma_hash_lookup_kernels::hash_lookup, agents_, bytes_of(args),
                              {sizeof(bs_hash_result), sizeof(bs_hash_args), offsetof(bs_hash_args, addr), {}});
    }
    if (strategy != Strategy::get) {
        bs_hash_args args{key, slot, 0, limit_, 1, 0};
        ShipOptions options;
        // One agent holds the whole table: no peer table to carry (Chase::start says why).
        if (agents_.size() > 1) options.peers = agents_;
        // Each entry read can cross agents at most once, and so can the bucket's head.
        options.hop_budget = static_cast<std::uint16_t>(std::min<std::uint64_t>(std::uint64_t{limit_} + 2, 0xffff));
        const Target& first = agents_[BS_HASH_OWNER(slot)];
        if (strategy == Strategy::native) return client_->ship_native("hash_lookup", first, bytes_of(args), options);
        return client_->ship_bytes(xrdma_hash_lookup_kernels::hash_lookup, first, bytes_of(args), options);
    }
    // One GET for the bucket's head, then one per entry, from the progress thread.
    struct Walk {
        std::uint64_t key, addr;
        std::uint32_t limit, position = 0;
        bool at_bucket = true, started = false;
    };
    auto walk = std::make_shared<Walk>(Walk{key, slot, limit_});
    return client_->get_chain([this, walk](std::span<const std::byte> last, Bytes& result) -> std::optional<GetStep> {
        auto finish = [&](bs_hash_result r) -> std::optional<GetStep> {
            result = bytes_of(r);
            return std::nullopt;
        };
        if (walk->started) {
            if (walk->at_bucket) {
                std::memcpy(&walk->addr, last.data(), sizeof walk->addr);
                walk->at_bucket = false;
            } else {
                bs_hash_entry e;
                std::memcpy(&e, last.data(), sizeof e);
                ++walk->position;
                if (e.key == walk->key) return finish({1, e.value, walk->position});
                walk->addr = e.next;
            }
        }
        walk->started = true;
        if (walk->addr == BS_HASH_NULL) return finish({0, 0, walk->position});
        if (!walk->at_bucket && walk->position >= walk->limit) throw std::runtime_error("chain longer than the walk's limit");
        auto owner = BS_HASH_OWNER(walk->addr);
        if (owner >= regions_.size()) return GetStep{nullptr, 0, 0};
        return GetStep{&regions_[owner], BS_HASH_OFFSET(walk->addr),
                       static_cast<std::uint32_t>(walk->at_bucket ? sizeof(std::uint64_t) : sizeof(bs_hash_entry))};
    });
}

Result<bs_hash_result> HashLookup::run(Strategy strategy, std::uint64_t key) {
    auto bytes = start(strategy, key).get();
    if (!bytes) return tl::make_unexpected(bytes.error());
    return result_of(*bytes);
}

Result<std::unique_ptr<HashLookupOp>> HashLookupOp::create(Client& client, std::vector<Target> agents,
                                                           std::uint64_t buckets_per_agent, std::uint32_t chain_length,
                                                           std::uint64_t seed) {
    if (agents.empty() || agents.size() > (1u << 15) || buckets_per_agent == 0 || chain_length == 0)
        return fail(Errc::invalid_argument, "lookup: needs 1..32768 agents, a bucket per agent and a chain length");
    auto table = HashTable::make(static_cast<unsigned>(agents.size()), buckets_per_agent, chain_length, seed);
    auto lookup = HashLookup::open(client, std::move(agents), buckets_per_agent, chain_length);
    if (!lookup) return tl::make_unexpected(lookup.error());
    if (auto r = lookup->load(table); !r) return tl::make_unexpected(r.error());
    std::uint64_t bucket = bs_mix64(seed) % table.buckets();
    return std::unique_ptr<HashLookupOp>(new HashLookupOp(std::move(*lookup), std::move(table), bucket));
}

const Kernel& HashLookupOp::kernel() const noexcept { return xrdma_hash_lookup_kernels::hash_lookup; }

OpWork HashLookupOp::work(std::uint64_t size) const {
    auto agents = table_.agents();
    OpWork w;
    w.dependent_gets = size + 1; // the bucket's head, then each entry
    w.get_bytes = sizeof(std::uint64_t) + size * sizeof(bs_hash_entry);
    w.remote_units = size;
    // Each entry sits on a random agent: the step onto it crosses with chance (agents-1)/agents.
    w.forwards = size * (agents - 1) / agents;
    w.result_bytes = sizeof(bs_hash_result);
    w.agents_touched = expected_agents(static_cast<std::uint32_t>(agents), size + 1); // the bucket's, then each entry's
    return w;
}

bool HashLookupOp::offers(Strategy s) const noexcept { return s != Strategy::reship || table_.agents() > 1; }

Future HashLookupOp::start(Strategy strategy, std::uint64_t size) {
    if (size == 0 || size > table_.chain_length())
        return failed_future({Errc::out_of_bounds, fmt::format("lookup: position {} is outside the chain (1..{})", size,
                                                               table_.chain_length())});
    return lookup_.start(strategy, table_.key_at(bucket_, static_cast<std::uint32_t>(size)));
}

Bytes HashLookupOp::expected(std::uint64_t size) const {
    if (size == 0 || size > table_.chain_length()) return {};
    return bytes_of(table_.lookup(table_.key_at(bucket_, static_cast<std::uint32_t>(size))));
}

} // namespace bitship::xrdma
