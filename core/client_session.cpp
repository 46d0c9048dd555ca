#include "client_impl.hpp"

#include <unistd.h>

#include <spdlog/spdlog.h>

namespace bitship {

Result<std::pair<std::string, std::uint16_t>> split_address(std::string_view host_port) {
    auto colon = host_port.rfind(':');
    if (colon == std::string_view::npos || colon == 0 || colon + 1 == host_port.size())
        return fail(Errc::invalid_argument, fmt::format("address '{}' is not HOST:PORT", host_port));
    std::string host(host_port.substr(0, colon));
    if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
    unsigned port = 0;
    for (char c : host_port.substr(colon + 1)) {
        if (c < '0' || c > '9' || port > 65535) return fail(Errc::invalid_argument, fmt::format("bad port in '{}'", host_port));
        port = port * 10 + static_cast<unsigned>(c - '0');
    }
    if (port == 0 || port > 65535) return fail(Errc::invalid_argument, fmt::format("port out of range in '{}'", host_port));
    return std::pair{host, static_cast<std::uint16_t>(port)};
}


void Client::Impl::start_connect(Peer& p) {
    p.welcomed = false;
    p.connect_deadline = Clock::now() + options.connect_timeout;
    auto ep = engine->connect(p.host, p.port);
    if (!ep) {
        fail_peer(p, Error{Errc::connect_failed, ep.error().message});
        return;
    }
    p.ep = *ep;
    peer_by_ep[p.ep] = p.id;
    ++routes_generation;
    engine->send(p.ep, wire::encode_hello(fmt::format("bitship-client pid {}", getpid()))); // its identity in xctl stats
}

void Client::Impl::fail_peer(Peer& p, const Error& why) {
    // Calls waiting for the connection, the connect itself, and calls in flight to it.
    auto waiting = std::move(p.waiting);
    p.waiting.clear();
    for (auto& c : waiting) c->complete(tl::make_unexpected(why));
    if (p.connecting) {
        p.connecting->complete(tl::make_unexpected(why));
        p.connecting.reset();
    }
    for (auto it = pending.begin(); it != pending.end();) {
        if (it->second->peer == p.id) {
            it->second->complete(tl::make_unexpected(why));
            it = pending.erase(it);
        } else {
            ++it;
        }
    }
    drop_window(p);
    p.refused.clear(); // failed above, with the calls in flight
    if (p.ep) {
        peer_by_ep.erase(p.ep);
        ++routes_generation;
        p.ep = nullptr;
    }
    p.welcomed = false;
    p.auth_request = 0;
}

Peer* Client::Impl::peer_of(ucp_ep_h ep) {
    // The last message's peer again, while no endpoint was added or dropped since (peers are
    // never erased, so its address stays good).
    if (ep != nullptr && ep == last_peer.ep && last_peer.routes == routes_generation) return last_peer.peer;
    auto it = peer_by_ep.find(ep);
    if (it == peer_by_ep.end()) return nullptr;
    auto p = peers.find(it->second);
    if (p == peers.end()) return nullptr;
    last_peer = {ep, &p->second, routes_generation};
    return &p->second;
}

void Client::Impl::on_welcome(Peer& p, const wire::Welcome& w) {
    auto info = std::make_shared<AgentInfo>();
    info->address = p.address;
    info->triple = std::string(w.triple);
    info->cpu = std::string(w.cpu);
    info->llvm = w.llvm;
    info->max_message = w.limits.max_message;
    info->max_args = w.limits.max_args;
    info->max_result = w.limits.max_result;
    info->cores = w.cores;
    info->workers = w.workers;
    info->instance = w.instance;
    info->capabilities = w.caps;
    info->access = w.access;
    info->sandbox = w.sandbox;
    // An agent restarted on another architecture takes other slices.
    if (p.info && p.info->triple != info->triple) p.slice_by_bundle.clear();
    p.info = std::move(info);
    p.reads_split = w.reads_split;
    p.reads_compact = w.reads_compact;
    if (start_auth(p, w)) return; // on_session follows the agent's ACK
    on_session(p);
}

void Client::Impl::on_session(Peer& p) {
    p.welcomed = true;
    if (p.connecting) {
        p.connecting->complete(Bytes{});
        p.connecting.reset();
    }
    auto waiting = std::move(p.waiting);
    p.waiting.clear();
    for (auto& c : waiting) dispatch(p, c);
}

void Client::Impl::on_forwarded_reply(Incoming&& in) {
    auto it = pending.find(in.header.request_id);
    if (it == pending.end() || it->second->kind != Kind::run) {
        if (in.header.request_id < next_id.load()) stray_replies.fetch_add(1, std::memory_order_relaxed);
        spdlog::debug("client: {} for unknown request {} dropped", wire::to_string(in.header.type), in.header.request_id);
        return;
    }
    auto c = it->second;
    loads.on_reply(c->peer, in.header); // the last agent's load, kept against the target shipped to
    if (in.header.type != wire::Type::result && in.header.type != wire::Type::error) return;
    pending.erase(it);
    if (auto peer = peers.find(c->peer); peer != peers.end()) {
        give_back_slot(peer->second, *c);
        // The agent shipped to let the call go (it forwarded it): room for one it refused.
        if (!peer->second.refused.empty()) resend_refused(peer->second);
    }
    if (in.header.type == wire::Type::result) {
        // Only the agent a call was sent to holds its window slot.
        if (in.header.flags & wire::kFlagWindow)
            c->complete(fail(Errc::malformed_message, "a forwarded call's last agent answered in a bulk window it does not hold"));
        else
            c->complete(std::move(in.payload));
        return;
    }
    if (in.header.type == wire::Type::error) {
        auto msg = wire::decode(in.header, in.payload);
        if (!msg) c->complete(tl::make_unexpected(msg.error()));
        else {
            const auto& e = std::get<wire::ErrorMsg>(msg->body);
            c->complete(fail(e.code, std::string(e.message)));
        }
    }
}

void Client::Impl::on_stray(Peer& p, const wire::Header& h) {
    if (h.request_id < next_id.load()) stray_replies.fetch_add(1, std::memory_order_relaxed);
    spdlog::debug("client: {} for unknown request {} from {}", wire::to_string(h.type), h.request_id, agent_name(p));
}

void Client::Impl::on_result(Peer& p, const std::shared_ptr<CallState>& c, Incoming&& in, const wire::WindowSpan* window) {
    pending.erase(c->id); // by id: erase(it) would look for the next entry
    // A session asks for its window with its first bulk call or result (ask_window); a group's
    // answers never go through one.
    if (!window && !c->each && in.payload.size() >= kWindowResultMin) ask_window(p);
    if (c->kind == Kind::run && !c->each && (window || in.payload.size() >= kWindowResultMin))
        large_results.emplace(c->hash, c->entry);
    Result<Bytes> bytes = window ? window_result(p, *c, *window) : Result<Bytes>(std::move(in.payload));
    if (bytes && c->kind == Kind::get && bytes->size() != c->length) // a GPU region's read
        bytes = fail(Errc::malformed_message, fmt::format("{} answered a read of {} bytes of GPU region '{}' with {}",
                                                          agent_name(p), c->length, c->region.name, bytes->size()));
    give_back_slot(p, *c);
    c->complete(std::move(bytes));
}

void Client::Impl::on_message(Incoming&& in) {
    auto* p = peer_of(in.ep);
    if (!p) {
        on_forwarded_reply(std::move(in));
        return;
    }
    loads.on_reply(p->id, in.header);
    // A plain RESULT, the answer to most calls: its payload is the call's bytes, as they are
    // (decode() would say only that).
    if (in.header.type == wire::Type::result && in.header.flags == 0 && in.header.request_id != p->auth_request &&
        in.header.request_id != p->window.request) {
        if (!p->refused.empty()) resend_refused(*p);
        auto it = pending.find(in.header.request_id);
        if (it == pending.end()) return on_stray(*p, in.header);
        auto c = it->second;
        on_result(*p, c, std::move(in), nullptr);
        return;
    }
    auto msg = wire::decode(in.header, in.payload);
    if (!msg) {
        spdlog::warn("client: bad message from {}: {}", agent_name(*p), msg.error().describe());
        // A reply we cannot read still ends its call, with the reason.
        if (auto it = pending.find(in.header.request_id); it != pending.end()) {
            it->second->complete(fail(msg.error().code, fmt::format("{}: {}", agent_name(*p), msg.error().message)));
            pending.erase(it);
        }
        return;
    }
    if (auto* w = std::get_if<wire::Welcome>(&msg->body)) {
        on_welcome(*p, *w);
        return;
    }
    if (p->auth_request && in.header.request_id == p->auth_request) {
        on_auth_reply(*p, *msg);
        return;
    }
    if (p->window.request && in.header.request_id == p->window.request) {
        on_window_reply(*p, *msg);
        return;
    }
    // Any answer but a refusal: the agent let one of this session's calls go, so a call it
    // refused as busy goes again (client_busy.cpp). Before the lookup below, whose iterator
    // a resend must not outlive.
    const bool busy = is_busy(*msg);
    if (!busy && !p->refused.empty()) resend_refused(*p);
    auto it = pending.find(in.header.request_id);
    if (it == pending.end()) return on_stray(*p, in.header);
    auto c = it->second;
    if (busy && hold_refused(*p, c)) return;
    switch (in.header.type) {
    case wire::Type::result: {
        const auto& res = std::get<wire::ResultMsg>(msg->body);
        on_result(*p, c, std::move(in), res.window ? &*res.window : nullptr);
        return;
    }
    case wire::Type::pong:
    case wire::Type::stats_reply:
    case wire::Type::region_info:
    case wire::Type::info_reply:
    case wire::Type::kernel_stats_reply:
    case wire::Type::cache_list_reply:
        pending.erase(c->id);
        c->complete(std::move(in.payload));
        return;
    case wire::Type::ack: // a control request's, or a GPU region write's (which returns no bytes)
        pending.erase(c->id);
        c->complete(c->kind == Kind::put ? Bytes{} : std::move(in.payload));
        return;
    case wire::Type::error: {
        const auto& e = std::get<wire::ErrorMsg>(msg->body);
        pending.erase(c->id);
        give_back_slot(*p, *c);
        c->complete(fail(e.code, fmt::format("{}: {}", agent_name(*p), e.message)));
        return;
    }
    case wire::Type::need_code:
        need_code_received.fetch_add(1, std::memory_order_relaxed);
        pending.erase(c->id);
        if (c->resent) {
            c->complete(fail(Errc::code_missing, fmt::format("{} asked for code {} again after it was sent",
                                                             agent_name(*p), to_hex(c->hash, 16))));
            return;
        }
        c->resent = true;
        send_run(*p, c, true);
        return;
    default:
        spdlog::warn("client: unexpected {} from {}", wire::to_string(in.header.type), agent_name(*p));
    }
}

void Client::Impl::on_ep_error(ucp_ep_h ep, const Error& e) {
    drop_rkeys(ep);
    auto* p = peer_of(ep);
    if (!p) return;
    Error why{p->welcomed ? Errc::disconnected : Errc::connect_failed,
              p->welcomed ? fmt::format("{} disconnected: {}", agent_name(*p), e.message)
                          : fmt::format("could not connect to {}: {}", p->address, e.message)};
    fail_peer(*p, why);
}

void Client::Impl::on_tick() {
    auto now = Clock::now();
    for (auto& [id, p] : peers) {
        // Refused calls go again at least this often, should no answer come to clock them.
        if (!p.refused.empty() && p.welcomed) resend_refused(p);
        if (p.ep && !p.welcomed && now > p.connect_deadline) {
            auto ep = p.ep;
            fail_peer(p, Error{Errc::connect_failed,
                               fmt::format("no agent answered at {} within {} ms", p.address, options.connect_timeout.count())});
            engine->close(ep);
        }
    }
    for (auto it = pending.begin(); it != pending.end();) {
        if (now > it->second->deadline) {
            // A window slot it holds stays taken: the agent may still write the late answer
            // there. It comes free with the window (the session's end).
            auto& c = *it->second;
            auto peer = peers.find(c.peer);
            c.complete(fail(Errc::timeout, fmt::format("no answer from {} within {} ms",
                                                       peer == peers.end() ? "agent" : agent_name(peer->second),
                                                       options.call_timeout.count())));
            it = pending.erase(it);
        } else {
            ++it;
        }
    }
}

void Client::Impl::shutdown() {
    Error why{Errc::shutting_down, "client is shutting down"};
    for (auto& [id, p] : peers) fail_peer(p, why);
    for (auto& [id, c] : pending) c->complete(tl::make_unexpected(why));
    pending.clear();
    for (auto& [key, rkey] : rkeys) ucp_rkey_destroy(rkey.rkey);
    rkeys.clear();
}
} // namespace bitship
