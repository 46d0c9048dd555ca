#pragma once
// How much peers may make this side hold (inflight_ledger.hpp keeps the count): no UCX here, so
// an agent's config can name it.

#include <cstdint>

namespace bitship {

/// Bytes and messages held; 0: no limit of that kind. A client's engine sets none.
struct InflightLimits {
    std::uint64_t bytes = 0;
    std::uint64_t messages = 0;
    [[nodiscard]] bool any() const { return bytes != 0 || messages != 0; }
};

/// What one peer may make this side hold, and what all of them together may.
struct InflightBudget {
    InflightLimits per_peer;
    InflightLimits total;
    [[nodiscard]] bool any() const { return per_peer.any() || total.any(); }
};

/// A message this small from a peer that holds nothing is admitted past the total, so a light
/// client still gets an answer while others keep the agent full (each peer adds at most this).
inline constexpr std::uint64_t kAlwaysAdmitted = 64 << 10;

} // namespace bitship
