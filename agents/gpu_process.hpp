#pragma once
// One GPU the agent runs kernels on, held by a process of its own: bitship-gpu
// (gpu_process_main.cpp), which owns the CUDA context (a GpuDevice) and answers requests in the
// frames of gpu_process_protocol.hpp. The agent keeps what a new process needs: the GPU regions
// it declared and every module's PTX.
//
// Why a process: a sticky CUDA error (CUDA_ERROR_ILLEGAL_ADDRESS, ...) poisons every context of
// the process that saw it, for the life of that process (cuDevicePrimaryCtxReset succeeds, the
// next cuDevicePrimaryCtxRetain still fails; seen on an H100, driver 580), and only the end of
// the process stops a kernel that never returns. So after either, the process is ended and
// another started: the regions are allocated again (zeroed) and modules reload from their PTX
// when next used; the failed call's error says so, and the agent serves on.
//
//   auto gpu = GpuProcess::start({program, 0, "libcuda.so.1"});
//   gpu->add_region("data", 4ull << 30);
//   gpu->load_module(hash, ptx);
//   auto bytes = gpu->launch(hash, "sum_u64", args, 8, gpu->geometry_for(hash, "sum_u64"), 10s);
//
// Thread-safe: calls take turns (the GPU's one stream does one thing at a time anyway).

#include "gpu_device.hpp"

#include <bitship/bundle.hpp>
#include <bitship/client.hpp> // Bytes
#include <bitship/errc.hpp>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace bitship::agent {

class GpuProcess {
public:
    struct Options {
        std::filesystem::path program; ///< bitship-gpu (find_program)
        int ordinal = 0;
        std::string cuda_library; ///< passed on: the driver library the process opens
        /// Modules kept (loaded, with their PTX) at most; past it the least recently launched
        /// is unloaded, and a later call to it is code_missing (the agent compiles it again).
        std::size_t max_modules = kDefaultMaxModules;
    };
    static constexpr std::size_t kDefaultMaxModules = 64;
    /// `configured` when given, else bitship-gpu beside this program (/proc/self/exe). io_error
    /// naming where it looked when it is not there.
    static Result<std::filesystem::path> find_program(const std::filesystem::path& configured);
    /// Starts the process and waits for it to open the GPU. no_device naming the process's
    /// error (no such ordinal, no context) or why it did not start.
    static Result<std::unique_ptr<GpuProcess>> start(Options options);
    /// Closes the socket (the process tears its context down and exits) and reaps it.
    ~GpuProcess();
    GpuProcess(const GpuProcess&) = delete;
    GpuProcess& operator=(const GpuProcess&) = delete;

    [[nodiscard]] int ordinal() const noexcept;
    /// The GPU, as the first process opened it (a later one must open the same).
    [[nodiscard]] const GpuInfo& info() const noexcept;
    /// launch_geometry() of module `hash`'s PTX (what the kernel declares), else the default.
    [[nodiscard]] GpuGeometry geometry_for(const CodeHash& hash, std::string_view entry) const;

    /// As GpuDevice::add_region; kept, and allocated again in every later process.
    Result<void> add_region(const std::string& name, std::uint64_t size);
    [[nodiscard]] std::optional<GpuDevice::RegionView> region(std::string_view name) const;
    [[nodiscard]] std::vector<GpuDevice::RegionView> regions() const;

    /// Whether module `hash` was loaded (in this process or an earlier one: it reloads from
    /// its kept PTX when next launched) and not unloaded since to make room.
    [[nodiscard]] bool has_module(const CodeHash& hash) const;
    /// As GpuDevice::load_module; when Options::max_modules are kept, the least recently
    /// launched one is unloaded first.
    Result<void> load_module(const CodeHash& hash, const std::string& ptx);
    /// Modules unloaded to make room for others, so far.
    [[nodiscard]] std::uint64_t module_evictions() const noexcept;
    /// As GpuDevice::launch; too_large when the arguments or the result do not fit the window
    /// (gpu_protocol::kWindowBytes); code_missing when module `hash` is not kept (never loaded,
    /// or unloaded to make room since). A kernel_crashed or kernel_timeout (and any error that
    /// poisoned the context, or the process's death) restarts the process: the error then says "the
    /// context was recreated in a new GPU process", and "GPU regions were allocated again (their
    /// contents are lost)" when there are any.
    Result<Bytes> launch(const CodeHash& hash, std::string_view entry,
                         std::span<const std::byte> args, std::uint32_t result_bytes,
                         const GpuGeometry& geometry, std::chrono::milliseconds timeout);
    /// As GpuDevice::read and write, through the shared window (gpu_process_protocol.hpp) in
    /// pieces of at most its size. A read's bytes are copied once, from the window into the
    /// returned buffer (no zero-fill first: at 16 MiB that was a second pass over the bytes).
    Result<Bytes> read(std::string_view name, std::uint64_t offset, std::uint64_t length);
    Result<void> write(std::string_view name, std::uint64_t offset, std::span<const std::byte> in);
    /// A read answered from the window itself: `bytes` lie in a read slot of the shared window
    /// (gpu_protocol::kReadSlots of kReadSlotBytes), which stays this read's, and mapped, until
    /// the last copy of `lease` is dropped (on any thread: hand it to the send that reads them).
    struct WindowRead {
        std::span<const std::byte> bytes;
        std::shared_ptr<const void> lease;
    };
    /// As read(), into a free read slot, with no copy: for 1 to kReadSlotBytes bytes. None (and
    /// no error) when the length does not suit or every slot is leased: read() then.
    Result<std::optional<WindowRead>> read_in_window(std::string_view name, std::uint64_t offset, std::uint64_t length);

    /// Times the process was replaced (its context recreated) after a fault, a timeout or its
    /// death.
    [[nodiscard]] std::uint64_t restarts() const noexcept;

    /// For the agent's stop: kills the process (a kernel that never returns holds it), and no
    /// other starts. The call waiting on it, and every later one, fails with shutting_down.
    /// Any thread, without waiting for the call in progress.
    void abort() noexcept;

    struct Impl;

private:
    explicit GpuProcess(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

} // namespace bitship::agent
