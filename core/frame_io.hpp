#pragma once
// Frames between bitship's own processes over a blocking socket: a u32 little-endian length,
// then the payload. The agent and its bitship-compiler processes use them, and the agent and
// its bitship-gpu processes. Whoever reads a frame caps its size before allocating a byte of it.
//
//   if (auto sent = write_frame(fd, payload, "GPU process"); !sent) ...
//   auto frame = read_frame(fd, kMaxReply, "GPU process", Clock::now() + 5s);

#include <bitship/errc.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

namespace bitship {

/// Writes `payload` as one frame, whole (EINTR and short writes handled; a closed peer is an
/// error, never a SIGPIPE). `peer` names the other side in errors ("compiler": "writing to the
/// compiler socket: ..."). io_error naming errno; too_large over 4 GiB.
Result<void> write_frame(int fd, std::span<const std::byte> payload, std::string_view peer);

/// Reads one frame of at most `max` payload bytes. `deadline` (none: wait forever) bounds the
/// whole read: timeout ("the compiler did not answer in time") when it passes. disconnected at
/// end of file before a whole frame; too_large for a longer frame (nothing of it is read).
Result<std::vector<std::byte>>
read_frame(int fd, std::uint32_t max, std::string_view peer,
           std::optional<std::chrono::steady_clock::time_point> deadline = std::nullopt);

/// Polls `fd` without sleeping until it is readable (or closed) or `spin` has passed: a reader
/// that expects an answer soon skips the wake-up a blocking read would cost (tens of µs when
/// the core it waits on has gone idle, as in a VM), and then reads as usual.
void spin_until_readable(int fd, std::chrono::nanoseconds spin);

} // namespace bitship
