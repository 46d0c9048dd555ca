#include "sharded_array.hpp"

#include <cstring>
#include <random>

#include <fmt/format.h>

#include "region_io.hpp"

namespace bitship::xrdma {

ShardedArray ShardedArray::make(unsigned agents, std::uint64_t items_per_agent, std::uint64_t seed) {
    ShardedArray a;
    a.agents_ = agents;
    a.per_agent_ = items_per_agent;
    a.items_.resize(agents * items_per_agent);
    std::mt19937_64 rng(seed);
    for (auto& x : a.items_) x = rng();
    return a;
}

std::span<const std::uint64_t> ShardedArray::shard(unsigned agent) const {
    if (agent >= agents_) throw std::out_of_range(fmt::format("no agent {} in an array over {}", agent, agents_));
    return std::span(items_).subspan(agent * per_agent_, per_agent_);
}

Result<RemoteArray> RemoteArray::open(Client& client, std::vector<Target> agents, std::uint64_t items_per_agent) {
    if (agents.empty()) return fail(Errc::invalid_argument, "an array needs at least one agent");
    auto regions = open_regions(client, agents, BS_ARRAY_REGION);
    if (!regions) return tl::make_unexpected(regions.error());
    for (std::size_t a = 0; a < agents.size(); ++a) {
        if ((*regions)[a].size / sizeof(std::uint64_t) < items_per_agent)
            return fail(Errc::out_of_bounds,
                        fmt::format("region '{}' of agent {} holds {} bytes, too few for {} items of 8 bytes", BS_ARRAY_REGION,
                                    agents[a].info().address, (*regions)[a].size, items_per_agent));
    }
    return RemoteArray(client, std::move(agents), std::move(*regions), items_per_agent);
}

Result<void> RemoteArray::load(const ShardedArray& data) {
    if (data.agents() != agents_.size() || data.items_per_agent() != per_agent_)
        return fail(Errc::invalid_argument, fmt::format("data of {} × {} items does not match an array of {} × {}", data.agents(),
                                                        data.items_per_agent(), agents_.size(), per_agent_));
    for (unsigned a = 0; a < agents_.size(); ++a)
        if (auto r = fill_region(*client_, regions_[a], std::as_bytes(data.shard(a)), agents_[a].info()); !r) return r;
    return {};
}

Result<std::vector<ArrayPiece>> RemoteArray::pieces(std::uint64_t first, std::uint64_t count) const {
    if (first > size() || count > size() - first)
        return fail(Errc::out_of_bounds,
                    fmt::format("items [{}, {}) lie outside the array of {} items", first, first + count, size()));
    std::vector<ArrayPiece> out;
    for (std::uint64_t at = first, end = first + count; at < end;) {
        auto agent = static_cast<unsigned>(at / per_agent_);
        auto local = at % per_agent_;
        auto n = std::min(end - at, per_agent_ - local);
        out.push_back({agent, local, n});
        at += n;
    }
    return out;
}

std::vector<Future> RemoteArray::get(const ArrayPiece& piece, std::uint64_t chunk_items) const {
    std::vector<Future> out;
    for (std::uint64_t at = 0; at < piece.count; at += chunk_items) {
        auto n = std::min(chunk_items, piece.count - at);
        out.push_back(client_->get(regions_.at(piece.agent), (piece.first + at) * sizeof(std::uint64_t),
                                   static_cast<std::uint32_t>(n * sizeof(std::uint64_t))));
    }
    return out;
}

std::vector<std::uint64_t> items_of(const std::vector<Bytes>& chunks) {
    std::size_t bytes = 0;
    for (const auto& c : chunks) bytes += c.size();
    std::vector<std::uint64_t> out(bytes / sizeof(std::uint64_t));
    std::size_t at = 0;
    for (const auto& c : chunks) {
        std::memcpy(reinterpret_cast<std::byte*>(out.data()) + at, c.data(), c.size());
        at += c.size();
    }
    return out;
}

} // namespace bitship::xrdma
