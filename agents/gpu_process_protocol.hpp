#pragma once
// What the agent and a bitship-gpu process (one per GPU, gpu_process.hpp) say to each other over
// their socket: frames (core/frame_io.hpp) whose payload starts with a type byte. One request at
// a time, each answered by OK or FAILED; the process starts by sending READY (or FAILED).
//
//   agent                                            bitship-gpu
//                                          ◄──  READY {version, the GPU: name, bus id, sm, limits}
//   ADD_REGION {name, size}                ──►  cuMemAlloc, zeroed           ◄── OK {}
//   LOAD_MODULE {hash, PTX}                ──►  cuModuleLoadDataEx            ◄── OK {}
//   LAUNCH {hash, entry, geometry, result bytes, timeout, args}  ──►  run, wait  ◄── OK {result}
//   READ {region, offset, length}          ──►  device to host                ◄── OK {bytes}
//   WRITE {region, offset, bytes}          ──►  host to device                ◄── OK {}
//   any of them                                 ◄── FAILED {code, poisoned, message}
// FAILED marked poisoned is the process's last word: its CUDA context is unusable (a sticky
// error such as CUDA_ERROR_ILLEGAL_ADDRESS, or a kernel that still runs past its time), which
// the driver lets no process recover from but by exiting. It exits right after; the agent
// starts another.
//
// Both sides decode with bounds checks: the agent's end reads what a process that runs shipped
// GPU code sends back, and caps each reply's size before reading it.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <bitship/bundle.hpp>
#include <bitship/errc.hpp>

#include "gpu_device.hpp"

namespace bitship::agent::gpu_protocol {

inline constexpr std::uint32_t kVersion = 1;
/// The process's fd for its end of the socket.
inline constexpr int kProcessFd = 3;
/// A READ or WRITE moves at most this much; larger ones are split by the agent.
inline constexpr std::uint64_t kMaxTransfer = std::uint64_t{64} << 20;
/// Caps on one frame: a request carries up to kMaxTransfer bytes, a module's PTX or a launch's
/// arguments; a reply up to kMaxTransfer bytes or a launch's result.
inline constexpr std::uint32_t kMaxFrame = (128u << 20) + 4096;
/// PTX the agent sends (its own compiler's output) is far smaller than this.
inline constexpr std::size_t kMaxPtxBytes = 64u << 20;

enum class Type : std::uint8_t { ready = 1, add_region = 2, load_module = 3, launch = 4, read = 5, write = 6, ok = 7, failed = 8 };

/// The GPU as the process opened it.
struct Ready {
    std::uint32_t version = kVersion;
    std::string name;
    std::string pci_bus_id;
    std::uint32_t sm = 0;
    GpuLimits limits;
    std::uint64_t memory_bytes = 0;
};
struct AddRegion {
    std::string name;
    std::uint64_t size = 0;
};
struct LoadModule {
    CodeHash hash{};
    std::string ptx;
};
struct Launch {
    CodeHash hash{};
    std::string entry;
    GpuGeometry geometry;
    std::uint32_t result_bytes = 0;
    std::chrono::milliseconds timeout{0};
    std::span<const std::byte> args; ///< a view into the decoded frame
};
struct Transfer { ///< READ (bytes empty, length set) or WRITE (bytes set)
    std::string region;
    std::uint64_t offset = 0;
    std::uint64_t length = 0;
    std::span<const std::byte> bytes; ///< a view into the decoded frame
};
struct Failed {
    Error error;
    bool poisoned = false;
};

std::vector<std::byte> encode(const Ready& m);
std::vector<std::byte> encode(const AddRegion& m);
std::vector<std::byte> encode(const LoadModule& m);
std::vector<std::byte> encode(const Launch& m);
std::vector<std::byte> encode_read(const std::string& region, std::uint64_t offset, std::uint64_t length);
std::vector<std::byte> encode_write(const std::string& region, std::uint64_t offset, std::span<const std::byte> bytes);
std::vector<std::byte> encode_ok(std::span<const std::byte> bytes);
std::vector<std::byte> encode(const Failed& m);

/// The frame's type, or malformed_message for an empty frame or an unknown type.
Result<Type> type_of(std::span<const std::byte> frame);
Result<Ready> decode_ready(std::span<const std::byte> frame);
Result<AddRegion> decode_add_region(std::span<const std::byte> frame);
Result<LoadModule> decode_load_module(std::span<const std::byte> frame);
Result<Launch> decode_launch(std::span<const std::byte> frame);
Result<Transfer> decode_read(std::span<const std::byte> frame);
Result<Transfer> decode_write(std::span<const std::byte> frame);
/// OK's bytes, a view into `frame`.
Result<std::span<const std::byte>> decode_ok(std::span<const std::byte> frame);
Result<Failed> decode_failed(std::span<const std::byte> frame);

} // namespace bitship::agent::gpu_protocol
