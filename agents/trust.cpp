// Trust layers 1 and 2 (DESIGN.md): who may call this agent, and whose code it runs.
//
// Sessions: WELCOME carries a fresh challenge (SessionGate::open_session); the client's AUTH
// signs it, this agent's instance and its own key. Until that is accepted, a connection's calls
// are refused (sessions.cpp asks SessionGate::admitted per message: one hash lookup).
//
// Code: a RUN with code carries its author's signature per slice hash (CodeSignatures). With
// authorized keys, shipped code runs only when the kept signature for its hash is by an author
// the agent authorizes now. A RUN naming a hash whose author is unknown here (never seen,
// dropped from the table, or an author SIGHUP removed) and carrying no code is answered
// NEED_CODE: the sender resends the code with its signature, once; signed by an author the
// agent does not know, it is refused (unauthorized). Forwards carry the original signatures.
#include "agent_impl.hpp"

#include "core/signing.hpp"

namespace bitship::agent {

void Agent::Impl::on_auth(ucp_ep_h ep, std::uint64_t conn, std::uint64_t id, const wire::Auth& auth) {
    auto who = gate->authenticate(conn, auth, instance);
    if (!who) {
        counters.unauthorized.fetch_add(1, std::memory_order_relaxed);
        counters.errors.fetch_add(1, std::memory_order_relaxed);
        // Logged by the gate, once per key.
        reply(ep, conn, wire::encode_error(id, who.error().code, who.error().message));
        return;
    }
    spdlog::debug("connection {} authenticated with key {} ({})", conn, fingerprint(auth.key), *who);
    reply(ep, conn, wire::encode_ack(id, true, fmt::format("authenticated as {}", *who)));
}

bool Agent::Impl::admit_code(const std::shared_ptr<RunRequest>& r) {
    auto refuse = [&](Error e) {
        counters.unauthorized.fetch_add(1, std::memory_order_relaxed);
        answer_error(*r, e);
        return false;
    };
    if (!r->run.signatures.empty()) {
        last_admitted = {}; // what is kept for a hash may change now
        auto authorizes = [this](const PublicKey& key) { return gate->keys_required() && gate->authorizes(key); };
        if (auto forged = signatures.remember(r->run.signatures, r->run.hash, authorizes)) return refuse(*forged);
    }
    if (!gate->keys_required()) return true;
    // The code the last call ran, its author authorized since: admitted again without looking.
    if (last_admitted.valid && last_admitted.keys == gate->keys_generation() && last_admitted.hash == r->run.hash)
        return true;
    const auto* kept = signatures.find(r->run.hash);
    if (kept && gate->authorizes(kept->signer)) {
        last_admitted = {r->run.hash, gate->keys_generation(), true};
        return true;
    }
    if (r->run.code.empty()) {
        counters.need_code_sent.fetch_add(1, std::memory_order_relaxed);
        reply(r->ep, r->conn, wire::encode_need_code(r->id, r->run.hash));
        return false;
    }
    if (kept)
        return refuse(Error{Errc::unauthorized, fmt::format("code {} is signed by key {}, an author this agent does not "
                                                            "authorize",
                                                            to_hex(r->run.hash, 16), fingerprint(kept->signer))});
    return refuse(Error{Errc::unauthorized, fmt::format("code {} carries no signature by its author: this agent runs "
                                                        "signed code only",
                                                        to_hex(r->run.hash, 16))});
}

bool Agent::Impl::authenticate_link(Link& link, const wire::Welcome& w) {
    if (w.access != AgentAccess::keys) return false;
    if (!identity) {
        auto ep = link.ep;
        fail_link(link, Error{Errc::unauthorized,
                              fmt::format("peer {} admits authorized keys only, and this agent has no --identity to "
                                          "present",
                                          link.address)});
        if (ep) engine->close(ep);
        return true;
    }
    wire::Auth auth;
    auth.key = identity->public_key();
    auth.signature = signing::sign_session(*identity, w.challenge, w.instance);
    link.auth_request = next_forward_id++;
    engine->send(link.ep, wire::encode_auth(link.auth_request, auth));
    return true;
}

void Agent::Impl::on_link_auth_reply(Link& link, const wire::Message& reply) {
    link.auth_request = 0;
    if (std::holds_alternative<wire::Ack>(reply.body)) {
        on_link_session(link);
        return;
    }
    std::string why = "it did not accept our AUTH";
    if (const auto* e = std::get_if<wire::ErrorMsg>(&reply.body)) why = std::string(e->message);
    spdlog::warn("peer {} refused this agent's key: {}", link.address, why);
    auto ep = link.ep;
    fail_link(link, Error{Errc::unauthorized, fmt::format("peer {} {}", link.address, why)});
    if (ep) engine->close(ep);
}

void Agent::Impl::on_link_session(Link& link) {
    link.welcomed = true;
    auto queued = std::move(link.queued);
    link.queued.clear();
    for (auto id : queued) send_forward(link, id);
}

} // namespace bitship::agent

namespace bitship::agent {

bool is_loopback_host(std::string_view host) {
    if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
    return host == "localhost" || host == "::1" || host.starts_with("127.");
}

std::string trust_summary(const SessionGate& gate) {
    switch (gate.access()) {
    case AgentAccess::keys: return fmt::format("keys ({} authorized; signed code only)", gate.key_count());
    case AgentAccess::open: return "open (loopback only, no keys)";
    case AgentAccess::insecure: return "insecure (no keys, beyond loopback)";
    }
    return "unknown";
}

Result<void> set_up_trust(Agent::Impl& impl) {
    const auto& config = impl.config;
    if (!config.identity.empty()) {
        auto id = Identity::load(config.identity);
        if (!id) return fail(id.error().code, fmt::format("--identity: {}", id.error().message));
        impl.identity = std::move(*id);
    }
    if (!config.cache_dir.empty()) impl.signatures = CodeSignatures(config.cache_dir / "signatures");
    if (!config.authorized_keys.empty()) {
        auto keys = read_authorized_keys(config.authorized_keys);
        if (!keys) return tl::make_unexpected(keys.error());
        if (config.insecure) spdlog::warn("--insecure is ignored: --authorized-keys is given");
        if (keys->empty())
            spdlog::warn("authorized keys file {} holds no key: every client is refused until it does (and SIGHUP)",
                         config.authorized_keys.string());
        impl.gate = std::make_unique<SessionGate>(AgentAccess::keys, std::move(*keys));
        return {};
    }
    if (is_loopback_host(config.host)) {
        impl.gate = std::make_unique<SessionGate>(AgentAccess::open, std::vector<NamedKey>{});
        return {};
    }
    if (!config.insecure)
        return fail(Errc::invalid_argument,
                    fmt::format("listening on {} (not loopback) without --authorized-keys would run code from anyone who "
                                "reaches it: give --authorized-keys FILE, or --insecure to accept that",
                                config.host));
    spdlog::warn("INSECURE: listening on {} with no authorized keys: anyone who reaches this address may run code here",
                 config.host);
    impl.gate = std::make_unique<SessionGate>(AgentAccess::insecure, std::vector<NamedKey>{});
    return {};
}

Result<std::size_t> Agent::reload_authorized_keys() {
    const auto& file = impl_->config.authorized_keys;
    if (file.empty()) return fail(Errc::invalid_argument, "this agent was started without --authorized-keys: nothing to reload");
    auto keys = read_authorized_keys(file);
    if (!keys) return tl::make_unexpected(keys.error());
    const auto count = keys->size();
    // The gate belongs to whoever progresses: the new set goes in there, between two messages.
    std::promise<std::size_t> done;
    impl_->engine->post([impl = impl_.get(), &keys, &done] {
        auto lost = impl->gate->replace_keys(std::move(*keys));
        impl->control.trust = trust_summary(*impl->gate);
        done.set_value(lost);
    });
    auto lost = done.get_future().get();
    spdlog::info("authorized keys reloaded from {}: {} keys{}", file.string(), count,
                 lost ? fmt::format("; {} open sessions lost their key", lost) : std::string());
    return count;
}

} // namespace bitship::agent
