#pragma once
// The pointer chase as an X-RDMA operation: the same walk over the same list by three
// interchangeable strategies, same inputs, same answer.
//
//   auto list = ChaseList::make(agents.size(), 1 << 20, seed);   // a random cyclic list
//   Chase chase(client, agents);                                 // regions looked up once
//   chase.load(list);                                            // RDMA PUT into the regions
//   auto r = chase.run(Strategy::xrdma, list.address_of(start), 1024);
//   assert(r->addr == list.walk(start_addr, 1024).addr);

#include <cstdint>
#include <string_view>
#include <vector>

#include <bitship/client.hpp>
#include <bitship/kernel.h>

#include "kernels/chase_abi.h"
#include "strategy.hpp"

namespace bitship::xrdma {

/// A random cyclic list over several agents' regions, also kept here to check answers.
class ChaseList {
public:
    /// `nodes_per_agent` nodes on each of `agents` agents, linked in one random cycle; each
    /// hop lands on a uniformly random agent (random sharding). Same seed, same list.
    static ChaseList make(unsigned agents, std::uint64_t nodes_per_agent, std::uint64_t seed);

    [[nodiscard]] unsigned agents() const noexcept { return static_cast<unsigned>(shards_.size()); }
    [[nodiscard]] std::uint64_t nodes_per_agent() const noexcept { return per_agent_; }
    /// Global address of node `index` of agent `agent`.
    [[nodiscard]] static std::uint64_t address_of(unsigned agent, std::uint64_t index) noexcept {
        return BS_CHASE_ADDRESS(agent, index * sizeof(bs_chase_node));
    }
    /// The shard of `agent`: the bytes its region must hold.
    [[nodiscard]] const std::vector<bs_chase_node>& shard(unsigned agent) const { return shards_.at(agent); }
    /// The walk done here, in memory: the reference answer.
    [[nodiscard]] bs_chase_result walk(std::uint64_t start, std::uint64_t depth) const;

private:
    std::uint64_t per_agent_ = 0;
    std::vector<std::vector<bs_chase_node>> shards_;
};

/// The kernels the chase ships, and the native twin an agent may pre-install.
struct NativeKernel {
    const char* name;
    bs_entry_fn fn;
};
/// What xagent registers as pre-installed handlers (`chase`).
std::vector<NativeKernel> native_kernels();

class Chase {
public:
    /// Looks up each agent's "chase" region (region_not_found names the agent that lacks it).
    static Result<Chase> open(Client& client, std::vector<Target> agents);

    /// Writes each shard into its agent's region with RDMA PUT, then touches every page on the
    /// agent side (one GET per MiB) so no strategy pays first-touch faults when timed.
    Result<void> load(const ChaseList& list);

    /// Walks `depth` hops from `start`. Errors come back by code: out_of_bounds for an address
    /// outside every region (get), kernel_failed with the kernel's message (native, xrdma).
    Result<bs_chase_result> run(Strategy strategy, std::uint64_t start, std::uint64_t depth);
    /// run() without waiting.
    Future start(Strategy strategy, std::uint64_t start, std::uint64_t depth);

    [[nodiscard]] const std::vector<Target>& agents() const noexcept { return agents_; }

private:
    Chase(Client& client, std::vector<Target> agents, std::vector<RemoteRegion> regions)
        : client_(&client), agents_(std::move(agents)), regions_(std::move(regions)) {}
    Client* client_;
    std::vector<Target> agents_;
    std::vector<RemoteRegion> regions_;
};

} // namespace bitship::xrdma
