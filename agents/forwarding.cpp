#include "agent_impl.hpp"

namespace bitship::agent {

std::pair<std::string, std::uint16_t> split_host_port(std::string_view a) {
    auto colon = a.rfind(':');
    if (colon == std::string_view::npos) return {std::string(a), 0};
    unsigned port = 0;
    for (char c : a.substr(colon + 1)) port = c >= '0' && c <= '9' && port < 65536 ? port * 10 + unsigned(c - '0') : 70000;
    return {std::string(a.substr(0, colon)), port > 65535 ? std::uint16_t{0} : static_cast<std::uint16_t>(port)};
}

ucp_ep_h Agent::Impl::reply_ep(std::span<const std::byte> address) {
    std::vector<std::byte> key(address.begin(), address.end());
    if (auto it = reply_eps.find(key); it != reply_eps.end()) return it->second;
    auto ep = engine->connect_to_worker(address);
    if (!ep) {
        spdlog::warn("cannot reach a caller's reply-to address: {}", ep.error().describe());
        return nullptr;
    }
    reply_eps.emplace(key, *ep);
    reply_ep_address.emplace(*ep, std::move(key));
    return *ep;
}

void Agent::Impl::forward(const RunRequest& r, const std::shared_ptr<const jit::CompiledCode>& code, ForwardRequest f) {
    wire::Run next;
    next.hash = r.run.hash;
    next.origin = r.run.hops == 0 ? r.id : r.run.origin;
    next.hop_budget = static_cast<std::uint16_t>(r.run.hop_budget - 1);
    next.hops = static_cast<std::uint16_t>(r.run.hops + 1);
    next.self_index = static_cast<std::uint16_t>(f.peer);
    next.entry = f.entry;
    next.args = f.args;
    next.peers = r.run.peers;
    // Hop 0 may have come without a reply-to only when it had no peers; bs_forward refused.
    next.reply_to = r.run.reply_to;
    auto id = next_forward_id++;

    if (f.peer == r.run.self_index) {
        // A forward to ourselves: no network, same rules (hop budget, reply-to).
        counters.forwards_local.fetch_add(1, std::memory_order_relaxed);
        auto local = std::make_shared<RunRequest>();
        auto encoded = wire::encode_run(id, next);
        local->ep = r.ep;
        local->conn = r.conn;
        local->id = id;
        local->payload = std::move(encoded.payload);
        auto decoded = wire::decode(encoded.header, local->payload);
        local->run = std::get<wire::Run>(std::move(decoded->body));
        on_run(std::move(local));
        return;
    }
    counters.forwards.fetch_add(1, std::memory_order_relaxed);
    auto address = std::string(r.run.peers[f.peer]);
    auto& link = link_to(address);
    Forwarded fw{address, r.run.hash, wire::encode_run(id, next), Clock::now(), nullptr};
    remember(id, std::move(fw), code);
    if (!link.welcomed) {
        if (link.queued.size() >= kMaxQueuedPerLink) {
            answer_error(r, Error{Errc::too_large, fmt::format("too many forwards queued for peer {}", address)});
            forget(id);
            return;
        }
        link.queued.push_back(id);
        return;
    }
    send_forward(link, id);
}

void Agent::Impl::remember(std::uint64_t id, Forwarded fw, const std::shared_ptr<const jit::CompiledCode>& code) {
    auto now = Clock::now();
    while (!forwarded_order.empty()) {
        auto it = forwarded.find(forwarded_order.front());
        if (it != forwarded.end() && now - it->second.sent < kForwardMemory) break;
        if (it != forwarded.end()) forwarded.erase(it);
        forwarded_code.erase(forwarded_order.front());
        forwarded_order.pop_front();
    }
    forwarded.emplace(id, std::move(fw));
    forwarded_code.emplace(id, code);
    forwarded_order.push_back(id);
}

void Agent::Impl::forget(std::uint64_t id) {
    forwarded.erase(id);
    forwarded_code.erase(id);
}

void Agent::Impl::tell_caller(const Forwarded& fw, Errc code, const std::string& message) {
    auto m = wire::decode(fw.message.header, fw.message.payload);
    if (!m) return;
    const auto& run = std::get<wire::Run>(m->body);
    counters.errors.fetch_add(1, std::memory_order_relaxed);
    auto e = wire::encode_error(run.origin, code, message);
    load_gauge.stamp(e, pool ? pool->queued() : 0);
    if (auto* ep = reply_ep(run.reply_to)) engine->send(ep, std::move(e));
}

void Agent::Impl::send_forward(Link& link, std::uint64_t id, bool with_code) {
    auto it = forwarded.find(id);
    if (it == forwarded.end()) return;
    auto& fw = it->second;
    if (!retarget_forward(link, id, fw)) return;
    const auto& code = forwarded_code[id];
    // A native kernel (all-zero hash) has no code to send: the peer has it or refuses.
    with_code = fw.hash != CodeHash{} && code && (with_code || !link.known.contains(fw.hash));
    if (!with_code) {
        auto copy = fw.message;
        engine->send(link.ep, std::move(copy));
        return;
    }
    // Re-encode with the code attached: decode what we sent, add the bundle.
    auto m = wire::decode(fw.message.header, fw.message.payload);
    auto run = std::get<wire::Run>(m->body);
    run.code = fw.sibling_bundle ? std::span<const std::byte>(*fw.sibling_bundle) : std::span<const std::byte>(code->bundle());
    run.signatures = signatures.for_bundle(run.code); // the authors', not ours
    counters.code_forwarded.fetch_add(1, std::memory_order_relaxed);
    engine->send(link.ep, wire::encode_run(id, run));
    link.known.insert(fw.hash);
}

bool Agent::Impl::retarget_forward(const Link& link, std::uint64_t id, Forwarded& fw) {
    if (fw.hash == CodeHash{} || fw.sibling_bundle || link.triple.empty() ||
        normalise_triple(link.triple) == normalise_triple(jit::host().triple))
        return true;
    auto r = siblings.retarget(fw.message, id, link.triple);
    if (!r) {
        tell_caller(fw, r.error().code, fmt::format("agent {} ({}): forward to {} ({}): {}", address(), jit::host().triple,
                                                    link.address, link.triple, r.error().message));
        forget(id);
        return false;
    }
    fw.message = std::move(r->message);
    fw.hash = r->hash;
    fw.sibling_bundle = std::move(r->bundle);
    return true;
}

Link& Agent::Impl::link_to(const std::string& address) {
    auto [it, made] = links.try_emplace(address);
    auto& link = it->second;
    if (made || !link.ep) {
        link.address = address;
        link.welcomed = false;
        auto [host, port] = split_host_port(address);
        auto ep = port ? engine->connect(host, port) : Result<ucp_ep_h>(fail(Errc::invalid_argument, "no port"));
        if (!ep) {
            spdlog::warn("cannot connect to peer {}: {}", address, ep.error().describe());
            return link; // ep stays null: queued forwards fail in fail_link below
        }
        link.ep = *ep;
        link_by_ep[link.ep] = address;
        ++routes_generation;
        engine->send(link.ep, wire::encode_hello("xagent " + this->address()));
    }
    return link;
}

void Agent::Impl::on_link_message(const std::string& address, Incoming&& in) {
    auto& link = links[address];
    auto msg = wire::decode(in.header, in.payload);
    if (!msg) {
        spdlog::warn("bad message from peer {}: {}", address, msg.error().describe());
        return;
    }
    if (link.auth_request && in.header.request_id == link.auth_request) {
        on_link_auth_reply(link, *msg);
        return;
    }
    switch (in.header.type) {
    case wire::Type::welcome: {
        const auto& welcome = std::get<wire::Welcome>(msg->body);
        link.triple = std::string(welcome.triple);
        if (!authenticate_link(link, welcome)) on_link_session(link);
        return;
    }
    case wire::Type::need_code:
        if (forwarded.contains(in.header.request_id)) send_forward(link, in.header.request_id, true);
        else spdlog::warn("peer {} asked for the code of a forward no longer remembered", address);
        return;
    case wire::Type::error: {
        // The peer refused a forward before running it (bad message, limits): the caller
        // must hear of it, and the forward is ours to report.
        auto it = forwarded.find(in.header.request_id);
        if (it == forwarded.end()) return;
        const auto& e = std::get<wire::ErrorMsg>(msg->body);
        tell_caller(it->second, e.code, fmt::format("agent {}: {}", address, e.message));
        forget(in.header.request_id);
        return;
    }
    default: spdlog::debug("{} from peer {} ignored", wire::to_string(in.header.type), address);
    }
}

void Agent::Impl::fail_link(Link& link, const Error& why) {
    // Every forward over this link that is still remembered may now never be answered: its
    // caller is told at once instead of waiting for its deadline. One that the peer did
    // answer before dying gets a second, late answer, which its client drops.
    std::vector<std::uint64_t> gone;
    for (const auto& [id, fw] : forwarded)
        if (fw.link == link.address) gone.push_back(id);
    const bool refused = why.code == Errc::unauthorized; // the peer would not take our key
    for (auto id : gone) {
        tell_caller(forwarded.at(id), refused ? why.code : Errc::disconnected,
                    refused ? fmt::format("agent {}: forward refused: {}", address(), why.message)
                            : fmt::format("agent {}: peer {} went away with this call forwarded to it: {}", address(),
                                          link.address, why.message));
        forget(id);
    }
    link.queued.clear();
    link.known.clear();
    link.welcomed = false;
    link.auth_request = 0;
    if (link.ep) {
        link_by_ep.erase(link.ep);
        ++routes_generation;
    }
    link.ep = nullptr;
}
} // namespace bitship::agent
