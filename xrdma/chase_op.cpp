#include "chase_op.hpp"

#include <algorithm>

#include <fmt/format.h>

#include <xrdma_kernels.hpp>

#include "region_io.hpp"

namespace bitship::xrdma {

Result<std::unique_ptr<ChaseOp>> ChaseOp::create(Client& client, std::vector<Target> agents, std::uint64_t nodes_per_agent,
                                                 std::uint64_t seed) {
    if (nodes_per_agent == 0) return fail(Errc::invalid_argument, "chase: needs at least one node per agent");
    auto chase = Chase::open(client, agents);
    if (!chase) return tl::make_unexpected(chase.error());
    auto list = ChaseList::make(static_cast<unsigned>(agents.size()), nodes_per_agent, seed);
    if (auto r = chase->load(list); !r) return tl::make_unexpected(r.error());
    return std::unique_ptr<ChaseOp>(new ChaseOp(std::move(*chase), std::move(list)));
}

std::uint64_t ChaseOp::max_size() const noexcept {
    // A call's hop budget (Chase::start gives depth + 1) is at most 0xffff.
    return std::min<std::uint64_t>(list_.agents() * list_.nodes_per_agent(), 0xfffe);
}

const Kernel& ChaseOp::kernel() const noexcept { return xrdma_kernels::chase; }

OpWork ChaseOp::work(std::uint64_t size) const {
    auto agents = list_.agents();
    OpWork w;
    w.dependent_gets = size;
    w.get_bytes = size * sizeof(bs_chase_node);
    w.remote_units = size;
    // Each hop lands on a random agent: it crosses with chance (agents-1)/agents.
    w.forwards = size * (agents - 1) / agents;
    w.result_bytes = sizeof(bs_chase_result);
    w.agents_touched = expected_agents(static_cast<std::uint32_t>(agents), size);
    return w;
}

bool ChaseOp::offers(Strategy s) const noexcept { return s != Strategy::reship || list_.agents() > 1; }

Future ChaseOp::start(Strategy strategy, std::uint64_t size) {
    if (size > max_size())
        return failed_future({Errc::out_of_bounds, fmt::format("chase: depth {} is over the list's {} nodes", size, max_size())});
    return chase_.start(strategy, start_address(), size);
}

Bytes ChaseOp::expected(std::uint64_t size) const { return bytes_of(list_.walk(start_address(), size)); }

} // namespace bitship::xrdma
