#include "region_io.hpp"

#include <fmt/format.h>

namespace bitship::xrdma {
namespace {
constexpr std::size_t kPutChunk = 4u << 20; // bytes per RDMA PUT while loading
constexpr std::size_t kPutsInFlight = 8;    // bounds the memory held in flight
} // namespace

Result<std::vector<RemoteRegion>> open_regions(Client& client, const std::vector<Target>& agents, std::string_view name) {
    std::vector<RemoteRegion> regions;
    regions.reserve(agents.size());
    for (const auto& a : agents) {
        auto r = client.region(a, name);
        if (!r) return tl::make_unexpected(r.error());
        regions.push_back(std::move(*r));
    }
    return regions;
}

Result<void> fill_region(Client& client, const RemoteRegion& region, std::span<const std::byte> bytes,
                         const AgentInfo& agent) {
    if (bytes.size() > region.size)
        return fail(Errc::out_of_bounds, fmt::format("{} bytes do not fit region '{}' ({} bytes) of agent {}", bytes.size(),
                                                     region.name, region.size, agent.address));
    std::vector<Future> puts;
    for (std::size_t at = 0; at < bytes.size(); at += kPutChunk) {
        auto chunk = bytes.subspan(at, std::min(kPutChunk, bytes.size() - at));
        puts.push_back(client.put(region, at, Bytes(chunk.begin(), chunk.end())));
        if (puts.size() >= kPutsInFlight) {
            for (auto& f : puts)
                if (auto r = f.get(); !r) return tl::make_unexpected(r.error());
            puts.clear();
        }
    }
    for (auto& f : puts)
        if (auto r = f.get(); !r) return tl::make_unexpected(r.error());
    return {};
}

Future failed_future(Error error) {
    return Future::join({}, [error = std::move(error)](std::vector<Bytes>&) -> Result<Bytes> {
        return tl::make_unexpected(error);
    });
}

} // namespace bitship::xrdma
