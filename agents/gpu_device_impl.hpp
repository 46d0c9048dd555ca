#pragma once
// The private state of a GpuDevice (gpu_device.hpp), shared by the files that implement it:
//   gpu_device.cpp     the context, modules and launches
//   gpu_transfers.cpp  GPU region reads and writes through the pinned staging buffers
// Everything below `mutex` is touched with it held.

#include "gpu_device.hpp"

#include "cuda_api.hpp"

#include <array>
#include <atomic>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>

#include <fmt/format.h>

namespace bitship::agent {

/// Each of the two pinned staging buffers that GPU region reads and writes go through.
inline constexpr std::size_t kStagingBytes = std::size_t{8} << 20;
/// CUDA's three dimensions of a grid and a block.
inline constexpr std::size_t kDims = 3;

struct HostFree {
    void operator()(void* p) const noexcept { std::free(p); }
};

struct GpuDevice::Impl {
    using CUdeviceptr = cuda::CUdeviceptr;
    using CUresult = cuda::CUresult;

    /// Device memory the device owns: grown, never shrunk.
    struct DeviceBuffer {
        CUdeviceptr pointer = 0;
        std::size_t capacity = 0;
    };
    struct Region {
        std::string name;
        std::uint64_t size = 0;
        CUdeviceptr pointer = 0;
    };
    /// A loaded module, and its PTX (what the kernels declare of their geometry is read there).
    struct Module {
        std::string ptx;
        cuda::CUmodule handle = nullptr;
        std::map<std::string, cuda::CUfunction, std::less<>> functions;
    };
    /// A pinned host buffer and the event recorded after the last copy that used it.
    struct Staging {
        std::unique_ptr<std::byte, HostFree> host;
        bool registered = false;
        cuda::CUevent done = nullptr;
        bool pending = false; ///< `done` recorded and not yet waited for
    };

    Impl(std::shared_ptr<const CudaApi> api_in, int ordinal_in)
        : api(std::move(api_in)), cu(*api), ordinal(ordinal_in),
          where(fmt::format("GPU {}", ordinal_in)) {}
    ~Impl();

    std::shared_ptr<const CudaApi>
        api; // keeps the table (and so the library) for this device's life
    const CudaApi& cu;
    const int ordinal;
    const std::string where; ///< "GPU 0", what every message starts with

    // Set by open(), constant afterwards.
    cuda::CUdevice device = 0;
    std::string name;
    std::string pci_bus_id; ///< "0000:3B:00.0", or empty
    unsigned sm = 0;
    unsigned multiprocessors = 0;
    std::uint64_t memory_bytes = 0;
    std::uint64_t max_threads_per_block = 0;
    std::array<std::uint32_t, kDims> max_block{};
    std::array<std::uint32_t, kDims> max_grid{};

    std::atomic<std::uint64_t> launches{0};
    std::atomic<std::uint64_t> modules_loaded{0};

    // Everything below is guarded by `mutex`: the device's one stream does one thing at a time.
    mutable std::mutex mutex;
    cuda::CUcontext context = nullptr;
    bool retained = false; ///< we hold one reference on the primary context
    cuda::CUstream stream = nullptr;
    std::array<Staging, 2> staging;
    std::size_t next_staging = 0;
    std::span<std::byte> pinned; ///< host memory registered by pin(): DMA goes straight there
    std::vector<Region> regions;
    std::map<CodeHash, Module> modules;
    DeviceBuffer args;
    DeviceBuffer result;
    DeviceBuffer table;         ///< the regions table: one CUdeviceptr per region
    bool table_current = false; ///< `table` lists the regions' current pointers
    std::string poisoned;       ///< why the context is unusable for good; empty when usable

    // The steps below run with `mutex` held.

    Result<void> make_context();
    std::string poison(std::string why);
    Result<void> ready();
    Error refused(std::string_view call, CUresult r, Errc code) const;
    Error failed(std::string_view call, CUresult r, Errc code = Errc::internal);
    Result<void> allocate_zeroed(CUdeviceptr& pointer, std::uint64_t size, std::string_view what);
    Result<void> reserve(DeviceBuffer& buffer, std::size_t size, std::string_view what);
    Result<void> settle(Staging& s);
    /// Whether `host` lies wholly in the memory pin() registered.
    bool is_pinned(std::span<const std::byte> host) const noexcept;
    Result<void> upload(CUdeviceptr to, std::span<const std::byte> from);
    Result<void> download(CUdeviceptr from, std::span<std::byte> to);
    Result<void> load(const CodeHash& hash, Module& module);
    Result<cuda::CUfunction> function(const CodeHash& hash, std::string_view entry);
    Result<void> wait_for_kernel(std::string_view entry,
                                 std::chrono::steady_clock::time_point start,
                                 std::chrono::milliseconds timeout);
    const Region* find_region(std::string_view region_name) const;
};

} // namespace bitship::agent
