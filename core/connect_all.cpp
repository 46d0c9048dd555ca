// Client::connect_all: the agents of a launched job, from its peers file, in rank order.
#include <bitship/client.hpp>
#include <bitship/peers.hpp>

#include <fmt/format.h>

namespace bitship {

Result<std::vector<Target>> Client::connect_all(const std::filesystem::path& peers_file) {
    auto peers = read_peers_file(peers_file);
    if (!peers) return tl::make_unexpected(peers.error());
    std::vector<Target> targets;
    targets.reserve(peers->size());
    for (const auto& p : *peers) {
        auto t = connect(p.address);
        if (!t) return fail(t.error().code, fmt::format("rank {} of {}: {}", p.rank, peers_file.string(), t.error().message));
        targets.push_back(*t);
    }
    return targets;
}

} // namespace bitship
