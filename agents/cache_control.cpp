// xctl cache list|evict → the JIT's bounded code cache (Jit::cached, Jit::evict).
#include "cache_control.hpp"

#include <algorithm>
#include <chrono>

namespace bitship::agent {

Result<wire::CacheList> list_cached_code(const jit::Jit& jit) {
    wire::CacheList out;
    const auto now = std::chrono::steady_clock::now();
    for (const auto& c : jit.cached()) {
        // last_use comes from a coarse clock that may trail now() by a tick: never negative.
        const auto idle = std::chrono::duration_cast<std::chrono::milliseconds>(now - c.last_use).count();
        out.entries.push_back({c.hash, c.code_bytes, c.disk_bytes, static_cast<std::uint64_t>(std::max<decltype(idle)>(idle, 0)),
                               c.in_use});
    }
    return out;
}

Result<bool> evict_cached_code(jit::Jit& jit, const CodeHash& hash) { return jit.evict(hash); }

} // namespace bitship::agent
