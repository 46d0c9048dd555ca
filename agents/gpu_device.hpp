#pragma once
// One GPU an agent runs kernels on, through the CUDA driver it opened with dlopen
// (cuda_api.hpp): its primary context and stream, the modules loaded from PTX (by code hash),
// its GPU regions (device memory, `xagent --region NAME=SIZE@gpu0`), and the pinned host
// buffers that GPU region reads and writes stage through. No CUDA type appears here.
//
//   auto api = CudaApi::load();                          // the driver, or no_device
//   auto gpu = GpuDevice::open(*api, 0);                 // context, stream, staging buffers
//   gpu->add_region("data", 4ull << 30);                 // before serving
//   gpu->load_module(hash, ptx);                         // once per hash
//   auto bytes = gpu->launch(hash, "sum_u64", args, 8, geometry, 10s);
//
// Thread-safe: calls may come from any worker thread; launches and transfers take turns on the
// device's one stream. A fault (CUDA_ERROR_ILLEGAL_ADDRESS and the other sticky errors) or a
// kernel past its time poisons the context for good: on a real driver (580, CUDA 13, H100)
// cuDevicePrimaryCtxReset then succeeds and the next cuDevicePrimaryCtxRetain still returns
// the sticky error, and only the end of the process stops a kernel that never returns. So the
// device does not try: it says it is poisoned() and refuses every later call. The agent runs
// each GPU in a process of its own (bitship-gpu, gpu_process.hpp) and starts another.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <bitship/bundle.hpp>
#include <bitship/client.hpp> // Bytes
#include <bitship/errc.hpp>

namespace bitship::agent {

struct CudaApi;
struct CudaDevice;

/// A launch's geometry, as CUDA's dim3: grid of blocks, block of threads.
struct GpuGeometry {
    std::uint32_t grid[3] = {1, 1, 1};
    std::uint32_t block[3] = {1, 1, 1};
};

/// What a GPU allows a launch, as its driver reports it.
struct GpuLimits {
    std::uint32_t multiprocessors = 0;
    std::uint32_t max_threads_per_block = 0;
    std::uint32_t max_block[3] = {0, 0, 0};
    std::uint32_t max_grid[3] = {0, 0, 0};
};

/// A GPU as its driver describes it.
struct GpuInfo {
    std::string name;
    std::string pci_bus_id; ///< "0000:3B:00.0"; empty when the driver did not say
    unsigned sm = 0;        ///< compute capability as major * 10 + minor (90 for an H100)
    GpuLimits limits;
    std::uint64_t memory_bytes = 0;
};

/// The geometry a call gets when it names none: 256 threads a block, 8 blocks per
/// multiprocessor (a grid-stride loop covers any size with it), within `limits`.
GpuGeometry default_geometry(const GpuLimits& limits);
/// The geometry a call of `entry` gets when it names none: what the kernel declares in `ptx`
/// (BS_GPU_GEOMETRY: threads a block, blocks per multiprocessor), else default_geometry().
GpuGeometry launch_geometry(const GpuLimits& limits, std::string_view ptx, std::string_view entry);

class GpuDevice {
public:
    /// Opens GPU `ordinal`: retains its primary context, makes one stream and the pinned
    /// staging buffers. `api` must outlive the device. no_device when the ordinal does not
    /// exist or the context cannot be made, naming the driver's error.
    static Result<std::unique_ptr<GpuDevice>> open(std::shared_ptr<const CudaApi> api, int ordinal);
    ~GpuDevice();
    GpuDevice(const GpuDevice&) = delete;
    GpuDevice& operator=(const GpuDevice&) = delete;

    [[nodiscard]] int ordinal() const noexcept;
    [[nodiscard]] const std::string& name() const noexcept;
    /// The driver's PCI address of the GPU ("0000:3B:00.0"); empty when it did not say.
    [[nodiscard]] const std::string& pci_bus_id() const noexcept;
    /// Compute capability as major * 10 + minor (90 for an H100).
    [[nodiscard]] unsigned sm() const noexcept;
    [[nodiscard]] unsigned multiprocessors() const noexcept;
    [[nodiscard]] std::uint64_t memory_bytes() const noexcept;
    [[nodiscard]] GpuLimits limits() const noexcept;
    /// All of the above.
    [[nodiscard]] GpuInfo info() const;
    /// default_geometry(limits()).
    [[nodiscard]] GpuGeometry default_geometry() const noexcept;
    /// launch_geometry() of module `hash`'s PTX, or default_geometry() for a module not loaded.
    [[nodiscard]] GpuGeometry geometry_for(const CodeHash& hash, std::string_view entry) const;

    /// Allocates a GPU region of `size` bytes of device memory, zeroed. At start-up, before any
    /// launch. invalid_argument for a duplicate name or size 0, no_device (with the driver's
    /// error) when the memory cannot be had.
    Result<void> add_region(const std::string& name, std::uint64_t size);
    struct RegionView {
        std::string name;
        std::uint64_t size = 0;
        std::size_t index = 0; ///< its place in a kernel's `regions` parameter
    };
    [[nodiscard]] std::optional<RegionView> region(std::string_view name) const;
    /// In the order added: what a kernel's `regions` parameter lists.
    [[nodiscard]] std::vector<RegionView> regions() const;

    /// Whether module `hash` is loaded.
    [[nodiscard]] bool has_module(const CodeHash& hash) const;
    /// Loads `ptx` as module `hash` (cuModuleLoadDataEx; the NUL is added here) and keeps the
    /// text (for geometry_for). Loading a hash already loaded does nothing.
    /// compile_failed with the driver's JIT error log when the driver refuses the PTX.
    Result<void> load_module(const CodeHash& hash, const std::string& ptx);
    /// Unloads module `hash` (cuModuleUnload) and forgets its PTX; a hash not loaded is no
    /// error. Errors name the driver's.
    Result<void> unload_module(const CodeHash& hash);

    /// Runs kernel `entry` of module `hash`: copies `args` to device memory (16-byte aligned),
    /// zeroes a result buffer of `result_bytes` (at least 1 byte is allocated), launches with
    /// parameters (args, result, regions table) and `geometry`, waits until it finishes or
    /// `timeout` passes, and returns the result buffer's bytes.
    /// Errors: entry_not_found (the module has no such kernel, or it is not loaded);
    /// invalid_argument (a geometry the device refuses: zero, or over its limits);
    /// kernel_timeout (still running at `timeout`) and kernel_crashed (a fault such as
    /// CUDA_ERROR_ILLEGAL_ADDRESS) poison the device; internal, naming the driver call and its
    /// error, otherwise (a sticky error there poisons it too).
    Result<Bytes> launch(const CodeHash& hash, std::string_view entry, std::span<const std::byte> args,
                         std::uint32_t result_bytes, const GpuGeometry& geometry, std::chrono::milliseconds timeout);

    /// Pins `memory` (cuMemHostRegister) for this device's life: reads, writes and launch
    /// arguments in it then go by DMA straight to or from it, not through the staging buffers
    /// (bitship-gpu pins its window with the agent). `memory` is page-aligned and outlives the
    /// device (or the next pin()). One range; a second call replaces it.
    /// no_device naming the driver's error when the driver refuses (the staging path remains).
    Result<void> pin(std::span<std::byte> memory);
    /// Copies `out.size()` bytes of region `name` from `offset` into `out`: by DMA straight into
    /// `out` when it lies in pinned memory (pin()), else through the pinned staging buffers in
    /// chunks (device-to-host of one chunk overlaps the copy-out of the previous).
    /// invalid_argument for an unknown region, or a range outside it.
    Result<void> read(std::string_view name, std::uint64_t offset, std::span<std::byte> out);
    /// The same, host to device.
    Result<void> write(std::string_view name, std::uint64_t offset, std::span<const std::byte> in);

    /// Why the context is unusable (a sticky error, or a kernel that still runs), or empty.
    /// Once set, every call that needs the driver fails with no_device naming it.
    [[nodiscard]] std::string poisoned() const;
    /// Kernels launched, and modules loaded, so far.
    [[nodiscard]] std::uint64_t launches() const noexcept;
    [[nodiscard]] std::uint64_t modules_loaded() const noexcept;

    struct Impl;

private:
    explicit GpuDevice(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

} // namespace bitship::agent
