#pragma once
// Hash-table lookup as an X-RDMA operation: a bucket-chain walk in a table spread over the
// agents' "hash" regions, by three interchangeable strategies.
//
//   auto table = HashTable::make(agents.size(), 1024, 8, seed);   // 1024 buckets per agent, chains of 8
//   auto lookup = HashLookup::open(client, agents, table.buckets_per_agent(), table.chain_length());
//   lookup->load(table);
//   auto r = lookup->run(Strategy::xrdma, table.key_at(b, 5));    // {found 1, value, position 5}
//
//   get     one GET for the bucket's head, then one per entry (dependent: a round trip each)
//   native  the pre-installed "hash_lookup" walks the chain at the agents, forwarding itself
//           to the agent holding the next entry; the last agent answers here
//   xrdma   the same with the shipped hash_lookup kernel
//
// Layout of an agent's region: its buckets_per_agent bucket slots (the global address of the
// chain's first entry each), then its entries {key, value, next}. Bucket b of a key is
// bs_mix64(key) % buckets and lives on agent b / buckets_per_agent; entries are placed on
// random agents (every agent holds exactly buckets_per_agent × chain_length of them).

#include <cstdint>
#include <memory>
#include <vector>

#include <bitship/client.hpp>

#include "kernels/hash_lookup_abi.h"
#include "op.hpp"

namespace bitship::xrdma {

/// The table kept here, to load into the agents and to check answers against.
class HashTable {
public:
    /// `buckets_per_agent` buckets on each of `agents` agents, every chain `chain_length`
    /// entries long, entries on random agents. Same arguments, same table.
    static HashTable make(unsigned agents, std::uint64_t buckets_per_agent, std::uint32_t chain_length, std::uint64_t seed);

    [[nodiscard]] unsigned agents() const noexcept { return static_cast<unsigned>(shards_.size()); }
    [[nodiscard]] std::uint64_t buckets_per_agent() const noexcept { return per_agent_; }
    [[nodiscard]] std::uint64_t buckets() const noexcept { return per_agent_ * shards_.size(); }
    [[nodiscard]] std::uint32_t chain_length() const noexcept { return chain_; }
    /// Bytes each agent's "hash" region needs.
    [[nodiscard]] static std::uint64_t region_bytes(std::uint64_t buckets_per_agent, std::uint32_t chain_length) noexcept {
        return buckets_per_agent * (sizeof(std::uint64_t) + chain_length * sizeof(bs_hash_entry));
    }
    /// What `agent`'s region must hold.
    [[nodiscard]] const Bytes& shard(unsigned agent) const { return shards_.at(agent); }
    /// The key at `position` (1..chain_length) of bucket `bucket`'s chain.
    [[nodiscard]] std::uint64_t key_at(std::uint64_t bucket, std::uint32_t position) const;
    /// The walk done here: the reference answer.
    [[nodiscard]] bs_hash_result lookup(std::uint64_t key) const;

private:
    std::uint64_t per_agent_ = 0;
    std::uint32_t chain_ = 0;
    std::vector<Bytes> shards_;
    std::vector<std::uint64_t> keys_; // bucket * chain_ + position - 1
};

/// Where a key's bucket lives: bs_mix64(key) % buckets.
std::uint64_t bucket_of(std::uint64_t key, std::uint64_t buckets) noexcept;
/// The global address of bucket `bucket`'s slot.
std::uint64_t bucket_slot(std::uint64_t bucket, std::uint64_t buckets_per_agent) noexcept;

class HashLookup {
public:
    /// Looks up each agent's "hash" region (region_not_found names the agent that lacks it);
    /// out_of_bounds when one is smaller than such a table needs. A walk reading more than
    /// `chain_limit` entries fails (a cycle in the table).
    static Result<HashLookup> open(Client& client, std::vector<Target> agents, std::uint64_t buckets_per_agent,
                                   std::uint32_t chain_limit);
    /// Writes each agent's share of the table with RDMA PUT.
    Result<void> load(const HashTable& table);

    /// Looks `key` up. Errors by code: out_of_bounds (get) or kernel_failed with the kernel's
    /// message (native, xrdma) for an address outside every region or a chain past the limit.
    Result<bs_hash_result> run(Strategy strategy, std::uint64_t key);
    /// run() without waiting; the future's bytes are a bs_hash_result.
    Future start(Strategy strategy, std::uint64_t key);

    [[nodiscard]] const std::vector<Target>& agents() const noexcept { return agents_; }

private:
    HashLookup(Client& client, std::vector<Target> agents, std::vector<RemoteRegion> regions, std::uint64_t per_agent,
               std::uint32_t limit)
        : client_(&client), agents_(std::move(agents)), regions_(std::move(regions)), per_agent_(per_agent), limit_(limit) {}
    Client* client_;
    std::vector<Target> agents_;
    std::vector<RemoteRegion> regions_;
    std::uint64_t per_agent_ = 0;
    std::uint32_t limit_ = 0;
};

/// Hash lookup as an Op: size = the position (1..chain length) in its chain of the key looked
/// up, always in the same bucket; the answer is a bs_hash_result.
class HashLookupOp final : public Op {
public:
    /// Makes the table (see HashTable::make) and loads it into the agents' "hash" regions
    /// (xagent --region hash=BYTES, at least HashTable::region_bytes(buckets_per_agent, chain_length)).
    static Result<std::unique_ptr<HashLookupOp>> create(Client& client, std::vector<Target> agents,
                                                        std::uint64_t buckets_per_agent, std::uint32_t chain_length,
                                                        std::uint64_t seed);

    [[nodiscard]] std::string_view name() const noexcept override { return "lookup"; }
    [[nodiscard]] std::string_view size_name() const noexcept override { return "chain"; }
    [[nodiscard]] std::uint64_t max_size() const noexcept override { return table_.chain_length(); }
    [[nodiscard]] const Kernel& kernel() const noexcept override;
    [[nodiscard]] OpWork work(std::uint64_t size) const override;
    /// Every strategy; reship on more than one agent (on one, the walk never crosses).
    [[nodiscard]] bool offers(Strategy s) const noexcept override;
    /// A size outside 1..max_size() fails with out_of_bounds, by every strategy.
    Future start(Strategy strategy, std::uint64_t size) override;
    [[nodiscard]] Bytes expected(std::uint64_t size) const override;

    /// The bucket every run walks.
    [[nodiscard]] std::uint64_t bucket() const noexcept { return bucket_; }
    [[nodiscard]] const HashTable& table() const noexcept { return table_; }

private:
    HashLookupOp(HashLookup lookup, HashTable table, std::uint64_t bucket)
        : lookup_(std::move(lookup)), table_(std::move(table)), bucket_(bucket) {}
    HashLookup lookup_;
    HashTable table_;
    std::uint64_t bucket_;
};

} // namespace bitship::xrdma
