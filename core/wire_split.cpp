#include "wire_split.hpp"

#include <cstring>

#include <fmt/format.h>

namespace bitship::wire {

Result<AmHeader> decode_am_header(std::span<const std::byte> am, std::size_t data_length) {
    if (am.size() == sizeof(Header)) {
        auto h = decode_header(am, data_length);
        if (!h) return tl::make_unexpected(h.error());
        return AmHeader{*h, {}, {}};
    }
    if (am.size() < kSplitFrameBytes)
        return fail(Errc::malformed_message, fmt::format("header is {} bytes, expected {} (or a split message's {} and more)",
                                                         am.size(), sizeof(Header), kSplitFrameBytes));
    std::uint32_t prefix = 0, suffix = 0;
    std::memcpy(&prefix, am.data() + sizeof(Header), sizeof prefix);
    std::memcpy(&suffix, am.data() + sizeof(Header) + sizeof prefix, sizeof suffix);
    const auto parts = am.subspan(kSplitFrameBytes);
    if (std::uint64_t{prefix} + suffix != parts.size())
        return fail(Errc::malformed_message, fmt::format("split message header declares {} + {} bytes around its data but carries {}",
                                                         prefix, suffix, parts.size()));
    // The whole payload as the Header declares it: prefix, data, suffix (at most 4 GiB, as a
    // u32 payload_size can say; larger never equals it).
    const std::uint64_t whole = std::uint64_t{prefix} + suffix + data_length;
    auto h = decode_header(am.first(sizeof(Header)), whole);
    if (!h) return tl::make_unexpected(h.error());
    if (h->type == Type::batch)
        return fail(Errc::malformed_message, "a BATCH cannot be a split message"); // its items are whole messages
    return AmHeader{*h, parts.first(prefix), parts.subspan(prefix)};
}

void write_split_header(const Encoded& e, std::vector<std::byte>& out) {
    const auto prefix = static_cast<std::uint32_t>(e.split_at);
    const auto suffix = static_cast<std::uint32_t>(e.payload.size() - e.split_at);
    out.resize(kSplitFrameBytes + e.payload.size());
    std::memcpy(out.data(), &e.header, sizeof(Header));
    std::memcpy(out.data() + sizeof(Header), &prefix, sizeof prefix);
    std::memcpy(out.data() + sizeof(Header) + sizeof prefix, &suffix, sizeof suffix);
    std::memcpy(out.data() + kSplitFrameBytes, e.payload.data(), e.payload.size());
}

void join_split(Encoded& e) {
    if (!e.split()) return;
    e.payload.insert(e.payload.begin() + static_cast<std::ptrdiff_t>(e.split_at), e.borrowed.begin(), e.borrowed.end());
    e.borrowed = {};
    e.keep.reset();
    e.split_at = 0;
}

} // namespace bitship::wire
