#pragma once
// An X-RDMA operation as the planner sees it: a name, a size parameter, the work one run does
// in countable terms, and a way to start a run by any strategy. Every Op loads its data into
// the agents' regions when it is made and keeps a copy here, so expected() is the reference.

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <string_view>

#include <bitship/client.hpp>

#include "strategy.hpp"

namespace bitship::xrdma {

/// Work one run of an operation does, in the planner's terms (counts, not times).
struct OpWork {
    std::uint64_t dependent_gets = 0; ///< GET strategy: round trips that wait on each other
    std::uint64_t get_bytes = 0;      ///< GET strategy: bytes fetched in all
    std::uint64_t remote_units = 0;   ///< native/shipped: items or hops processed at the agents
    std::uint64_t forwards = 0;       ///< native/shipped: expected agent-to-agent forwards (0 on one agent)
    std::uint64_t result_bytes = 0;   ///< bytes of the answer
    std::uint32_t agents_touched = 1; ///< agents holding data this run reads
};

/// How many distinct agents `visits` landings on agents picked at random reach, on average
/// (rounded, at least 1): 4 hops over 4 agents reach 2.7 of them, 16 hops nearly all 4.
[[nodiscard]] inline std::uint32_t expected_agents(std::uint32_t agents, std::uint64_t visits) noexcept {
    if (agents <= 1 || visits <= 1) return 1;
    // Past a·ln(2a) visits (bounded here by a·(bit_width(a) + 1)) the unreached share
    // (1 − 1/a)^visits ≤ e^(−visits/a) is under 1/(2a): every agent, rounded. A loaded owner's
    // choose() asks this of each size, and std::pow cost it 40 ns of a 100 ns choice.
    if (visits > std::uint64_t{agents} * (std::bit_width(agents) + 1)) return agents;
    const double a = agents;
    const double reached = a * (1.0 - std::pow(1.0 - 1.0 / a, static_cast<double>(visits)));
    return static_cast<std::uint32_t>(std::clamp(std::llround(reached), 1LL, static_cast<long long>(agents)));
}

/// One operation over data loaded into remote regions, runnable by every Strategy.
class Op {
public:
    virtual ~Op() = default;
    [[nodiscard]] virtual std::string_view name() const noexcept = 0;      ///< "chase", "reduce", "filter", "lookup"
    [[nodiscard]] virtual std::string_view size_name() const noexcept = 0; ///< "depth", "items", "items", "chain"
    [[nodiscard]] virtual std::uint64_t max_size() const noexcept = 0;     ///< largest size the loaded data allows
    [[nodiscard]] virtual const Kernel& kernel() const noexcept = 0;       ///< the shipped kernel
    [[nodiscard]] virtual OpWork work(std::uint64_t size) const = 0;
    /// Whether `s` is one of this operation's strategies: get, native and xrdma always; reship
    /// only for a walk that can cross agents.
    [[nodiscard]] virtual bool offers(Strategy s) const noexcept { return s != Strategy::reship; }
    /// Starts one run of `size` by `strategy`; the future's bytes are the answer. A size
    /// outside 0..max_size() (1..max_size() for lookup), or reship for a fan-out (reduce,
    /// filter), completes at once with invalid_argument.
    virtual Future start(Strategy strategy, std::uint64_t size) = 0;
    /// The answer computed here from the data this process loaded (the reference).
    [[nodiscard]] virtual Bytes expected(std::uint64_t size) const = 0;
};

} // namespace bitship::xrdma
