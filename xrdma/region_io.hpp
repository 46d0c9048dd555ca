#pragma once
// Region plumbing the X-RDMA operations share: finding a region on every agent, filling it.

#include <span>
#include <string_view>
#include <vector>

#include <bitship/client.hpp>

namespace bitship::xrdma {

/// Region `name` of every agent, in order (region_not_found names the agent that lacks it).
Result<std::vector<RemoteRegion>> open_regions(Client& client, const std::vector<Target>& agents, std::string_view name);

/// Writes `bytes` at offset 0 of `region` with RDMA PUTs of at most 4 MiB, a few in flight.
/// out_of_bounds, naming the region and agent, when they do not fit.
Result<void> fill_region(Client& client, const RemoteRegion& region, std::span<const std::byte> bytes,
                         const AgentInfo& agent);

/// A future that is already failed with `error` (for arguments refused before anything is sent).
Future failed_future(Error error);

/// Bytes holding exactly the object `v`.
template <class T> Bytes bytes_of(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    Bytes b(sizeof v);
    std::memcpy(b.data(), &v, sizeof v);
    return b;
}

} // namespace bitship::xrdma
