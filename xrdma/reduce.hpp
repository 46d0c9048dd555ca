#pragma once
// Reduce as an X-RDMA operation: the sum, min or max of a range of a global uint64_t array
// spread over the agents' "array" regions, by three interchangeable strategies.
//
//   auto data = ShardedArray::make(agents.size(), 1 << 16, seed);
//   auto reduce = Reduce::open(client, agents, data.items_per_agent());
//   reduce->load(data);
//   auto r = reduce->run(Strategy::xrdma, ReduceKind::sum, 0, 1000);   // bs_reduce_result
//   assert(r->value == Reduce::local(ReduceKind::sum, data.items().first(1000)).value);
//
//   get     one-sided GETs of 1 MiB chunks, all in flight at once; reduced here
//   native  one call of the pre-installed "reduce" per agent holding part of the range, sent
//           together (fan-out); the partial results combined here
//   xrdma   the same with the shipped reduce kernel

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include <bitship/client.hpp>

#include "kernels/reduce_abi.h"
#include "op.hpp"
#include "sharded_array.hpp"

namespace bitship::xrdma {

enum class ReduceKind : std::uint32_t { sum = BS_REDUCE_SUM, min = BS_REDUCE_MIN, max = BS_REDUCE_MAX };
std::string_view to_string(ReduceKind k) noexcept;
/// "sum", "min" or "max"; invalid_argument naming the word otherwise.
Result<ReduceKind> parse_reduce_kind(std::string_view name);

class Reduce {
public:
    /// The agents' "array" regions, `items_per_agent` items each (see RemoteArray::open).
    static Result<Reduce> open(Client& client, std::vector<Target> agents, std::uint64_t items_per_agent);
    /// Writes each agent's block with RDMA PUT.
    Result<void> load(const ShardedArray& data) { return array_.load(data); }

    /// Reduces global items [first, first + count). Errors by code: out_of_bounds for a range
    /// outside the array (before anything is sent), kernel_failed with the kernel's message.
    Result<bs_reduce_result> run(Strategy strategy, ReduceKind kind, std::uint64_t first, std::uint64_t count);
    /// run() without waiting; the future's bytes are a bs_reduce_result.
    Future start(Strategy strategy, ReduceKind kind, std::uint64_t first, std::uint64_t count);

    /// The reduction done here: the reference answer.
    static bs_reduce_result local(ReduceKind kind, std::span<const std::uint64_t> items) noexcept;
    /// Two partial results as one.
    static bs_reduce_result combine(ReduceKind kind, bs_reduce_result a, bs_reduce_result b) noexcept;

    [[nodiscard]] const RemoteArray& array() const noexcept { return array_; }

private:
    explicit Reduce(RemoteArray array) : array_(std::move(array)) {}
    RemoteArray array_;
};

/// Reduce as an Op: size = items reduced, from item 0.
class ReduceOp final : public Op {
public:
    /// Makes `items_per_agent` random items (from `seed`) for each agent, loads them into the
    /// agents' "array" regions (xagent --region array=BYTES, at least 8 × items_per_agent).
    static Result<std::unique_ptr<ReduceOp>> create(Client& client, std::vector<Target> agents, ReduceKind kind,
                                                    std::uint64_t items_per_agent, std::uint64_t seed);

    [[nodiscard]] std::string_view name() const noexcept override { return "reduce"; }
    [[nodiscard]] std::string_view size_name() const noexcept override { return "items"; }
    [[nodiscard]] std::uint64_t max_size() const noexcept override { return data_.size(); }
    [[nodiscard]] const Kernel& kernel() const noexcept override;
    [[nodiscard]] OpWork work(std::uint64_t size) const override;
    Future start(Strategy strategy, std::uint64_t size) override;
    [[nodiscard]] Bytes expected(std::uint64_t size) const override;

    [[nodiscard]] ReduceKind kind() const noexcept { return kind_; }
    [[nodiscard]] const ShardedArray& data() const noexcept { return data_; }

private:
    ReduceOp(Reduce reduce, ShardedArray data, ReduceKind kind)
        : reduce_(std::move(reduce)), data_(std::move(data)), kind_(kind) {}
    Reduce reduce_;
    ShardedArray data_;
    ReduceKind kind_;
};

} // namespace bitship::xrdma
