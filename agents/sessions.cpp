#include "agent_impl.hpp"
#include "core/recycling_allocator.hpp"

namespace bitship::agent {

void Agent::Impl::log_failure(std::uint64_t conn, std::uint64_t id, const Error& e) {
    std::uint64_t suppressed = 0;
    bool allowed = log_limiter.allow(conn, suppressed);
    if (suppressed) spdlog::info("connection {}: {} more failed calls not logged", conn, suppressed);
    if (allowed) spdlog::info("request {}: {}", id, e.describe());
}

void Agent::Impl::reply(ucp_ep_h ep, std::uint64_t conn, wire::Encoded&& m) {
    auto it = connections.find(ep);
    if (it == connections.end() || it->second != conn) {
        spdlog::debug("reply {} to a closed connection dropped", m.header.request_id);
        return;
    }
    load_gauge.stamp(m, pool ? pool->queued() : 0);
    engine->send(ep, std::move(m));
}

void Agent::Impl::answer(const RunRequest& r, wire::Encoded&& m) {
    if (r.stats)
        kernel_stats.on_answer(r.stats, r.conn, r.run.args.size(), m);
    else
        kernel_stats.on_answer(r.run.hash, r.run.entry, r.conn, r.run.args.size(), m);
    m.header.request_id = r.run.hops == 0 ? r.id : r.run.origin;
    if (r.run.hops == 0 || r.run.reply_to.empty()) {
        reply(r.ep, r.conn, std::move(m));
        return;
    }
    load_gauge.stamp(m, pool ? pool->queued() : 0);
    if (auto* ep = reply_ep(r.run.reply_to)) engine->send(ep, std::move(m));
}

void Agent::Impl::answer_error(const RunRequest& r, const Error& e, std::int32_t kernel_code) {
    counters.errors.fetch_add(1, std::memory_order_relaxed);
    log_failure(r.conn, r.id, e);
    // After a forward the caller has no connection to us, so the message says who we are.
    auto text = r.run.hops == 0 ? e.message : fmt::format("agent {}: {}", address(), e.message);
    answer(r, wire::encode_error(0, e.code, text, kernel_code));
}

void Agent::Impl::reply_error(ucp_ep_h ep, std::uint64_t conn, std::uint64_t id, const Error& e) {
    counters.errors.fetch_add(1, std::memory_order_relaxed);
    log_failure(conn, id, e);
    reply(ep, conn, wire::encode_error(id, e.code, e.message));
}

void Agent::Impl::on_conn_request(ucp_conn_request_h request) {
    close_stale_handshakes();
    if (config.max_connections != 0 && connections.size() >= config.max_connections) {
        engine->reject(request);
        counters.refused_connections.fetch_add(1, std::memory_order_relaxed);
        std::uint64_t suppressed = 0;
        if (log_limiter.allow(kRefusedConnections, suppressed))
            spdlog::warn("refused a connection: {} are open, this agent's limit (--max-connections){}", connections.size(),
                         suppressed ? fmt::format("; {} more refused since the last line", suppressed) : std::string());
        return;
    }
    auto ep = engine->accept(request);
    if (!ep) {
        spdlog::warn("could not accept a connection: {}", ep.error().describe());
        return;
    }
    connections[*ep] = next_conn++;
    ++routes_generation;
    handshaking[*ep] = Handshake{Clock::now()};
    counters.connections.fetch_add(1, std::memory_order_relaxed);
}

void Agent::Impl::on_bad_message(ucp_ep_h ep, std::uint64_t id, const Error& e) {
    if (e.code == Errc::busy) { // a connection at its limit (AgentConfig::per_connection): logged as a failed call
        counters.busy_refusals.fetch_add(1, std::memory_order_relaxed);
        if (ep && connections.contains(ep)) reply_error(ep, conn_of(ep), id, e);
        return;
    }
    counters.malformed_messages.fetch_add(1, std::memory_order_relaxed);
    spdlog::warn("bad message (request {}): {}", id, e.describe());
    if (ep && connections.contains(ep)) reply_error(ep, conn_of(ep), id, e);
}

void Agent::Impl::on_message(Incoming&& in) {
    std::uint64_t conn = 0;
    if (in.ep != nullptr && in.ep == last_sender.ep && last_sender.routes == routes_generation &&
        last_sender.sessions == gate->sessions_generation()) {
        conn = last_sender.conn; // a client's admitted session, as for its last message
    } else {
        if (auto link = link_by_ep.find(in.ep); link != link_by_ep.end()) {
            in.join_outside(); // (agents send no split messages; a peer that does is read the plain way)
            on_link_message(link->second, std::move(in));
            return;
        }
        conn = conn_of(in.ep);
        if (!in.ep || !conn) {
            counters.malformed_messages.fetch_add(1, std::memory_order_relaxed);
            spdlog::warn("{} message from no known connection dropped", wire::to_string(in.header.type));
            return;
        }
        // Nothing but the handshake is even decoded before the session is admitted (trust.cpp).
        const bool admitted = gate->admitted(conn);
        if (in.header.type != wire::Type::hello && in.header.type != wire::Type::auth && !admitted) {
            counters.unauthorized.fetch_add(1, std::memory_order_relaxed);
            reply_error(in.ep, conn, in.header.request_id, gate->refusal(conn));
            return;
        }
        if (admitted) last_sender = {in.ep, conn, routes_generation, gate->sessions_generation()};
    }
    if (in.header.type == wire::Type::run) { // a call: decoded straight into its request
        // Recycled: the request is let go within microseconds, on this thread for a cached call.
        auto r = std::allocate_shared<RunRequest>(RecyclingAllocator<RunRequest>{});
        const bool landed = in.outside_keep != nullptr;
        if (auto ok = wire::decode_run(in.header, in.payload, r->run, landed ? &in.outside : nullptr); !ok) {
            counters.malformed_messages.fetch_add(1, std::memory_order_relaxed);
            reply_error(in.ep, conn, in.header.request_id, ok.error());
            return;
        }
        r->ep = in.ep;
        r->conn = conn;
        r->id = in.header.request_id;
        r->payload = std::move(in.payload); // r->run's views: the buffer moves, it is not reallocated
        r->payload_home = engine->receive_buffers();
        if (landed) {
            r->args_home = std::move(in.outside_keep); // r->run.args lie there
            counters.landed_args.fetch_add(1, std::memory_order_relaxed);
        }
        r->hold = std::move(in.hold);
        on_run(std::move(r));
        return;
    }
    auto msg = wire::decode(in.header, in.payload);
    if (!msg) {
        counters.malformed_messages.fetch_add(1, std::memory_order_relaxed);
        reply_error(in.ep, conn, in.header.request_id, msg.error());
        return;
    }
    if (is_control_request(in.header.type)) {
        reply(in.ep, conn, handle_control(control, in.header.request_id, *msg));
        return;
    }
    switch (in.header.type) {
    case wire::Type::hello: {
        if (auto h = handshaking.find(in.ep); h != handshaking.end()) h->second.hello = true;
        kernel_stats.on_client(conn, std::get<wire::Hello>(msg->body).client);
        wire::Welcome w;
        auto addr = address();
        const auto& host = jit::host();
        w.agent = addr;
        w.triple = host.triple;
        w.cpu = host.cpu;
        w.llvm = host.llvm;
        w.limits = config.limits;
        w.cores = topology.cores;
        w.workers = pool->size();
        w.instance = instance;
        w.caps = topology.caps;
        w.access = gate->access();
        w.challenge = gate->open_session(conn);
        w.sandbox = sandbox->mode();
        w.reads_split = true; // the engine joins them (core/wire_split.hpp)
        w.reads_compact = true;
        reply(in.ep, conn, wire::encode_welcome(w));
        return;
    }
    case wire::Type::auth: on_auth(in.ep, conn, in.header.request_id, std::get<wire::Auth>(msg->body)); return;
    case wire::Type::ping:
        counters.pings.fetch_add(1, std::memory_order_relaxed);
        reply(in.ep, conn, wire::encode_ping(wire::Type::pong, in.header.request_id, in.payload));
        return;
    case wire::Type::stats: {
        auto all = counter_values();
        reply(in.ep, conn, wire::encode_stats_reply(in.header.request_id, all));
        return;
    }
    case wire::Type::region: {
        auto name = std::get<wire::Region>(msg->body).name;
        const auto* r = regions->find(name);
        if (!r) {
            for (const auto& g : gpus)
                if (auto view = g->region(name)) { // no RDMA reaches it: GPU_READ and GPU_WRITE do
                    wire::RegionInfo info{0, view->size, {}, true, static_cast<std::uint32_t>(view->index)};
                    reply(in.ep, conn, wire::encode_region_info(in.header.request_id, info));
                    return;
                }
            reply_error(in.ep, conn, in.header.request_id,
                        Error{Errc::region_not_found, fmt::format("agent has no memory region '{}'", name)});
            return;
        }
        wire::RegionInfo info{reinterpret_cast<std::uint64_t>(r->base), r->size, r->mapped.packed_rkey};
        reply(in.ep, conn, wire::encode_region_info(in.header.request_id, info));
        return;
    }
    case wire::Type::gpu_read:
    case wire::Type::gpu_write: on_gpu_transfer(std::move(in), conn, *msg); return;
    case wire::Type::window: {
        // A window is for calls to come: none once the agent is going. (It would also be
        // shared memory the client maps just as this process exits and the kernel removes it;
        // UCX 1.13 crashes when an rkey of such memory fails to unpack.)
        if (draining.load(std::memory_order_relaxed) || stopped.load(std::memory_order_relaxed)) {
            reply_error(in.ep, conn, in.header.request_id,
                        Error{Errc::shutting_down, "agent is draining: it opens no bulk window"});
            return;
        }
        auto w = windows->open(conn);
        if (!w) {
            reply_error(in.ep, conn, in.header.request_id, w.error());
            return;
        }
        const auto& m = (*w)->memory;
        wire::RegionInfo info{reinterpret_cast<std::uint64_t>(m.base), m.size, m.packed_rkey};
        reply(in.ep, conn, wire::encode_region_info(in.header.request_id, info));
        return;
    }
    case wire::Type::need_code: // a peer agent asking over a connection it made to us: not ours
    default:
        reply_error(in.ep, conn, in.header.request_id,
                    Error{Errc::unknown_message, fmt::format("an agent does not accept {} messages",
                                                             wire::to_string(in.header.type))});
    }
}

void Agent::Impl::forget_connection(ucp_ep_h ep, std::string_view why) {
    auto it = connections.find(ep);
    if (it == connections.end()) return;
    gate->close(it->second);
    windows->close(it->second);
    spdlog::info("connection {}: {}", it->second, why);
    connections.erase(it);
    ++routes_generation;
    handshaking.erase(ep);
}

void Agent::Impl::close_stale_handshakes() {
    if (handshaking.empty() || config.handshake_timeout.count() == 0) return;
    const auto now = Clock::now();
    for (auto it = handshaking.begin(); it != handshaking.end();) {
        auto [ep, h] = *it;
        ++it; // forget_connection erases the entry
        if (h.hello && gate->admitted(conn_of(ep))) {
            handshaking.erase(ep);
        } else if (now - h.since >= config.handshake_timeout) {
            counters.handshake_timeouts.fetch_add(1, std::memory_order_relaxed);
            forget_connection(ep, fmt::format("closed: no {} within {} ms of connecting (--handshake-timeout-ms)",
                                              h.hello ? "AUTH with an authorized key" : "HELLO",
                                              config.handshake_timeout.count()));
            engine->close(ep);
        }
    }
}

void Agent::Impl::on_ep_error(ucp_ep_h ep, const Error& e) {
    forget_connection(ep, fmt::format("the client went away: {}", e.message));
    if (auto it = link_by_ep.find(ep); it != link_by_ep.end()) {
        spdlog::warn("peer {} went away: {}", it->second, e.message);
        fail_link(links[it->second], e);
    }
    if (auto it = reply_ep_address.find(ep); it != reply_ep_address.end()) {
        reply_eps.erase(it->second);
        reply_ep_address.erase(it);
    }
}
} // namespace bitship::agent
