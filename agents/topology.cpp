#include "topology.hpp"

#include <hwloc.h>

#include <algorithm>
#include <thread>

namespace bitship::agent {

Topology detect_topology() {
    Topology t;
    t.pus = t.cores = std::max(1u, std::thread::hardware_concurrency());
    hwloc_topology_t topo = nullptr;
    if (hwloc_topology_init(&topo) != 0) return t;
    if (hwloc_topology_load(topo) == 0) {
        auto count = [&](hwloc_obj_type_t type) { return hwloc_get_nbobjs_by_type(topo, type); };
        if (int n = count(HWLOC_OBJ_CORE); n > 0) t.cores = static_cast<std::uint32_t>(n);
        if (int n = count(HWLOC_OBJ_PU); n > 0) t.pus = static_cast<std::uint32_t>(n);
        if (int n = count(HWLOC_OBJ_NUMANODE); n > 0) t.numa_nodes = static_cast<std::uint32_t>(n);
    }
    hwloc_topology_destroy(topo);
    return t;
}

} // namespace bitship::agent
