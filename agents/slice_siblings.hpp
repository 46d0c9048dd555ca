#pragma once
// The other slices of the bundles this agent received, kept so that a kernel forwarding itself
// to an agent of another architecture (an x86-64 host and an aarch64 DPU) can send that agent
// the slice made for it.
//
// A call that may forward travels with its whole bundle (every slice); the agent compiles its
// own slice and keeps the bundle here under the hash the call named. A forward to a peer whose
// WELCOME names another triple then carries the hash of that triple's slice, and its code on
// NEED_CODE is this bundle; the peer checks the slice against that hash as it checks any code.
//
// Limits, both because a RUN names a slice, not its bundle: the first bundle kept for a hash
// stays until evicted. (1) Two bundles whose slices for this triple are byte-identical but
// differ for another share the first one's other slices here. (2) The peer checks who made
// its slice by the author's signature over that slice's hash, which the client sent with the
// bundle (one per slice) and the forward carries along (agents/code_signatures.hpp); a sibling
// slice from (1) keeps its own signature. (1) goes away when a RUN also names its bundle's hash.
//
// Touched only by whoever progresses UCX (one thread at a time), like the rest of the
// forwarding state: no lock.

#include <cstddef>
#include <deque>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <string_view>
#include <vector>

#include <bitship/bundle.hpp>
#include <bitship/errc.hpp>

#include "core/wire.hpp"

namespace bitship::agent {

class SliceSiblings {
public:
    /// Bounds on what is kept; the oldest bundles go first.
    static constexpr std::size_t kMaxBundles = 256;
    static constexpr std::size_t kMaxBytes = 64u << 20;

    /// Keeps a copy of `bundle` under `hash` when it parses, has more than one slice and one
    /// of them is `hash`'s; anything else is ignored (the JIT reports what is wrong with it).
    void remember(const CodeHash& hash, std::span<const std::byte> bundle);

    struct Sibling {
        CodeHash hash{};                                   ///< the slice for the peer's triple
        std::shared_ptr<const std::vector<std::byte>> bundle; ///< the whole bundle it is in
    };

    /// The slice for `triple` in the bundle kept under `hash`. Errors: no_matching_slice when
    /// no bundle is kept for `hash` (the call came with one slice) or it has no slice for
    /// `triple`; the message names the triples there are.
    [[nodiscard]] Result<Sibling> for_triple(const CodeHash& hash, std::string_view triple) const;

    /// A forwarded RUN (as encoded for the peer, request `id`) rewritten to name the slice
    /// for `peer_triple`, with the bundle to send on NEED_CODE.
    struct Retargeted {
        wire::Encoded message;
        CodeHash hash{};
        std::shared_ptr<const std::vector<std::byte>> bundle;
    };
    [[nodiscard]] Result<Retargeted> retarget(const wire::Encoded& run, std::uint64_t id, std::string_view peer_triple) const;

    [[nodiscard]] std::size_t size() const noexcept { return bundles_.size(); }

private:
    struct Kept {
        std::shared_ptr<const std::vector<std::byte>> bundle;
        std::vector<std::pair<std::string, CodeHash>> slices; ///< normalised triple → slice hash
        std::string triples;                                  ///< for error messages
    };
    std::map<CodeHash, Kept> bundles_;
    std::deque<CodeHash> order_;
    std::size_t bytes_ = 0;
};

} // namespace bitship::agent
