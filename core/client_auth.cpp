// The client's side of trust: its identity answers an agent's WELCOME challenge with AUTH
// (once per connection, before any call goes), and its author key signs each code hash once.
#include "client_impl.hpp"

#include <cstdlib>

#include <spdlog/spdlog.h>

#include "signing.hpp"

namespace bitship {

Result<void> Client::Impl::load_keys() {
    auto path = options.identity;
    if (path.empty()) {
        if (const char* env = std::getenv("BITSHIP_IDENTITY"); env && *env) path = env;
    }
    if (!path.empty()) {
        auto id = Identity::load(path);
        if (!id) return tl::make_unexpected(id.error());
        identity = std::move(*id);
    }
    if (!options.author.empty()) {
        auto a = Identity::load(options.author);
        if (!a) return tl::make_unexpected(a.error());
        author = std::move(*a);
    }
    return {};
}

bool Client::Impl::start_auth(Peer& p, const wire::Welcome& w) {
    if (w.access != AgentAccess::keys) return false;
    if (!identity) {
        auto ep = p.ep;
        fail_peer(p, Error{Errc::unauthorized,
                           fmt::format("agent {} admits authorized keys only, and this client has none (set "
                                       "ClientOptions::identity or BITSHIP_IDENTITY to a secret key file)",
                                       p.address)});
        engine->close(ep);
        return true;
    }
    wire::Auth auth;
    auth.key = identity->public_key();
    auth.signature = signing::sign_session(*identity, w.challenge, w.instance);
    p.auth_request = next_id.fetch_add(1, std::memory_order_relaxed);
    engine->send(p.ep, wire::encode_auth(p.auth_request, auth));
    return true;
}

void Client::Impl::on_auth_reply(Peer& p, const wire::Message& reply) {
    p.auth_request = 0;
    if (std::holds_alternative<wire::Ack>(reply.body)) {
        on_session(p);
        return;
    }
    Error why{Errc::unauthorized, fmt::format("agent {} sent {} to AUTH", p.address, wire::to_string(reply.header.type))};
    if (const auto* e = std::get_if<wire::ErrorMsg>(&reply.body))
        why = Error{e->code, fmt::format("agent {} {}", p.address, e->message)};
    spdlog::debug("client: {}", why.describe());
    // Every call waiting for this session fails with the refusal; the next call tries again.
    auto ep = p.ep;
    fail_peer(p, why);
    engine->close(ep);
}

std::vector<wire::CodeSignature> Client::Impl::sign_code(std::span<const std::byte> code, const CodeHash& hash,
                                                         bool whole_bundle) {
    const Identity* signer = author ? &*author : identity ? &*identity : nullptr;
    if (!signer || code.empty()) return {};
    auto one = [&](const CodeHash& h) {
        auto [it, fresh] = code_signatures.try_emplace(h);
        if (fresh) it->second = signing::sign_code(*signer, h);
        return wire::CodeSignature{h, signer->public_key(), it->second};
    };
    if (!whole_bundle) return {one(hash)};
    // A call that may forward carries every slice: each is signed, so agents of other
    // architectures down the line can check theirs.
    std::vector<wire::CodeSignature> out;
    if (auto view = BundleView::parse(code))
        for (const auto& slice : view->slices) out.push_back(one(slice.hash));
    return out;
}

} // namespace bitship
