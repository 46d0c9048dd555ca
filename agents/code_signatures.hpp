#pragma once
// Who wrote each piece of code this agent has seen: code hash → its author's key and signature
// over the hash (core/signing.hpp), kept from the RUNs that brought the code. Kept here, not in
// the JIT, because an agent forwarding code to a peer sends the ORIGINAL author's signature with
// it: the peer checks the author, not the forwarder.
//
// - A signature is checked (Ed25519) once, when it arrives; only valid ones are kept. A hash's
//   kept signature is replaced only by a valid one, and only when the kept one's author is not
//   authorized (SessionGate::authorizes), so a flood of other signatures costs no checks.
// - With a directory (xagent --cache-dir DIR: DIR/signatures), each kept signature is also
//   written to DIR/signatures/<hash>.sig (128 bytes: hash, author key, signature), so code an
//   agent loads from its disk cache after a restart still has its author. A file read back is
//   checked like one that arrived: a forged or truncated one is ignored (the client is then asked
//   for the code with NEED_CODE, and resends it signed). Files are written on a thread of their
//   own (BackgroundJobs), not on the call's path, and a file that already holds the signature
//   (a restart sent the same code again) is left alone.
//
// Bounded (kMaxEntries in memory, oldest first); a hash whose signature was dropped is asked
// for again with NEED_CODE. Touched only by whoever progresses UCX: no lock.

#include <cstddef>
#include <deque>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include <bitship/bundle.hpp>
#include <bitship/errc.hpp>

#include "core/wire.hpp"
#include "core/background_jobs.hpp"

namespace bitship::agent {

class CodeSignatures {
public:
    static constexpr std::size_t kMaxEntries = 1u << 16;

    /// `dir` empty: memory only.
    explicit CodeSignatures(std::filesystem::path dir = {});

    /// Whether `key` is an author this agent authorizes now.
    using Authorizes = std::function<bool(const PublicKey& key)>;

    /// Keeps the valid signatures of a RUN. Error (unauthorized) only when the signature for
    /// `own` (the hash the RUN runs) does not verify: the caller refuses the call with it.
    std::optional<Error> remember(std::span<const wire::CodeSignature> signatures, const CodeHash& own,
                                  const Authorizes& authorizes);

    /// The kept signature of `hash` (from memory, else from the directory), or nullptr.
    const wire::CodeSignature* find(const CodeHash& hash);

    /// The kept signatures of every slice of `bundle`: what a forward carrying it sends along.
    [[nodiscard]] std::vector<wire::CodeSignature> for_bundle(std::span<const std::byte> bundle);

    [[nodiscard]] std::size_t size() const noexcept { return kept_.size(); }

private:
    struct HashHasher {
        std::size_t operator()(const CodeHash& h) const noexcept;
    };
    void keep(const wire::CodeSignature& s, bool persist);
    void persist(const wire::CodeSignature& s);
    std::optional<wire::CodeSignature> read_back(const CodeHash& hash) const;

    std::filesystem::path dir_;
    std::unordered_map<CodeHash, wire::CodeSignature, HashHasher> kept_;
    std::deque<CodeHash> order_;
    std::unique_ptr<BackgroundJobs> writer_; // with a directory only
};

} // namespace bitship::agent
