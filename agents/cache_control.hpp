#pragma once
// The one place the agent's control plane (xctl cache list|evict) reaches the JIT's code cache.

#include <bitship/errc.hpp>

#include "core/wire.hpp"
#include "jit.hpp"

namespace bitship::agent {

/// What the code cache holds (Jit::cached()).
Result<wire::CacheList> list_cached_code(const jit::Jit& jit);
/// Drops the cache's reference to `hash` (Jit::evict()); false when it was not there. Code a
/// running call holds stays loaded until that call ends.
Result<bool> evict_cached_code(jit::Jit& jit, const CodeHash& hash);

} // namespace bitship::agent
