#include "topology.hpp"

#include <hwloc.h>

#include <algorithm>
#include <array>
#include <thread>

#include <fmt/format.h>

namespace bitship::agent {
namespace {

constexpr std::uint16_t kMellanoxVendor = 0x15b3;

// The integrated ConnectX functions of each BlueField generation: the Arm cores' own NIC.
constexpr std::array kBlueFieldIds{
    DpuPciId{kMellanoxVendor, 0xa2d2, "BlueField"},
    DpuPciId{kMellanoxVendor, 0xa2d6, "BlueField-2"},
    DpuPciId{kMellanoxVendor, 0xa2dc, "BlueField-3"},
};

constexpr std::array kUnusedComponents{"pci", "opencl", "gl", "cuda", "nvml", "rsmi", "levelzero"};

#if defined(__aarch64__)
constexpr bool kArmCores = true;
#else
constexpr bool kArmCores = false;
#endif

// One owner for the hwloc topology, released on every path.
struct HwlocTopology {
    hwloc_topology_t topo = nullptr;
    HwlocTopology() {
        if (hwloc_topology_init(&topo) != 0) topo = nullptr;
    }
    ~HwlocTopology() {
        if (topo) hwloc_topology_destroy(topo);
    }
    HwlocTopology(const HwlocTopology&) = delete;
    HwlocTopology& operator=(const HwlocTopology&) = delete;
};

std::string cpu_model(hwloc_topology_t topo) {
    // hwloc puts CPUModel on each package (on the root object on some platforms).
    for (auto* obj = hwloc_get_next_obj_by_type(topo, HWLOC_OBJ_PACKAGE, nullptr); obj;
         obj = hwloc_get_next_obj_by_type(topo, HWLOC_OBJ_PACKAGE, obj))
        if (const char* m = hwloc_obj_get_info_by_name(obj, "CPUModel")) return m;
    if (const char* m = hwloc_obj_get_info_by_name(hwloc_get_root_obj(topo), "CPUModel")) return m;
    return {};
}

std::optional<std::pair<DpuPciId, std::string>> find_bluefield(hwloc_topology_t topo) {
    for (auto* obj = hwloc_get_next_pcidev(topo, nullptr); obj; obj = hwloc_get_next_pcidev(topo, obj)) {
        const auto& pci = obj->attr->pcidev;
        if (auto id = bluefield_pci_id(pci.vendor_id, pci.device_id))
            return std::pair{*id, fmt::format("{:04x}:{:02x}:{:02x}.{}", pci.domain, pci.bus, pci.dev, pci.func)};
    }
    return std::nullopt;
}

} // namespace

std::optional<DpuPciId> bluefield_pci_id(std::uint16_t vendor, std::uint16_t device) noexcept {
    for (const auto& id : kBlueFieldIds)
        if (id.vendor == vendor && id.device == device) return id;
    return std::nullopt;
}

Topology detect_topology(std::optional<NodeKind> role) {
    Topology t;
    t.cores = t.caps.pus = std::max(1u, std::thread::hardware_concurrency());
    std::optional<std::pair<DpuPciId, std::string>> bluefield;

    HwlocTopology h;
    // PCI devices are needed for the DPU check; bridges and the rest of the I/O tree are not.
    // On Linux hwloc reads them from sysfs; its libpciaccess plugin ("pci") would only repeat
    // that (and leaks at load, which LSan reports), and the GPU plugins (GL opens an X display)
    // are not used yet: those components stay out.
    if (h.topo)
        for (const char* plugin : kUnusedComponents)
            hwloc_topology_set_components(h.topo, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST, plugin);
    if (h.topo && hwloc_topology_set_io_types_filter(h.topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT) == 0 &&
        hwloc_topology_load(h.topo) == 0) {
        auto count = [&](hwloc_obj_type_t type) { return hwloc_get_nbobjs_by_type(h.topo, type); };
        if (int n = count(HWLOC_OBJ_CORE); n > 0) t.cores = static_cast<std::uint32_t>(n);
        if (int n = count(HWLOC_OBJ_PU); n > 0) t.caps.pus = static_cast<std::uint32_t>(n);
        for (auto* node = hwloc_get_next_obj_by_type(h.topo, HWLOC_OBJ_NUMANODE, nullptr); node;
             node = hwloc_get_next_obj_by_type(h.topo, HWLOC_OBJ_NUMANODE, node))
            t.caps.numa.push_back({node->os_index, node->attr ? node->attr->numanode.local_memory : 0});
        t.caps.cpu_model = cpu_model(h.topo);
        bluefield = find_bluefield(h.topo);
    }
    if (t.caps.numa.empty()) t.caps.numa.push_back({0, 0});

    if (role) {
        t.caps.kind = *role;
        t.caps.kind_reason = fmt::format("operator: xagent --role {}", to_string(*role));
    } else if (bluefield && kArmCores) {
        t.caps.kind = NodeKind::dpu;
        t.caps.kind_reason = fmt::format("{} (PCI {:04x}:{:04x} at {}) on aarch64 cores", bluefield->first.name,
                                         bluefield->first.vendor, bluefield->first.device, bluefield->second);
    } else if (bluefield) {
        t.caps.kind = NodeKind::host;
        t.caps.kind_reason = fmt::format("host with a {} card (PCI {}): its cores are not the DPU's", bluefield->first.name,
                                         bluefield->second);
    } else {
        t.caps.kind = NodeKind::host;
        t.caps.kind_reason = "no BlueField PCI function seen";
    }
    t.caps.gpus = 0; // GPU agents come later; the field is in WELCOME already
    return t;
}

} // namespace bitship::agent
