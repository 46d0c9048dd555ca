#pragma once
// What this machine offers kernels, read with hwloc and advertised to clients.

#include <cstdint>
#include <string>

namespace bitship::agent {

struct Topology {
    std::uint32_t cores = 1;      ///< physical cores
    std::uint32_t pus = 1;        ///< hardware threads
    std::uint32_t numa_nodes = 1;
};

/// Never fails: falls back to std::thread::hardware_concurrency when hwloc cannot load.
Topology detect_topology();

} // namespace bitship::agent
