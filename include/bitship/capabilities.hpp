#pragma once
/// @file
/// What an agent's machine offers, as the agent reports it in WELCOME (read there with hwloc),
/// so clients and the planner see where they ship. `AgentInfo::capabilities` holds it.

#include <cstdint>
#include <string>
#include <vector>

namespace bitship {

/// The kind of node an agent runs on.
enum class NodeKind : std::uint8_t {
    host = 1, ///< a host's CPU
    dpu = 2,  ///< a DPU's own cores (BlueField's Arm cores)
};

/// "host" or "dpu".
const char* to_string(NodeKind kind) noexcept;

/// How an agent confines the kernels it runs (xagent --sandbox), as WELCOME says.
enum class SandboxMode : std::uint8_t {
    none = 0, ///< kernels reach all of the agent's memory: the operator trusts the code it runs
    sfi = 1,  ///< software fault isolation: every load and store confined to the agent's arena
};

/// "none" or "sfi".
const char* to_string(SandboxMode mode) noexcept;

/// One NUMA node of the agent's machine.
struct NumaNode {
    std::uint32_t os_index = 0;     ///< the OS's number for it (node0, node1, ...)
    std::uint64_t memory_bytes = 0; ///< its local memory; 0 when the OS does not say
};

/// The agent's machine. Cores and the CPU LLVM tunes for are `AgentInfo::cores` and
/// `AgentInfo::cpu`; these are the rest.
struct Capabilities {
    NodeKind kind = NodeKind::host;
    /// Why the agent says `kind`: "xagent --role dpu", "BlueField-3 (PCI 15b3:a2dc) on aarch64
    /// cores", "no BlueField PCI function seen", ...
    std::string kind_reason;
    std::uint32_t pus = 0;        ///< hardware threads
    std::vector<NumaNode> numa;   ///< at least one when the agent could read its topology
    std::string cpu_model;        ///< the CPU's own name (hwloc's CPUModel), "" when unknown
    std::uint32_t gpus = 0;       ///< GPUs the agent runs kernels on (`gpu_devices.size()` from agents that list them)
    /// Those GPUs, as the CUDA driver reports them, in the agent's order (device 0 first).
    struct Gpu {
        std::string name;                ///< "NVIDIA H100 80GB HBM3"
        std::uint32_t sm = 0;            ///< compute capability, major * 10 + minor (90)
        std::uint32_t multiprocessors = 0;
        std::uint64_t memory_bytes = 0;
        std::int32_t numa_node = -1;     ///< the NUMA node it sits near (hwloc), -1 when unknown
    };
    std::vector<Gpu> gpu_devices;
    /// The agent's GPU regions (xagent --region NAME=SIZE@gpu0), in the order a GPU kernel's
    /// `regions` parameter lists them.
    struct GpuRegion {
        std::string name;
        std::uint64_t size = 0;
        std::uint32_t device = 0;
    };
    std::vector<GpuRegion> gpu_regions;
};

} // namespace bitship
