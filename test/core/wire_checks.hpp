#pragma once
// What the wire tests share: a string's bytes, and the check that no cut of a message decodes.

#include <catch2/catch.hpp>

#include <span>
#include <string>
#include <vector>

#include "core/wire.hpp"

namespace bitship::test {

inline std::span<const std::byte> as_bytes(const std::string& s) { return std::as_bytes(std::span(s.data(), s.size())); }

/// Every cut of `e`'s payload short of its end is refused as malformed.
inline void every_truncation_refused(const wire::Encoded& e) {
    for (std::size_t n = 0; n < e.payload.size(); ++n) {
        auto h = e.header;
        h.payload_size = static_cast<std::uint32_t>(n);
        std::vector<std::byte> cut(e.payload.begin(), e.payload.begin() + static_cast<std::ptrdiff_t>(n));
        auto m = wire::decode(h, cut);
        REQUIRE_FALSE(m);
        CHECK(m.error().code == Errc::malformed_message);
    }
}

} // namespace bitship::test
