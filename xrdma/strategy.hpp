#pragma once
// How an X-RDMA operation runs: the data comes here, or the code goes there.

#include <string_view>

#include <bitship/errc.hpp>

namespace bitship::xrdma {

/// The interchangeable strategies of an X-RDMA operation (same inputs, same answer). Every
/// operation has the first three; a walk over several agents' data also has `reship`.
enum class Strategy {
    get,    ///< the client fetches the data with one-sided RDMA GET and computes here
    native, ///< a handler compiled into xagent in advance (the active-message baseline)
    xrdma,  ///< the shipped kernel, run next to the data (and forwarding itself between agents)
    reship, ///< the shipped kernel, coming back here where the data crosses to another agent,
            ///< and shipped again to that agent (Client::ship_chain): no agent-to-agent hop
};
std::string_view to_string(Strategy s) noexcept;
/// "get", "native", "xrdma" or "reship"; invalid_argument naming the word otherwise.
Result<Strategy> parse_strategy(std::string_view name);

} // namespace bitship::xrdma
