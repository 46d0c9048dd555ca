#pragma once
// The client's side of a walk by strategy reship: the shipped kernel answers where the walk
// stands whenever its next step lives on another agent, and the walk is shipped on to that
// agent from here (Client::ship_chain), instead of the agents forwarding it to each other.

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include <bitship/client.hpp>

namespace bitship::xrdma {

/// What a come-back kernel's answers look like.
struct ComeBackShape {
    std::size_t final_size = 0;    ///< the walk's answer
    std::size_t continue_size = 0; ///< where the walk stands, to ship on
    /// Index in the agents of the agent to ship a `continue_size` answer to.
    std::function<std::uint64_t(std::span<const std::byte> answer)> owner;
    /// The arguments of that call, made from the answer.
    std::function<Bytes(std::span<const std::byte> answer)> next_args;
};

/// Ships `args` to agents[first] with `kernel`, then each `continue_size` answer on to the
/// agent it names, until a `final_size` answer: the walk's. Any other size, or an owner outside
/// `agents`, ends the walk with malformed_message. `agents` must outlive the walk.
Future come_back_walk(Client& client, const Kernel& kernel, const std::vector<Target>& agents, std::size_t first, Bytes args,
                      ComeBackShape shape);

} // namespace bitship::xrdma
