#include "client_impl.hpp"

#include <spdlog/spdlog.h>

namespace bitship {

Result<MappedRkey> Client::Impl::rkey_for(Peer& p, const RemoteRegion& r) {
    auto key = std::pair{p.ep, r.packed_rkey.get()};
    if (auto it = rkeys.find(key); it != rkeys.end()) return it->second;
    auto rkey = engine->unpack_rkey(p.ep, *r.packed_rkey);
    if (!rkey) return tl::make_unexpected(rkey.error());
    // A same-host agent's shared-memory region maps into this process: read it by loads.
    MappedRkey m{*rkey, static_cast<std::byte*>(engine->rkey_ptr(*rkey, r.base))};
    rkeys.emplace(key, m);
    return m;
}

void Client::Impl::drop_rkeys(ucp_ep_h ep) {
    for (auto it = rkeys.begin(); it != rkeys.end();) {
        if (it->first.first == ep) {
            ucp_rkey_destroy(it->second.rkey);
            it = rkeys.erase(it);
        } else {
            ++it;
        }
    }
}

Result<MappedRkey> Client::Impl::checked_rkey(Peer& p, const RemoteRegion& region, std::uint64_t offset, std::size_t length) {
    if (offset > region.size || length > region.size - offset)
        return fail(Errc::out_of_bounds, fmt::format("{} bytes at offset {} lie outside region '{}' ({} bytes) of {}", length,
                                                     offset, region.name, region.size, agent_name(p)));
    if (region.gpu)
        return fail(Errc::invalid_argument, fmt::format("region '{}' of {} is in GPU memory: no RDMA reaches it (Client::get "
                                                        "and put go through the agent)", region.name, agent_name(p)));
    return rkey_for(p, region);
}

void Client::Impl::issue_rma(Peer& p, const std::shared_ptr<CallState>& c, const RemoteRegion& region, std::uint64_t offset,
                             std::size_t length, bool is_get, std::function<void(ucs_status_t)> after) {
    auto rkey = checked_rkey(p, region, offset, length);
    if (!rkey) {
        pending.erase(c->id);
        c->complete(tl::make_unexpected(rkey.error()));
        return;
    }
    pending[c->id] = c;
    if (rkey->local_base) {
        // Mapped: the copy is the whole operation, done before anything else can run.
        const auto* at = rkey->local_base + offset;
        if (is_get) c->scratch.assign(at, at + length);
        else std::memcpy(rkey->local_base + offset, c->args.data(), length);
        after(UCS_OK);
        return;
    }
    if (is_get) c->scratch.resize(length);
    auto remote = region.base + offset;
    auto* local = is_get ? c->scratch.data() : c->args.data();
    if (is_get) engine->get(p.ep, rkey->rkey, remote, local, length, std::move(after));
    else engine->put(p.ep, rkey->rkey, remote, local, length, std::move(after));
}

void Client::Impl::start_rma(Peer& p, const std::shared_ptr<CallState>& c) {
    if (c->region.gpu) {
        start_gpu_transfer(p, c);
        return;
    }
    bool is_get = c->kind == Kind::get;
    auto length = is_get ? c->length : c->args.size();
    issue_rma(p, c, c->region, c->offset, length, is_get, [this, c, is_get](ucs_status_t s) {
        if (!pending.erase(c->id)) return; // already failed (disconnect, deadline)
        if (s != UCS_OK) c->complete(tl::make_unexpected(from_ucs(s, is_get ? "RDMA GET" : "RDMA PUT")));
        else c->complete(is_get ? std::move(c->scratch) : Bytes{});
    });
}

void Client::Impl::chain_step(const std::shared_ptr<CallState>& c, std::span<const std::byte> last) {
    // Steps on mapped regions are plain loads and loop here; the first step that needs the
    // network is issued, and its completion calls back in.
    for (;;) {
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
        auto rkey = checked_rkey(it->second, *step->region, step->offset, step->length);
        if (!rkey) {
            pending.erase(c->id);
            c->complete(tl::make_unexpected(rkey.error()));
            return;
        }
        if (rkey->local_base) {
            const auto* at = rkey->local_base + step->offset;
            c->scratch.assign(at, at + step->length);
            last = c->scratch;
            continue;
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
        return;
    }
}

Result<bool> Client::mapped(const RemoteRegion& region) {
    if (!region.packed_rkey) return fail(Errc::invalid_argument, "region has no remote key (not from Client::region)");
    // GPU memory is never mapped here (get and put go through the agent); its key is empty, and
    // UCX would read past it.
    if (region.gpu) return false;
    // The unpacked keys live on the progress thread; ask there.
    auto c = impl_->new_call(region.target, Kind::region);
    impl_->engine->post([impl = impl_.get(), c, region] {
        auto it = impl->peers.find(region.target);
        if (it == impl->peers.end() || !it->second.welcomed) {
            c->complete(fail(Errc::disconnected, fmt::format("region '{}' belongs to no connected agent", region.name)));
            return;
        }
        auto rkey = impl->rkey_for(it->second, region);
        if (!rkey) c->complete(tl::make_unexpected(rkey.error()));
        else c->complete(Bytes{std::byte{rkey->local_base != nullptr}});
    });
    auto answer = Future(c).get();
    if (!answer) return tl::make_unexpected(answer.error());
    return answer->size() == 1 && answer->front() != std::byte{0};
}
void Client::Impl::start_gpu_transfer(Peer& p, const std::shared_ptr<CallState>& c) {
    const bool is_get = c->kind == Kind::get;
    const std::uint64_t length = is_get ? c->length : c->args.size();
    const auto& r = c->region;
    if (c->offset > r.size || length > r.size - c->offset) {
        c->complete(fail(Errc::out_of_bounds, fmt::format("{} bytes at offset {} lie outside GPU region '{}' ({} bytes) of {}",
                                                          length, c->offset, r.name, r.size, agent_name(p))));
        return;
    }
    // The agent reads into a reply or writes from this message: each is one message.
    const std::uint64_t limit = is_get ? p.info->max_result : p.info->max_message - (2 + r.name.size() + 8);
    if (length > limit) {
        c->complete(fail(Errc::too_large, fmt::format("{} bytes of GPU region '{}' in one call exceed {}'s limit of {} (split "
                                                      "the range into several calls)", length, r.name, agent_name(p), limit)));
        return;
    }
    if (is_get) {
        engine->send(p.ep, wire::encode_gpu_read(c->id, {r.name, c->offset, length}));
    } else {
        engine->send(p.ep, wire::encode_gpu_write(c->id, {r.name, c->offset, c->args}));
    }
    pending[c->id] = c;
}

} // namespace bitship
