#pragma once
// Split messages: a message whose bulk is sent from where it lies. A RUN's 1 MiB of arguments
// copied into the message behind its few dozen bytes of header fields is a pass over every byte
// on the caller's thread (7% of all samples of bench/ship_rate's TCP arguments row). Instead
// the small parts before and after the bulk travel in UCX's AM header, behind the 24-byte
// Header, and the bulk is the AM data, which UCX sends by rendezvous straight from the
// caller's memory. The receiver lays the parts and the data out as the one payload an
// unsplit message would have had, so nothing after the engine knows the difference.
//
// AM header of a split message: Header (payload_size: the whole payload), u32 prefix bytes,
// u32 suffix bytes, the prefix, the suffix. Every length is checked against what arrived.
// Older agents read only the plain form: a client splits a RUN only for an agent whose WELCOME
// carries kFlagReadsSplit.

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "wire.hpp"

namespace bitship::wire {

inline constexpr std::size_t kSplitFrameBytes = sizeof(Header) + 2 * sizeof(std::uint32_t);

/// What an AM header said: the message's Header and, for a split message, the parts that go
/// before and after the AM data in its payload (empty for a plain one).
struct AmHeader {
    Header header;
    std::span<const std::byte> prefix;
    std::span<const std::byte> suffix;
};

/// Reads the AM header of a message that came with `data_length` bytes of AM data: a plain
/// 24-byte Header whose payload_size is `data_length`, or a split one whose payload_size is
/// its prefix, the data and its suffix together. Refuses anything else, naming what is wrong.
Result<AmHeader> decode_am_header(std::span<const std::byte> am, std::size_t data_length);

/// The AM header that sends split message `e` (kSplitFrameBytes and its two small parts),
/// written into `out` (whose storage is reused).
void write_split_header(const Encoded& e, std::vector<std::byte>& out);

/// Makes split message `e` an ordinary one: the borrowed bytes copied into its payload. For
/// parts too large for UCX's AM header, and for tests.
void join_split(Encoded& e);

} // namespace bitship::wire
