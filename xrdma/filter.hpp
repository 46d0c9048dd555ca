#pragma once
// Filter/gather as an X-RDMA operation: the items of a range of a global uint64_t array
// (spread over the agents' "array" regions) that match a predicate of tunable selectivity,
// in order, by three interchangeable strategies.
//
//   auto filter = Filter::open(client, agents, data.items_per_agent());
//   filter->load(data);
//   auto t = Filter::threshold_for(0.1);                          // keeps about 10%
//   auto items = filter->run(Strategy::native, t, 0, 5000);       // std::vector<std::uint64_t>
//
//   get     one-sided GETs of 1 MiB chunks, all in flight at once; filtered here
//   native  one call of the pre-installed "filter" per agent holding part of the range, sent
//           together (fan-out); the answers concatenated here in agent order
//   xrdma   the same with the shipped filter kernel
// One agent's answer must fit its result limit (AgentInfo::max_result, xagent --max-result):
// a range whose worst case (every item matching) would not is refused before it is sent.

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include <bitship/client.hpp>

#include "kernels/filter_abi.h"
#include "op.hpp"
#include "sharded_array.hpp"

namespace bitship::xrdma {

class Filter {
public:
    /// The agents' "array" regions, `items_per_agent` items each (see RemoteArray::open).
    static Result<Filter> open(Client& client, std::vector<Target> agents, std::uint64_t items_per_agent);
    /// Writes each agent's block with RDMA PUT.
    Result<void> load(const ShardedArray& data) { return array_.load(data); }

    /// The threshold keeping about `selectivity` (0..1) of random items.
    static std::uint32_t threshold_for(double selectivity) noexcept;
    /// The items of `items` that match under `threshold`, in order: the reference answer.
    static std::vector<std::uint64_t> local(std::uint32_t threshold, std::span<const std::uint64_t> items);

    /// The matching items of global items [first, first + count), in order. Errors by code,
    /// before anything is sent: out_of_bounds for a range outside the array, invalid_argument
    /// for a threshold over 1024, too_large (native, xrdma) when an agent's part could answer
    /// more than its result limit; kernel_failed with the kernel's message.
    Result<std::vector<std::uint64_t>> run(Strategy strategy, std::uint32_t threshold, std::uint64_t first,
                                           std::uint64_t count);
    /// run() without waiting; the future's bytes are the matching items.
    Future start(Strategy strategy, std::uint32_t threshold, std::uint64_t first, std::uint64_t count);

    /// The longest range from item 0 whose worst case fits every agent's result limit.
    [[nodiscard]] std::uint64_t max_count() const noexcept;

    [[nodiscard]] const RemoteArray& array() const noexcept { return array_; }

private:
    explicit Filter(RemoteArray array) : array_(std::move(array)) {}
    RemoteArray array_;
};

/// Filter as an Op: size = items tested, from item 0; the answer is the matching items.
class FilterOp final : public Op {
public:
    /// Makes `items_per_agent` random items (from `seed`) for each agent, loads them into the
    /// agents' "array" regions (xagent --region array=BYTES, at least 8 × items_per_agent);
    /// keeps about `selectivity` (0..1) of them.
    static Result<std::unique_ptr<FilterOp>> create(Client& client, std::vector<Target> agents, double selectivity,
                                                    std::uint64_t items_per_agent, std::uint64_t seed);

    [[nodiscard]] std::string_view name() const noexcept override { return "filter"; }
    [[nodiscard]] std::string_view size_name() const noexcept override { return "items"; }
    /// Every item, or fewer when an agent's result limit could not hold its whole block.
    [[nodiscard]] std::uint64_t max_size() const noexcept override;
    [[nodiscard]] const Kernel& kernel() const noexcept override;
    [[nodiscard]] OpWork work(std::uint64_t size) const override;
    /// A size over max_size() fails with too_large, by every strategy.
    Future start(Strategy strategy, std::uint64_t size) override;
    [[nodiscard]] Bytes expected(std::uint64_t size) const override;

    [[nodiscard]] std::uint32_t threshold() const noexcept { return threshold_; }
    [[nodiscard]] double selectivity() const noexcept { return selectivity_; }
    [[nodiscard]] const ShardedArray& data() const noexcept { return data_; }

private:
    FilterOp(Filter filter, ShardedArray data, double selectivity)
        : filter_(std::move(filter)), data_(std::move(data)), selectivity_(selectivity),
          threshold_(Filter::threshold_for(selectivity)) {}
    Filter filter_;
    ShardedArray data_;
    double selectivity_;
    std::uint32_t threshold_;
};

} // namespace bitship::xrdma
