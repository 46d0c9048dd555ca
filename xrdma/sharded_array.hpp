#pragma once
// A global uint64_t array in contiguous blocks over several agents' "array" regions: the data
// reduce and filter run over. ShardedArray is the copy kept here (the reference answers come
// from it); RemoteArray reaches the agents' blocks.
//
//   auto data = ShardedArray::make(agents.size(), 1 << 16, seed);
//   auto array = RemoteArray::open(client, agents, data.items_per_agent());
//   array->load(data);                       // RDMA PUT into each agent's block

#include <cstdint>
#include <span>
#include <vector>

#include <bitship/client.hpp>

#include "kernels/array_abi.h"

namespace bitship::xrdma {

/// Random items, `items_per_agent` on each agent: agent a holds items [a * n, (a + 1) * n).
class ShardedArray {
public:
    /// Same arguments, same items.
    static ShardedArray make(unsigned agents, std::uint64_t items_per_agent, std::uint64_t seed);

    [[nodiscard]] unsigned agents() const noexcept { return agents_; }
    [[nodiscard]] std::uint64_t items_per_agent() const noexcept { return per_agent_; }
    [[nodiscard]] std::uint64_t size() const noexcept { return items_.size(); }
    /// Every item, in global order.
    [[nodiscard]] std::span<const std::uint64_t> items() const noexcept { return items_; }
    /// The block of `agent`: what its region must hold.
    [[nodiscard]] std::span<const std::uint64_t> shard(unsigned agent) const;

private:
    unsigned agents_ = 0;
    std::uint64_t per_agent_ = 0;
    std::vector<std::uint64_t> items_;
};

/// The part of a global item range one agent holds.
struct ArrayPiece {
    unsigned agent = 0;
    std::uint64_t first = 0; ///< counted from the start of the agent's block
    std::uint64_t count = 0;
};

/// The agents' "array" regions, as one global array.
class RemoteArray {
public:
    /// Looks up each agent's "array" region (region_not_found names the agent that lacks it);
    /// out_of_bounds when a region is smaller than `items_per_agent` items.
    static Result<RemoteArray> open(Client& client, std::vector<Target> agents, std::uint64_t items_per_agent);

    /// Writes each agent's block with RDMA PUT.
    Result<void> load(const ShardedArray& data);

    /// Global items [first, first + count) split by the agents holding them, in order;
    /// out_of_bounds naming the range when it is not inside the array.
    [[nodiscard]] Result<std::vector<ArrayPiece>> pieces(std::uint64_t first, std::uint64_t count) const;

    /// Items per GET the operations' fetching strategies ask for: 1 MiB.
    static constexpr std::uint64_t kGetChunkItems = (1u << 20) / sizeof(std::uint64_t);

    /// One-sided GETs of a piece's items, at most `chunk_items` per GET, all sent at once.
    [[nodiscard]] std::vector<Future> get(const ArrayPiece& piece, std::uint64_t chunk_items = kGetChunkItems) const;

    [[nodiscard]] Client& client() const noexcept { return *client_; }
    [[nodiscard]] const std::vector<Target>& agents() const noexcept { return agents_; }
    [[nodiscard]] std::uint64_t items_per_agent() const noexcept { return per_agent_; }
    [[nodiscard]] std::uint64_t size() const noexcept { return per_agent_ * agents_.size(); }

private:
    RemoteArray(Client& client, std::vector<Target> agents, std::vector<RemoteRegion> regions, std::uint64_t per_agent)
        : client_(&client), agents_(std::move(agents)), regions_(std::move(regions)), per_agent_(per_agent) {}
    Client* client_;
    std::vector<Target> agents_;
    std::vector<RemoteRegion> regions_;
    std::uint64_t per_agent_ = 0;
};

/// The items a run of GETs fetched, as one array (the GETs' bytes, concatenated).
std::vector<std::uint64_t> items_of(const std::vector<Bytes>& chunks);

} // namespace bitship::xrdma
