#pragma once
// The pointer chase as an Op: size = depth, walked from a fixed start node.

#include <cstdint>
#include <memory>

#include "chase.hpp"
#include "op.hpp"

namespace bitship::xrdma {

class ChaseOp final : public Op {
public:
    /// Makes a random cyclic list of `nodes_per_agent` nodes per agent (ChaseList::make) and
    /// loads it into the agents' "chase" regions (xagent --region chase=BYTES, at least
    /// 16 × nodes_per_agent). Every run starts at node 0 of agent 0.
    static Result<std::unique_ptr<ChaseOp>> create(Client& client, std::vector<Target> agents,
                                                   std::uint64_t nodes_per_agent, std::uint64_t seed);

    [[nodiscard]] std::string_view name() const noexcept override { return "chase"; }
    [[nodiscard]] std::string_view size_name() const noexcept override { return "depth"; }
    /// Once round the whole cycle, at most 65534 (the hop budget of one call).
    [[nodiscard]] std::uint64_t max_size() const noexcept override;
    [[nodiscard]] const Kernel& kernel() const noexcept override;
    [[nodiscard]] OpWork work(std::uint64_t size) const override;
    /// Every strategy; reship on more than one agent (on one, the walk never crosses).
    [[nodiscard]] bool offers(Strategy s) const noexcept override;
    /// A depth over max_size() fails with out_of_bounds, by every strategy.
    Future start(Strategy strategy, std::uint64_t size) override;
    [[nodiscard]] Bytes expected(std::uint64_t size) const override;

    [[nodiscard]] std::uint64_t start_address() const noexcept { return ChaseList::address_of(0, 0); }
    [[nodiscard]] const ChaseList& list() const noexcept { return list_; }

private:
    ChaseOp(Chase chase, ChaseList list) : chase_(std::move(chase)), list_(std::move(list)) {}
    Chase chase_;
    ChaseList list_;
};

} // namespace bitship::xrdma
