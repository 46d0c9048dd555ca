#pragma once
// The client's side of a walk by strategy reship: the shipped kernel answers where the walk
// stands whenever its next step lives on another agent, and the walk is shipped on to that
// agent from here (Client::ship_chain), instead of the agents forwarding it to each other.

#include <cstddef>
#include <vector>

#include <bitship/client.hpp>

namespace bitship::xrdma {

/// What a come-back kernel's answers look like.
struct ComeBackShape {
    std::size_t final_size = 0;    ///< the walk's answer
    std::size_t continue_size = 0; ///< where the walk stands, to ship on
    /// Where in the walk's state the next step's global address sits (a uint64_t: the agent's
    /// index in the peer table in its top 16 bits, as BS_CHASE_OWNER and BS_HASH_OWNER read it).
    std::size_t address_at = 0;
    /// Appended to the walk's state to make a call's arguments (what asks the kernel to come back).
    Bytes suffix;
};

/// Ships `state` + suffix to the agent its address names, then each `continue_size` answer (the
/// walk's state again) on to the agent it names, until a `final_size` answer: the walk's. Any
/// other size fails with malformed_message; an address naming no agent of `agents`, with
/// out_of_bounds. `agents` must outlive the walk.
Future come_back_walk(Client& client, const Kernel& kernel, const std::vector<Target>& agents, Bytes state, ComeBackShape shape);

} // namespace bitship::xrdma
