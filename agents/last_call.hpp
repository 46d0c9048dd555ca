#pragma once
// What the agent remembers of the last call it handled, so that the next one, from the same
// client to the same code (as back-to-back calls are), skips the lookups that found them: the
// sender's link, connection and admission, the code's cache entry, its author's admission, the
// kernel's entry and stats slot. Each memo holds the generation of what it was looked up in
// (routes, sessions, keys, the code cache) and is good only while that has not changed. Touched
// by whoever progresses (Agent::Impl), one at a time.

#include <cstdint>
#include <memory>
#include <string>

#include <ucp/api/ucp.h>

#include "jit.hpp"
#include "kernel_stats.hpp"

namespace bitship::agent {

/// A code cache generation no lookup was made in (jit::Jit::cache_generation never reaches it).
inline constexpr std::uint64_t kNoCacheGeneration = ~std::uint64_t{0};

/// The last message's sender when it was a client's admitted session: the next message from
/// the same endpoint skips the three lookups (link, connection, admission) while neither the
/// routes nor the gate's sessions changed since (a reused endpoint address is a new route).
struct LastSender {
    ucp_ep_h ep = nullptr;
    std::uint64_t conn = 0;
    std::uint64_t routes = 0, sessions = 0;
};

/// The code admit_code last admitted (signed by an author authorized in the gate's `keys`
/// generation): the next call to it, carrying no signatures, is admitted so again.
struct LastAdmitted {
    CodeHash hash{};
    std::uint64_t keys = 0;
    bool valid = false;
};

/// The kernel the last call ran, found again without a lookup (the code's entry table and the
/// stats table: about 340 instructions a call) when the next call names the same code object
/// and entry. Compared by owner: `code` keeps its control block, so no other code object can
/// take its place, and not the code (nor its cache entry's use count, which eviction reads) alive.
struct LastEntry {
    /// jit->cache_generation() when it was kept: while it is the same, the cache holds `code`
    /// for `hash` still, and a call to `hash` runs it without a lookup (Agent::Impl::cached_code).
    std::uint64_t generation = kNoCacheGeneration;
    CodeHash hash{};
    std::weak_ptr<const jit::CompiledCode> code;
    std::string entry;
    bs_entry_fn fn = nullptr;
    KernelStats::KernelSlot* stats = nullptr;

    [[nodiscard]] bool same_code(const std::shared_ptr<const jit::CompiledCode>& c) const noexcept {
        return !code.owner_before(c) && !c.owner_before(code) && c;
    }
};

} // namespace bitship::agent
