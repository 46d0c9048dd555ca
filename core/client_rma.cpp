#include "client_impl.hpp"

#include <spdlog/spdlog.h>

namespace bitship {

Result<ucp_rkey_h> Client::Impl::rkey_for(Peer& p, const RemoteRegion& r) {
    auto key = std::pair{p.ep, r.packed_rkey.get()};
    if (auto it = rkeys.find(key); it != rkeys.end()) return it->second;
    auto rkey = engine->unpack_rkey(p.ep, *r.packed_rkey);
    if (rkey) rkeys.emplace(key, *rkey);
    return rkey;
}

void Client::Impl::drop_rkeys(ucp_ep_h ep) {
    for (auto it = rkeys.begin(); it != rkeys.end();) {
        if (it->first.first == ep) {
            ucp_rkey_destroy(it->second);
            it = rkeys.erase(it);
        } else {
            ++it;
        }
    }
}

void Client::Impl::issue_rma(Peer& p, const std::shared_ptr<CallState>& c, const RemoteRegion& region, std::uint64_t offset,
               std::size_t length, bool is_get, std::function<void(ucs_status_t)> after) {
    if (offset > region.size || length > region.size - offset) {
        pending.erase(c->id);
        c->complete(fail(Errc::out_of_bounds, fmt::format("{} bytes at offset {} lie outside region '{}' ({} bytes) of {}",
                                                          length, offset, region.name, region.size, agent_name(p))));
        return;
    }
    auto rkey = rkey_for(p, region);
    if (!rkey) {
        pending.erase(c->id);
        c->complete(tl::make_unexpected(rkey.error()));
        return;
    }
    pending[c->id] = c;
    if (is_get) c->scratch.resize(length);
    auto remote = region.base + offset;
    auto* local = is_get ? c->scratch.data() : c->args.data();
    if (is_get) engine->get(p.ep, *rkey, remote, local, length, std::move(after));
    else engine->put(p.ep, *rkey, remote, local, length, std::move(after));
}

void Client::Impl::start_rma(Peer& p, const std::shared_ptr<CallState>& c) {
    bool is_get = c->kind == Kind::get;
    auto length = is_get ? c->scratch.size() : c->args.size();
    issue_rma(p, c, c->region, c->offset, length, is_get, [this, c, is_get](ucs_status_t s) {
        if (!pending.erase(c->id)) return; // already failed (disconnect, deadline)
        if (s != UCS_OK) c->complete(tl::make_unexpected(from_ucs(s, is_get ? "RDMA GET" : "RDMA PUT")));
        else c->complete(is_get ? std::move(c->scratch) : Bytes{});
    });
}

void Client::Impl::chain_step(const std::shared_ptr<CallState>& c, std::span<const std::byte> last) {
    std::optional<GetStep> step;
    try {
        step = c->next(last, c->args);
    } catch (const std::exception& e) {
        pending.erase(c->id);
        c->complete(fail(Errc::invalid_argument, fmt::format("get_chain step threw: {}", e.what())));
        return;
    }
    if (!step) {
        pending.erase(c->id);
        c->complete(std::move(c->args));
        return;
    }
    auto it = step->region ? peers.find(step->region->target) : peers.end();
    if (it == peers.end() || !it->second.welcomed) {
        pending.erase(c->id);
        c->complete(fail(Errc::out_of_bounds, "get_chain step names no region of a connected agent "
                                              "(an address outside every region)"));
        return;
    }
    issue_rma(it->second, c, *step->region, step->offset, step->length, true, [this, c](ucs_status_t s) {
        if (!pending.contains(c->id)) return;
        if (s != UCS_OK) {
            pending.erase(c->id);
            c->complete(tl::make_unexpected(from_ucs(s, "RDMA GET")));
            return;
        }
        chain_step(c, c->scratch);
    });
}
} // namespace bitship
