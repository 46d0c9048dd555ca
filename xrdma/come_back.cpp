#include "come_back.hpp"

#include <memory>

#include <fmt/format.h>

namespace bitship::xrdma {

Future come_back_walk(Client& client, const Kernel& kernel, const std::vector<Target>& agents, std::size_t first, Bytes args,
                      ComeBackShape shape) {
    ShipOptions options;
    options.peers = agents; // so each call's kernel learns its agent's index (bs_self)
    options.hop_budget = 0; // it never forwards
    struct Walk {
        std::size_t first;
        Bytes args;
        ComeBackShape shape;
        bool started = false;
    };
    auto walk = std::make_shared<Walk>(Walk{first, std::move(args), std::move(shape)});
    const auto* table = &agents;
    return client.ship_chain(kernel, std::move(options),
                             [walk, table](std::span<const std::byte> last, Bytes& result) -> Result<std::optional<ShipStep>> {
                                 std::uint64_t owner = walk->first;
                                 Bytes args;
                                 if (!walk->started) {
                                     walk->started = true;
                                     args = std::move(walk->args);
                                 } else if (last.size() == walk->shape.final_size) {
                                     result.assign(last.begin(), last.end());
                                     return std::nullopt;
                                 } else if (last.size() == walk->shape.continue_size) {
                                     owner = walk->shape.owner(last);
                                     args = walk->shape.next_args(last);
                                 } else {
                                     return fail(Errc::malformed_message,
                                                 fmt::format("a come-back walk answered {} bytes (expected {} or {})", last.size(),
                                                             walk->shape.final_size, walk->shape.continue_size));
                                 }
                                 if (owner >= table->size())
                                     return fail(Errc::malformed_message,
                                                 fmt::format("a come-back walk goes on at agent {} of {}", owner, table->size()));
                                 return ShipStep{&(*table)[owner], std::move(args)};
                             });
}

} // namespace bitship::xrdma
