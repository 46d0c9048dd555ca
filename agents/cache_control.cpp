// xctl cache list|evict → the JIT's bounded code cache.
//
// NOT CONNECTED YET: the bounded cache (Jit::cached() returning std::vector<CachedCodeInfo>,
// Jit::evict(const CodeHash&), --cache-mib / --cache-disk-mib) is built on another branch in
// jit/. When it is merged, these two functions become:
//
//   Result<wire::CacheList> list_cached_code(const jit::Jit& jit) {
//       wire::CacheList out;
//       for (const auto& c : jit.cached())
//           out.entries.push_back({c.hash, c.memory_bytes, c.disk_bytes, c.idle_ms, c.in_use});
//       return out;
//   }
//   Result<bool> evict_cached_code(jit::Jit& jit, const CodeHash& hash) { return jit.evict(hash); }
//
// (mapping CachedCodeInfo's fields onto wire::CacheEntry), and nothing else changes: the wire
// messages, the agent's dispatch and xctl already carry them.
#include "cache_control.hpp"

namespace bitship::agent {

namespace {
tl::unexpected<Error> not_built() {
    return fail(Errc::unknown_message, "this agent's code cache cannot be listed or evicted yet (the bounded code "
                                       "cache, Jit::cached/Jit::evict, is not built in)");
}
} // namespace

Result<wire::CacheList> list_cached_code(const jit::Jit&) { return not_built(); }

Result<bool> evict_cached_code(jit::Jit&, const CodeHash&) { return not_built(); }

} // namespace bitship::agent
