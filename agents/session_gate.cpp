#include "session_gate.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace bitship::agent {

SessionGate::SessionGate(AgentAccess access, std::vector<NamedKey> keys) : access_(access) {
    if (keys_required()) replace_keys(std::move(keys));
}

signing::Challenge SessionGate::open_session(std::uint64_t conn) {
    if (!keys_required()) return {};
    ++sessions_generation_;
    // A second HELLO on a connection starts its session over: a fresh challenge, not admitted.
    auto& s = sessions_[conn];
    s = Session{};
    s.challenge = signing::fresh_challenge();
    return s.challenge;
}

Error SessionGate::refusal(std::uint64_t conn) const {
    auto it = sessions_.find(conn);
    if (it != sessions_.end() && !it->second.refused.empty()) return Error{Errc::unauthorized, it->second.refused};
    if (it != sessions_.end() && it->second.revoked)
        return Error{Errc::unauthorized, fmt::format("key {} was removed from this agent's authorized keys",
                                                     fingerprint(it->second.key))};
    return Error{Errc::unauthorized, "this connection has not authenticated: the agent takes calls only after "
                                     "HELLO, WELCOME and an AUTH with an authorized key"};
}

Result<std::string> SessionGate::authenticate(std::uint64_t conn, const wire::Auth& auth, std::uint64_t instance) {
    if (!keys_required()) return std::string("(open access: no key needed)");
    ++sessions_generation_;
    auto it = sessions_.find(conn);
    if (it == sessions_.end())
        return fail(Errc::unauthorized, "refused AUTH before HELLO: there is no challenge to sign yet");
    auto& s = it->second;
    // The key first: an unknown key is refused by its fingerprint, whatever it signed.
    const auto* name = authorizes(auth.key);
    if (!name) {
        auto why = fmt::format("does not know key {}", fingerprint(auth.key));
        log_refusal(auth.key, conn, why);
        s.admitted = false;
        s.refused = why;
        return fail(Errc::unauthorized, why);
    }
    if (!signing::verify_session(auth.key, auth.signature, s.challenge, instance)) {
        auto why = fmt::format("refused key {} ({}): its signature is not over this connection's challenge (a replayed "
                               "or forged handshake)",
                               fingerprint(auth.key), *name);
        log_refusal(auth.key, conn, why);
        s.admitted = false;
        s.refused = why;
        return fail(Errc::unauthorized, why);
    }
    s.admitted = true;
    s.refused.clear();
    s.revoked = false;
    s.key = auth.key;
    // One use per challenge: a second AUTH on this connection cannot reuse it.
    s.challenge = signing::fresh_challenge();
    return *name;
}

std::size_t SessionGate::replace_keys(std::vector<NamedKey> keys) {
    ++keys_generation_;
    ++sessions_generation_;
    keys_.clear();
    for (auto& k : keys) keys_.insert_or_assign(k.key, std::move(k.name));
    std::size_t lost = 0;
    for (auto& [conn, s] : sessions_) {
        if (s.admitted && !keys_.contains(s.key)) {
            s.admitted = false;
            s.revoked = true;
            ++lost;
        }
    }
    // A key allowed again is logged again when refused later.
    logged_.clear();
    return lost;
}

void SessionGate::log_refusal(const PublicKey& key, std::uint64_t conn, const std::string& why) {
    if (logged_.size() >= kMaxLoggedKeys || !logged_.insert(key).second) return;
    spdlog::warn("connection {}: unauthorized: {} (logged once per key)", conn, why);
}

} // namespace bitship::agent
