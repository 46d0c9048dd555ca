#pragma once
// The agent's named memory regions: allocated and registered with UCX, readable by kernels
// (bs_region) and by clients with one-sided RDMA (their packed rkeys travel in REGION_INFO).

#include <cstddef>
#include <map>
#include <optional>
#include <memory>
#include <shared_mutex>
#include <string>
#include <string_view>

#include <bitship/errc.hpp>

#include "core/engine.hpp"

namespace bitship::agent {

struct Region {
    std::string name;
    void* base = nullptr;
    std::size_t size = 0;
    Engine::Mapped mapped;
};

/// "NAME=SIZE" with SIZE like 4096, 64K, 16MiB, 1G; "NAME=SIZE@gpuN" for GPU N's memory.
struct RegionSpec {
    std::string name;
    std::size_t size = 0;
    std::optional<unsigned> gpu; ///< set: a GPU region on this device (gpu_device.hpp)
};
Result<RegionSpec> parse_region_spec(std::string_view spec);

class SandboxArena;

class RegionTable {
public:
    /// `arena`: where regions are placed under --sandbox sfi (kernels reach only the arena);
    /// nullptr: anywhere.
    RegionTable(Engine& engine, Engine::RegionMemory memory, SandboxArena* arena = nullptr)
        : engine_(engine), memory_(memory), arena_(arena) {}
    ~RegionTable();
    RegionTable(const RegionTable&) = delete;
    RegionTable& operator=(const RegionTable&) = delete;

    /// Allocates and registers a region. Progress thread only, or before it starts: UCX
    /// registration shares state with the worker.
    Result<const Region*> create(const std::string& name, std::size_t size);
    /// Any thread. Regions live until the table dies, so the pointer stays valid.
    [[nodiscard]] const Region* find(std::string_view name) const;
    /// Releases every registration; the engine must be stopped.
    void clear();

private:
    Engine& engine_;
    Engine::RegionMemory memory_;
    SandboxArena* arena_;
    mutable std::shared_mutex mutex_;
    std::map<std::string, std::unique_ptr<Region>, std::less<>> regions_;
};

} // namespace bitship::agent
