#pragma once
// How much one peer may make this side hold (inflight_ledger.hpp keeps the count): no UCX here,
// so an agent's config can name it.

#include <cstdint>

namespace bitship {

/// Per peer; 0: no limit of that kind. A client's engine sets none.
struct InflightLimits {
    std::uint64_t bytes = 0;
    std::uint64_t messages = 0;
    [[nodiscard]] bool any() const { return bytes != 0 || messages != 0; }
};

} // namespace bitship
