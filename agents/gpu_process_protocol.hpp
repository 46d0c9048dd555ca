#pragma once
// What the agent and a bitship-gpu process (one per GPU, gpu_process.hpp) say to each other over
// their socket: frames (core/frame_io.hpp) whose payload starts with a type byte. One request at
// a time, each answered by OK or FAILED; the process starts by sending READY (or FAILED).
// Bulk bytes (a launch's arguments and result, what a region read or write moves) do not go
// through the socket: they lie in the window, shared memory the agent makes (memfd) and the
// process maps (fd 4); a frame says how many, and a READ or WRITE where (at): offset 0, or a
// read slot past the first kWindowBytes, which the agent answers its client from directly.
//
//   agent                                            bitship-gpu
//                                          ◄──  READY {version, the GPU: name, bus id, sm, limits}
//   ADD_REGION {name, size}                ──►  cuMemAlloc, zeroed           ◄── OK {0}
//   LOAD_MODULE {hash, PTX}                ──►  cuModuleLoadDataEx            ◄── OK {0}
//   UNLOAD_MODULE {hash}                   ──►  cuModuleUnload                ◄── OK {0}
//   LAUNCH {hash, entry, geometry, result bytes, timeout, args bytes}  ──►  run, wait
//                                               ◄── OK {result bytes, in the window}
//   READ {region, offset, length, at}      ──►  device to the window at `at`  ◄── OK {length}
//   WRITE {region, offset, length, at}     ──►  the window at `at` to device  ◄── OK {0}
//   any of them                                 ◄── FAILED {code, poisoned, message}
// FAILED marked poisoned is the process's last word: its CUDA context is unusable (a sticky
// error such as CUDA_ERROR_ILLEGAL_ADDRESS, or a kernel that still runs past its time), which
// the driver lets no process recover from but by exiting. It exits right after; the agent
// starts another.
//
// Both sides decode with bounds checks: the agent's end reads what a process that runs shipped
// GPU code sends back, and caps each reply's size before reading it.

#include "gpu_device.hpp"

#include <bitship/bundle.hpp>
#include <bitship/errc.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace bitship::agent::gpu_protocol {

inline constexpr std::uint32_t kVersion = 3; ///< 2: UNLOAD_MODULE; 3: READ and WRITE say where in the window
/// The process's fds: its end of the socket, and the window.
inline constexpr int kProcessFd = 3;
inline constexpr int kWindowFd = 4;
/// The window's size: a READ or WRITE moves at most this much (larger ones are split by the
/// agent), and a launch's arguments and its result must each fit. Its pages are had when first
/// touched.
inline constexpr std::uint64_t kWindowBytes = std::uint64_t{64} << 20;
/// Past those, kReadSlots slots of kReadSlotBytes: a read the agent answers from the window
/// itself (GpuProcess::read_in_window) lands in one, which stays its own until the answer is
/// sent. The window's whole size is kWindowTotalBytes.
inline constexpr std::uint64_t kReadSlotBytes = std::uint64_t{16} << 20;
inline constexpr unsigned kReadSlots = 4;
inline constexpr std::uint64_t kWindowTotalBytes = kWindowBytes + kReadSlots * kReadSlotBytes;
/// PTX the agent sends (its own compiler's output) is far smaller than this.
inline constexpr std::size_t kMaxPtxBytes = 64u << 20;
/// Cap on one frame: LOAD_MODULE's PTX is the largest thing a frame carries.
inline constexpr std::uint32_t kMaxFrame = kMaxPtxBytes + 4096;

enum class Type : std::uint8_t {
    ready = 1,
    add_region = 2,
    load_module = 3,
    launch = 4,
    read = 5,
    write = 6,
    ok = 7,
    failed = 8,
    unload_module = 9
};

/// The GPU as the process opened it.
struct Ready {
    std::uint32_t version = kVersion;
    GpuInfo gpu;
};
struct AddRegion {
    std::string name;
    std::uint64_t size = 0;
};
struct LoadModule {
    CodeHash hash{};
    std::string ptx;
};
struct UnloadModule {
    CodeHash hash{};
};
struct Launch {
    CodeHash hash{};
    std::string entry;
    GpuGeometry geometry;
    std::uint32_t result_bytes = 0;
    std::chrono::milliseconds timeout{0};
    std::uint64_t args_bytes = 0; ///< in the window
};
struct Transfer { ///< READ or WRITE of `length` bytes (in the window, at `at`)
    std::string region;
    std::uint64_t offset = 0;
    std::uint64_t length = 0;
    std::uint64_t at = 0;
};
struct Failed {
    Error error;
    bool poisoned = false;
};

/// The window: shared memory (a memfd), mapped read-write. Unmapped and closed on destruction.
class Window {
public:
    /// A new one of kWindowTotalBytes, for the agent (its fd passed to each process as kWindowFd).
    static Result<Window> create();
    /// The one on `fd`, for the process: refused unless it is kWindowTotalBytes long.
    static Result<Window> map(int fd);
    Window(Window&& other) noexcept;
    Window& operator=(Window&&) = delete;
    Window(const Window&) = delete;
    ~Window();
    [[nodiscard]] int fd() const noexcept { return fd_; }
    [[nodiscard]] std::span<std::byte> bytes() const noexcept { return {data_, size_}; }

private:
    Window(int fd, std::byte* data, std::size_t size) : fd_(fd), data_(data), size_(size) {}
    int fd_ = -1;
    std::byte* data_ = nullptr;
    std::size_t size_ = 0;
};

std::vector<std::byte> encode(const Ready& m);
std::vector<std::byte> encode(const AddRegion& m);
std::vector<std::byte> encode(const LoadModule& m);
std::vector<std::byte> encode(const UnloadModule& m);
std::vector<std::byte> encode(const Launch& m);
std::vector<std::byte> encode_read(const Transfer& m);
std::vector<std::byte> encode_write(const Transfer& m);
/// OK: `window_bytes` of the answer lie in the window.
std::vector<std::byte> encode_ok(std::uint64_t window_bytes = 0);
std::vector<std::byte> encode(const Failed& m);

/// The frame's type, or malformed_message for an empty frame or an unknown type.
Result<Type> type_of(std::span<const std::byte> frame);
Result<Ready> decode_ready(std::span<const std::byte> frame);
Result<AddRegion> decode_add_region(std::span<const std::byte> frame);
Result<LoadModule> decode_load_module(std::span<const std::byte> frame);
Result<UnloadModule> decode_unload_module(std::span<const std::byte> frame);
Result<Launch> decode_launch(std::span<const std::byte> frame);
Result<Transfer> decode_read(std::span<const std::byte> frame);
Result<Transfer> decode_write(std::span<const std::byte> frame);
/// OK's count of bytes in the window (at most kWindowBytes).
Result<std::uint64_t> decode_ok(std::span<const std::byte> frame);
Result<Failed> decode_failed(std::span<const std::byte> frame);

} // namespace bitship::agent::gpu_protocol
