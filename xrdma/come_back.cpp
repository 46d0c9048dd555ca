#include "come_back.hpp"

#include <cstring>
#include <memory>

#include <fmt/format.h>

namespace bitship::xrdma {

Future come_back_walk(Client& client, const Kernel& kernel, const std::vector<Target>& agents, Bytes state, ComeBackShape shape) {
    ShipOptions options;
    options.peers = agents; // so each call's kernel learns its agent's index (bs_self)
    options.hop_budget = 0; // it never forwards
    struct Walk {
        Bytes state;
        ComeBackShape shape;
        bool started = false;
    };
    auto walk = std::make_shared<Walk>(Walk{std::move(state), std::move(shape)});
    const auto* table = &agents;
    return client.ship_chain(kernel, std::move(options),
                             [walk, table](std::span<const std::byte> last, Bytes& result) -> Result<std::optional<ShipStep>> {
                                 const auto& shape = walk->shape;
                                 if (walk->started) {
                                     if (last.size() == shape.final_size) {
                                         result.assign(last.begin(), last.end());
                                         return std::nullopt;
                                     }
                                     if (last.size() != shape.continue_size)
                                         return fail(Errc::malformed_message,
                                                     fmt::format("a come-back walk answered {} bytes (expected {} or {})", last.size(),
                                                                 shape.final_size, shape.continue_size));
                                     walk->state.assign(last.begin(), last.end());
                                 }
                                 walk->started = true;
                                 std::uint64_t address = 0;
                                 if (walk->state.size() < shape.address_at + sizeof address)
                                     return fail(Errc::malformed_message, "a come-back walk's state is too short for its address");
                                 std::memcpy(&address, walk->state.data() + shape.address_at, sizeof address);
                                 const auto owner = address >> 48;
                                 if (owner >= table->size())
                                     return fail(Errc::out_of_bounds,
                                                 fmt::format("a come-back walk goes on at agent {} of {}", owner, table->size()));
                                 Bytes args = walk->state;
                                 args.insert(args.end(), shape.suffix.begin(), shape.suffix.end());
                                 return ShipStep{&(*table)[owner], std::move(args)};
                             });
}

} // namespace bitship::xrdma
