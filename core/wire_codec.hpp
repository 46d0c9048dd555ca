#pragma once
// What the wire codec's files share (wire.cpp, wire_run.cpp, wire_control.cpp): building an
// Encoded, reporting a field cut short, and the checked readers every decoder uses. Private to
// core/.

#include <array>
#include <cstring>
#include <optional>

#include <fmt/format.h>

#include "byte_io.hpp"
#include "wire.hpp"

namespace bitship::wire::codec {

inline Encoded start(Type type, std::uint64_t id) {
    Encoded e;
    e.header.type = type;
    e.header.request_id = id;
    return e;
}

inline Encoded finish(Encoded e, ByteWriter&& w) {
    e.payload = std::move(w).take();
    e.header.payload_size = static_cast<std::uint32_t>(e.payload.size());
    return e;
}

inline tl::unexpected<Error> truncated(Type t, std::string_view field) {
    return fail(Errc::malformed_message, fmt::format("{} message: '{}' runs past the end of the payload", to_string(t), field));
}

inline tl::unexpected<Error> trailing(Type t, std::size_t bytes) {
    return fail(Errc::malformed_message, fmt::format("{} message has {} unexpected trailing bytes", to_string(t), bytes));
}

// A list count checked against what the payload can hold at `min_size` bytes per element,
// before anything is reserved for it.
inline std::optional<std::uint32_t> count_of(ByteReader& in, std::size_t min_size) {
    auto n = in.u32();
    if (!n || *n > in.remaining() / min_size) return std::nullopt;
    return n;
}

inline bool read_hash(ByteReader& in, CodeHash& out) {
    auto b = in.bytes(out.size());
    if (!b) return false;
    std::memcpy(out.data(), b->data(), out.size());
    return true;
}

template <std::size_t N> bool read_array(ByteReader& in, std::array<std::uint8_t, N>& out) {
    auto b = in.bytes(N);
    if (!b) return false;
    std::memcpy(out.data(), b->data(), N);
    return true;
}

template <std::size_t N> void write_array(ByteWriter& w, const std::array<std::uint8_t, N>& a) {
    w.raw(std::as_bytes(std::span(a)));
}

/// RUN's payload after its header, into `r` (value-initialized) (wire_run.cpp).
Result<void> decode_run(const Header& header, ByteReader& in, Run& r, const OutsideArgs* outside = nullptr);
/// The operator's control replies (wire_control.cpp): STATS_REPLY, INFO_REPLY,
/// KERNEL_STATS_REPLY, CACHE_LIST_REPLY, CACHE_EVICT, ACK.
Result<Body> decode_control(Type t, ByteReader& in);

} // namespace bitship::wire::codec
