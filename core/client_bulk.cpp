// Same-host bulk arguments and results through the agent's window for this session
// (core/bulk_window.hpp, agents/bulk_windows.hpp).

#include "client_impl.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>

#include <cstring>

#include <spdlog/spdlog.h>

namespace bitship {

namespace {

/// Whether `host` (an IP address or "localhost") is one of this machine's: only then can an
/// agent's shared memory be mapped here.
bool is_this_host(const std::string& host) {
    if (host == "localhost") return true;
    in6_addr want6{};
    in_addr want4{};
    const bool v4 = inet_pton(AF_INET, host.c_str(), &want4) == 1;
    const bool v6 = !v4 && inet_pton(AF_INET6, host.c_str(), &want6) == 1;
    if (!v4 && !v6) return false;
    if (v4 && (ntohl(want4.s_addr) >> 24) == 127) return true;
    if (v6 && IN6_IS_ADDR_LOOPBACK(&want6)) return true;
    ifaddrs* all = nullptr;
    if (getifaddrs(&all) != 0) return false;
    bool found = false;
    for (auto* a = all; a && !found; a = a->ifa_next) {
        if (!a->ifa_addr) continue;
        if (v4 && a->ifa_addr->sa_family == AF_INET)
            found = reinterpret_cast<const sockaddr_in*>(a->ifa_addr)->sin_addr.s_addr == want4.s_addr;
        else if (v6 && a->ifa_addr->sa_family == AF_INET6)
            found = std::memcmp(&reinterpret_cast<const sockaddr_in6*>(a->ifa_addr)->sin6_addr, &want6, sizeof want6) == 0;
    }
    freeifaddrs(all);
    return found;
}

} // namespace

// Asked for with the session's first bulk call or result, not at connect: making and mapping
// 16 MiB of shared memory took about a millisecond on both sides, which a first small call
// would wait behind, and a session that moves no bulk data needs no window.
void Client::Impl::ask_window(Peer& p) {
    if (!options.bulk_window || options.transport == Transport::tcp || p.window.state != PeerWindow::State::none) return;
    if (!is_this_host(p.host)) {
        p.window.state = PeerWindow::State::off;
        return;
    }
    p.window.state = PeerWindow::State::asked;
    p.window.request = next_id.fetch_add(1);
    engine->send(p.ep, wire::encode_request(wire::Type::window, p.window.request));
}

void Client::Impl::on_window_reply(Peer& p, const wire::Message& reply) {
    p.window.request = 0;
    p.window.state = PeerWindow::State::off;
    const auto* info = std::get_if<wire::RegionInfo>(&reply.body);
    if (!info) {
        // An older agent, one with windows turned off, or all of its windows in use.
        if (const auto* e = std::get_if<wire::ErrorMsg>(&reply.body))
            spdlog::debug("client: {} gives no bulk window: {}", agent_name(p), e->message);
        return;
    }
    auto rkey = engine->unpack_rkey(p.ep, info->rkey);
    if (!rkey) {
        spdlog::debug("client: {}'s bulk window: {}", agent_name(p), rkey.error().describe());
        return;
    }
    auto* local = static_cast<std::byte*>(engine->rkey_ptr(*rkey, info->base));
    WindowSlots slots(info->size, kWindowSlots);
    if (!local || slots.count() == 0) {
        // Not mappable here (no shared-memory transport between us): UCX's path it is. The
        // agent frees the window when the session ends.
        ucp_rkey_destroy(*rkey);
        return;
    }
    p.window.rkey = *rkey;
    p.window.local = local;
    p.window.size = info->size;
    p.window.slots = slots;
    p.window.generation = ++window_generations;
    p.window.state = PeerWindow::State::ready;
}

void Client::Impl::drop_window(Peer& p) {
    if (p.window.rkey) ucp_rkey_destroy(p.window.rkey);
    p.window = PeerWindow{};
}

// A slot is for bulk bytes: a call's large arguments, or the large result of a kernel known to
// give one. Any other call takes none, so that it stays a compact RUN (wire::kFlagCompact)
// with no slot to take and give back: 0.96 -> 1.23 us a cached call over shared memory once a
// bulk call had opened the window, when every call took one. A kernel's first large result
// comes by UCX and teaches large_results (on_result); a slot is offered from its next call.
bool Client::Impl::wants_slot(const CallState& c, std::size_t args) const {
    if (args >= kWindowArgsMin) return true;
    return !large_results.empty() && large_results.contains(std::pair<const CodeHash&, const std::string&>{c.hash, c.entry});
}

void Client::Impl::offer_window(Peer& p, CallState& c, wire::Run& run) {
    auto& w = p.window;
    if (w.state != PeerWindow::State::ready) return;
    if (c.window_slot >= 0 && c.window_generation != w.generation) c.window_slot = -1; // a window gone since
    if (c.window_slot < 0) {
        if (!wants_slot(c, c.run_args().size())) return;
        auto slot = w.slots.take();
        if (!slot) return;
        c.window_slot = static_cast<int>(*slot);
        c.window_generation = w.generation;
    }
    const auto slot = static_cast<unsigned>(c.window_slot);
    wire::WindowUse use;
    use.result_offset = w.slots.offset_of(slot);
    use.result_capacity = w.slots.slot_bytes();
    const auto args = c.run_args();
    if (args.size() >= kWindowArgsMin && args.size() <= w.slots.slot_bytes()) {
        std::memcpy(w.local + use.result_offset, args.data(), args.size());
        use.args_offset = use.result_offset;
        use.args_size = args.size();
        run.args = {};
    }
    run.window = use;
}

Result<Bytes> Client::Impl::window_result(Peer& p, const CallState& c, const wire::WindowSpan& where) {
    const auto& w = p.window;
    if (w.state != PeerWindow::State::ready || c.window_slot < 0 || c.window_generation != w.generation ||
        where.offset != w.slots.offset_of(static_cast<unsigned>(c.window_slot)) || where.size > w.slots.slot_bytes())
        return fail(Errc::malformed_message, fmt::format("{} answered with {} bytes at offset {} of a bulk window slot the call "
                                                         "did not offer",
                                                         agent_name(p), where.size, where.offset));
    const auto* first = w.local + where.offset;
    return Bytes(first, first + where.size);
}

void Client::Impl::give_back_slot(Peer& p, CallState& c) {
    if (c.window_slot < 0) return;
    if (p.window.state == PeerWindow::State::ready && c.window_generation == p.window.generation)
        p.window.slots.give_back(static_cast<unsigned>(c.window_slot));
    c.window_slot = -1;
}

} // namespace bitship
