#pragma once
// What this machine offers kernels, read with hwloc and advertised to clients in WELCOME.

#include <cstdint>
#include <optional>

#include <bitship/capabilities.hpp>

namespace bitship::agent {

struct Topology {
    std::uint32_t cores = 1; ///< physical cores
    /// Hardware threads, NUMA nodes and their memory, the CPU's name, node kind, GPUs.
    Capabilities caps;
};

/// A PCI function that marks a machine as a BlueField DPU (its integrated ConnectX).
struct DpuPciId {
    std::uint16_t vendor = 0;
    std::uint16_t device = 0;
    const char* name = "";
};

/// The BlueField generation whose integrated NIC has this PCI id, or nullopt.
std::optional<DpuPciId> bluefield_pci_id(std::uint16_t vendor, std::uint16_t device) noexcept;

/// Never fails: falls back to std::thread::hardware_concurrency and one NUMA node of unknown
/// size when hwloc cannot load. `role` is the operator's word (xagent --role) and wins over
/// detection: without it, a node is a DPU when hwloc sees a BlueField PCI function and this
/// process runs on aarch64 cores (a host with a BlueField card sees the same function, but
/// from x86-64 or other non-BlueField cores).
Topology detect_topology(std::optional<NodeKind> role = std::nullopt);

} // namespace bitship::agent
