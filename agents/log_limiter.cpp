#include "log_limiter.hpp"

namespace bitship::agent {

bool LogLimiter::allow(std::uint64_t conn, std::uint64_t& suppressed, std::chrono::steady_clock::time_point now) {
    suppressed = 0;
    auto& s = slots_[conn % kSlots];
    if (s.conn != conn) s = Slot{conn, now, 0, 0};
    if (now - s.window >= kWindow) {
        suppressed = s.suppressed;
        s.window = now;
        s.lines = 0;
        s.suppressed = 0;
    }
    if (s.lines < kBurst) {
        ++s.lines;
        return true;
    }
    ++s.suppressed;
    return false;
}

} // namespace bitship::agent
