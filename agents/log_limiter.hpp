#pragma once
// Rate limit for the lines an agent logs about one client's failed calls: a client that sends
// the same bad call in a loop gets kBurst lines per window, then one line saying how many were
// suppressed. Used only by whoever progresses (one thread at a time): no lock.

#include <chrono>
#include <cstdint>
#include <vector>

namespace bitship::agent {

class LogLimiter {
public:
    static constexpr unsigned kBurst = 5;
    static constexpr std::chrono::seconds kWindow{10};
    static constexpr std::size_t kSlots = 1024; ///< connections tracked at once (by id modulo)

    LogLimiter() : slots_(kSlots) {}

    /// Whether a line about connection `conn`'s failure may be logged now. When a new window
    /// opens after suppressed lines, `suppressed` says how many (log it once).
    bool allow(std::uint64_t conn, std::uint64_t& suppressed,
               std::chrono::steady_clock::time_point now = std::chrono::steady_clock::now());

private:
    struct Slot {
        std::uint64_t conn = 0;
        std::chrono::steady_clock::time_point window{};
        unsigned lines = 0;
        std::uint64_t suppressed = 0;
    };
    std::vector<Slot> slots_;
};

} // namespace bitship::agent
