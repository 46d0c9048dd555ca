#pragma once
// Who may call this agent. With authorized keys, each connection's WELCOME carries a fresh
// challenge, and the connection may make calls (RUN, REGION, STATS, PING, control) only once its
// AUTH signed that challenge, this agent's instance and its own key with a key the agent
// authorizes. Without keys every connection may call (open or insecure access). Signatures are
// checked once per connection; a call costs one hash lookup.
//
// The key set is replaced on SIGHUP (replace_keys): sessions of keys no longer in it lose the
// right to call at once, new sessions of those keys are refused.
//
// Touched only by whoever progresses UCX (one thread at a time): no lock.

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include <bitship/errc.hpp>
#include <bitship/identity.hpp>

#include "core/signing.hpp"
#include "core/wire.hpp"

namespace bitship::agent {

class SessionGate {
public:
    /// `access` keys: `keys` are the authorized ones (possibly none yet); otherwise they are ignored.
    SessionGate(AgentAccess access, std::vector<NamedKey> keys);

    [[nodiscard]] AgentAccess access() const noexcept { return access_; }
    /// Whether clients must authenticate (and code must be signed by an authorized author).
    [[nodiscard]] bool keys_required() const noexcept { return access_ == AgentAccess::keys; }
    [[nodiscard]] std::size_t key_count() const noexcept { return keys_.size(); }

    /// HELLO on connection `conn`: the challenge its WELCOME carries (zero unless keys are required).
    signing::Challenge open_session(std::uint64_t conn);
    /// Whether `conn` may make calls now.
    [[nodiscard]] bool admitted(std::uint64_t conn) const noexcept {
        if (!keys_required()) return true;
        auto it = sessions_.find(conn);
        return it != sessions_.end() && it->second.admitted;
    }
    /// Why `conn` may not make calls (not authenticated yet, its key revoked, ...).
    [[nodiscard]] Error refusal(std::uint64_t conn) const;
    /// AUTH on `conn`: admits it when the signature is over its challenge and `instance` and
    /// the key is authorized; returns the key's name. Errors are unauthorized, their message
    /// worded to follow "agent HOST:PORT " ("does not know key SHA256:…"). Each refused key is
    /// logged once.
    Result<std::string> authenticate(std::uint64_t conn, const wire::Auth& auth, std::uint64_t instance);
    /// The connection is gone.
    void close(std::uint64_t conn) {
        ++sessions_generation_;
        sessions_.erase(conn);
    }

    /// The name of `key` when it is authorized, else nullptr.
    [[nodiscard]] const std::string* authorizes(const PublicKey& key) const {
        auto it = keys_.find(key);
        return it == keys_.end() ? nullptr : &it->second;
    }
    /// SIGHUP: `keys` become the authorized set. Returns how many open sessions lost their key.
    std::size_t replace_keys(std::vector<NamedKey> keys);
    /// Changes whenever the authorized set does: what was authorized under one generation is
    /// checked again under the next.
    [[nodiscard]] std::uint64_t keys_generation() const noexcept { return keys_generation_; }
    /// Changes whenever a session may have been admitted or refused (HELLO, AUTH, a close, new
    /// keys): an answer of admitted() is good until it changes.
    [[nodiscard]] std::uint64_t sessions_generation() const noexcept { return sessions_generation_; }

    /// Refused keys logged once each, up to this many; after that, refusals are not logged.
    static constexpr std::size_t kMaxLoggedKeys = 4096;

private:
    struct Session {
        signing::Challenge challenge{};
        bool admitted = false;
        bool revoked = false; ///< admitted once, then its key left the authorized set
        PublicKey key{};
        std::string refused;  ///< why its AUTH was refused: what its calls are told too
    };
    void log_refusal(const PublicKey& key, std::uint64_t conn, const std::string& why);

    AgentAccess access_;
    std::map<PublicKey, std::string> keys_;
    std::uint64_t keys_generation_ = 0;
    std::uint64_t sessions_generation_ = 0;
    std::unordered_map<std::uint64_t, Session> sessions_;
    std::set<PublicKey> logged_;
};

} // namespace bitship::agent
