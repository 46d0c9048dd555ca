#include "client_impl.hpp"
#include "coarse_clock.hpp"
#include "memory_reuse.hpp"
#include "recycling_allocator.hpp"

#include <algorithm>
#include <thread>

#include <spdlog/spdlog.h>

namespace bitship {

std::shared_ptr<CallState> Client::Impl::new_call(std::uint64_t peer, Kind kind) {
    // Recycled: a call is most often made and let go on one thread (the caller's).
    auto c = std::allocate_shared<CallState>(RecyclingAllocator<CallState>{});
    c->id = next_id.fetch_add(1, std::memory_order_relaxed);
    c->peer = peer;
    c->kind = kind;
    c->deadline = deadline_clock_now() + options.call_timeout;
    c->progress = progress;
    c->engine = engine.get();
    return c;
}

void Client::Impl::submit_from_caller(const std::shared_ptr<CallState>& c) {
    if (engine->try_progress_once([&] { submit(c); })) return;
    engine->post([this, c] { submit(c); });
}


Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::Client(Client&&) noexcept = default;
Client& Client::operator=(Client&&) noexcept = default;

Client::~Client() {
    if (!impl_) return;
    {
        // Waiting callers stop leading (within kLeadSlice) and find no engine from now on.
        impl_->progress->retire();
    }
    impl_->engine->post([impl = impl_.get()] { impl->shutdown(); });
    impl_->engine->stop();
}

Result<Client> Client::create(const ClientOptions& options) {
    auto impl = std::make_unique<Impl>();
    impl->options = options;
    if (auto keys = impl->load_keys(); !keys) return tl::make_unexpected(keys.error());
    EngineOptions eo;
    eo.transport = options.transport;
    eo.mode = options.progress;
    eo.spin = options.spin;
    eo.loopback_only = options.loopback_only;
    eo.shared_yields_after_wake = CoreSharing::kSharedYieldsAfterWakeCaller;
    if (options.keep_freed_memory) keep_freed_memory(eo.max_message);
    auto* raw = impl.get();
    EngineHooks hooks;
    hooks.on_message = [raw](Incoming&& in) { raw->on_message(std::move(in)); };
    hooks.on_bad_message = [raw](ucp_ep_h ep, std::uint64_t id, const Error& e) {
        auto* p = raw->peer_of(ep);
        if (auto it = raw->pending.find(id); p && it != raw->pending.end()) {
            it->second->complete(fail(e.code, fmt::format("{}: {}", raw->agent_name(*p), e.message)));
            raw->pending.erase(it);
        } else {
            spdlog::warn("client: dropped a bad message: {}", e.describe());
        }
    };
    hooks.on_ep_error = [raw](ucp_ep_h ep, const Error& e) { raw->on_ep_error(ep, e); };
    hooks.on_tick = [raw] { raw->on_tick(); };
    auto engine = Engine::create(eo, std::move(hooks));
    if (!engine) return tl::make_unexpected(engine.error());
    impl->engine = std::move(*engine);
    impl->progress->engine.store(impl->engine.get(), std::memory_order_seq_cst);
    impl->engine->start();
    return Client(std::move(impl));
}

Result<Target> Client::connect(std::string_view host_port) {
    auto addr = split_address(host_port);
    if (!addr) return tl::make_unexpected(addr.error());
    auto id = impl_->next_peer.fetch_add(1);
    auto call = impl_->new_call(id, Kind::connect);
    call->deadline = Clock::now() + impl_->options.connect_timeout;
    impl_->engine->post([impl = impl_.get(), call, id, host = addr->first, port = addr->second,
                         address = std::string(host_port)] {
        Peer p;
        p.id = id;
        p.host = host;
        p.port = port;
        p.address = address;
        p.connecting = call;
        auto& placed = impl->peers.emplace(id, std::move(p)).first->second;
        impl->start_connect(placed);
    });
    auto done = Future(call).get();
    if (!done) return tl::make_unexpected(done.error());
    // The WELCOME filled in the peer's info; fetch it on the progress thread.
    std::shared_ptr<const AgentInfo> info;
    auto fetched = impl_->new_call(id, Kind::connect);
    fetched->deadline = Clock::now() + std::chrono::seconds(5);
    impl_->engine->post([impl = impl_.get(), id, &info, fetched] {
        info = impl->peers.at(id).info;
        fetched->complete(Bytes{});
    });
    if (auto r = Future(fetched).get(); !r) return tl::make_unexpected(r.error());
    return Target(id, std::move(info));
}

namespace {
// The call's peer table by address, and where the target sits in it.
bool set_peers(CallState& c, const Target& target, const ShipOptions& options) {
    c.forward = options.forward;
    c.hop_budget = options.hop_budget;
    c.device = options.device;
    c.launch.grid = {options.grid.x, options.grid.y, options.grid.z};
    c.launch.block = {options.block.x, options.block.y, options.block.z};
    c.launch.result_bytes = options.gpu_result_bytes;
    c.launch.device = options.gpu_device;
    if (options.peers.empty()) return true;
    bool found = false;
    for (std::size_t i = 0; i < options.peers.size(); ++i) {
        c.peers.push_back(options.peers[i].info().address);
        if (options.peers[i].id() == target.id() && !found) {
            c.self_index = static_cast<std::uint16_t>(i);
            found = true;
        }
    }
    c.hop_budget = options.hop_budget;
    if (!found || options.peers.size() > 0xffff) {
        c.complete(fail(Errc::invalid_argument, "the target must be one of the call's peers (at most 65535)"));
        return false;
    }
    return true;
}
} // namespace

Future Client::ship_native(std::string_view entry, const Target& target, Bytes args, const ShipOptions& options) {
    auto c = impl_->new_call(target.id(), Kind::run);
    if (!set_peers(*c, target, options)) return Future(c);
    c->native = true;
    c->entry = std::string(entry);
    c->args = std::move(args);
    impl_->submit_from_caller(c);
    return Future(c);
}

std::shared_ptr<CallState> Client::Impl::prepare_run(const Kernel& kernel, const Target& target, Bytes args,
                                                     const ShipOptions& options) {
    auto c = new_call(target.id(), Kind::run);
    if (!set_peers(*c, target, options)) return c;
    if (!kernel.bundle) {
        c->complete(fail(Errc::invalid_argument, "kernel handle has no bundle"));
        return c;
    }
    c->bundle = kernel.bundle();
    c->entry = std::string(kernel.entry);
    c->args = std::move(args);
    return c;
}

Future Client::ship_bytes(const Kernel& kernel, const Target& target, Bytes args, const ShipOptions& options) {
    auto c = impl_->prepare_run(kernel, target, std::move(args), options);
    if (!c->done.load(std::memory_order_relaxed)) impl_->submit_from_caller(c);
    return Future(c);
}

std::shared_ptr<CallState> Client::Impl::prepare_small_run(const Kernel& kernel, const Target& target, std::span<const std::byte> args,
                                                           const ShipOptions& options) {
    if (args.size() > sizeof(CallState::small_args)) return prepare_run(kernel, target, Bytes(args.begin(), args.end()), options);
    auto c = prepare_run(kernel, target, {}, options);
    if (!args.empty()) std::memcpy(c->small_args.data(), args.data(), args.size()); // (no arguments: no pointer)
    c->small_size = static_cast<std::uint8_t>(args.size());
    c->small = true;
    return c;
}

Future Client::ship_small(const Kernel& kernel, const Target& target, std::span<const std::byte> args, const ShipOptions& options) {
    static_assert(sizeof(CallState::small_args) == kSmallArgs && kSmallArgs <= 0xff);
    auto c = impl_->prepare_small_run(kernel, target, args, options);
    if (!c->done.load(std::memory_order_relaxed)) impl_->submit_from_caller(c);
    return Future(c);
}

Future Client::ship_shared(const Kernel& kernel, const Target& target, std::shared_ptr<const Bytes> args,
                           const ShipOptions& options) {
    auto c = impl_->prepare_run(kernel, target, {}, options);
    c->shared_args = args ? std::move(args) : std::make_shared<const Bytes>();
    if (!c->done.load(std::memory_order_relaxed)) impl_->submit_from_caller(c);
    return Future(c);
}

Batch Client::batch() { return Batch(impl_.get()); }

void Batch::add_bytes(const Kernel& kernel, const Target& target, Bytes args, const ShipOptions& options) {
    calls_.push_back(impl_->prepare_run(kernel, target, std::move(args), options));
}

void Batch::add_small(const Kernel& kernel, const Target& target, std::span<const std::byte> args) {
    calls_.push_back(impl_->prepare_small_run(kernel, target, args, {}));
}

std::vector<Future> Batch::submit() {
    auto calls = std::move(calls_);
    calls_.clear();
    // One hold of the progress token sends them all, small ones to one agent as one message.
    auto send_all = [impl = impl_](const std::vector<std::shared_ptr<CallState>>& calls) {
        Engine::Cork together(*impl->engine);
        for (auto& c : calls)
            if (!c->done.load(std::memory_order_relaxed)) impl->submit(c);
    };
    if (!impl_->engine->try_progress_once([&] { send_all(calls); }))
        impl_->engine->post([send_all, calls] { send_all(calls); });
    std::vector<Future> out;
    out.reserve(calls.size());
    for (auto& c : calls) out.push_back(Future(std::move(c)));
    return out;
}

Future Client::ship_slice(std::span<const std::byte> bundle, std::size_t slice, std::string_view entry,
                          const Target& target, Bytes args) {
    auto c = impl_->new_call(target.id(), Kind::run);
    c->bundle = bundle;
    c->forced_slice = slice;
    c->entry = std::string(entry);
    c->args = std::move(args);
    impl_->submit_from_caller(c);
    return Future(c);
}

Future Client::ping(const Target& target, std::span<const std::byte> payload) {
    auto c = impl_->new_call(target.id(), Kind::ping);
    c->args.assign(payload.begin(), payload.end());
    impl_->submit_from_caller(c);
    return Future(c);
}

Result<std::vector<std::pair<std::string, std::uint64_t>>> Client::agent_stats(const Target& target) {
    auto c = impl_->new_call(target.id(), Kind::stats);
    impl_->submit_from_caller(c);
    auto bytes = Future(c).get();
    if (!bytes) return tl::make_unexpected(bytes.error());
    wire::Header h;
    h.type = wire::Type::stats_reply;
    h.payload_size = static_cast<std::uint32_t>(bytes->size());
    auto msg = wire::decode(h, *bytes);
    if (!msg) return tl::make_unexpected(msg.error());
    std::vector<std::pair<std::string, std::uint64_t>> out;
    for (auto& [k, v] : std::get<wire::StatsReply>(msg->body).counters) out.emplace_back(std::string(k), v);
    return out;
}

Result<bool> Client::await_tier_ups(const Target& target, std::chrono::milliseconds timeout, std::chrono::microseconds poll) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
        auto stats = agent_stats(target);
        if (!stats) return tl::make_unexpected(stats.error());
        auto pending = std::find_if(stats->begin(), stats->end(), [](const auto& kv) { return kv.first == "tier_ups_pending"; });
        if (pending == stats->end())
            return fail(Errc::unsupported_version, fmt::format("agent {} does not report its background compiles (an older agent)", target.info().address));
        if (pending->second == 0) return true;
        if (std::chrono::steady_clock::now() >= deadline) return false;
        std::this_thread::sleep_for(poll);
    }
}

Result<Bytes> Client::control(const Target& target, std::uint8_t type, Bytes payload) {
    auto c = impl_->new_call(target.id(), Kind::control);
    c->name = std::string(1, static_cast<char>(type));
    c->args = std::move(payload);
    impl_->submit_from_caller(c);
    return Future(c).get();
}

ClientStats Client::stats() const {
    ClientStats s;
    s.runs_sent = impl_->runs_sent.load();
    s.split_runs_sent = impl_->split_runs_sent.load();
    s.compact_runs_sent = impl_->compact_runs_sent.load();
    s.bundles_sent = impl_->bundles_sent.load();
    s.bundle_bytes_sent = impl_->bundle_bytes_sent.load();
    s.need_code_received = impl_->need_code_received.load();
    s.busy_resends = impl_->busy_resends.load();
    s.reconnects = impl_->reconnects.load();
    s.stray_replies = impl_->stray_replies.load();
    s.completed_by_waiter = impl_->progress->completed_by_waiter.load();
    s.completed_by_background = impl_->progress->completed_by_background.load();
    s.core_moves = impl_->engine->core_moves();
    s.receive_buffers_reused = impl_->engine->receive_buffers()->reused();
    return s;
}

void Client::recycle(Bytes&& buffer) {
    impl_->engine->receive_buffers()->give_back(std::move(buffer));
}

Result<RemoteRegion> Client::region(const Target& target, std::string_view name) {
    auto key = std::pair{target.id(), std::string(name)};
    // The cache lives on the progress thread; ask it there.
    auto c = impl_->new_call(target.id(), Kind::region);
    c->name = std::string(name);
    std::optional<RemoteRegion> cached;
    impl_->engine->post([impl = impl_.get(), c, key, &cached] {
        if (auto it = impl->regions.find(key); it != impl->regions.end()) {
            cached = it->second;
            c->complete(Bytes{});
            return;
        }
        impl->submit(c);
    });
    auto bytes = Future(c).get();
    if (!bytes) return tl::make_unexpected(bytes.error());
    if (cached) return *cached;
    wire::Header h;
    h.type = wire::Type::region_info;
    h.payload_size = static_cast<std::uint32_t>(bytes->size());
    auto msg = wire::decode(h, *bytes);
    if (!msg) return tl::make_unexpected(msg.error());
    const auto& info = std::get<wire::RegionInfo>(msg->body);
    RemoteRegion r;
    r.name = std::string(name);
    r.target = target.id();
    r.base = info.base;
    r.size = info.size;
    r.packed_rkey = std::make_shared<const Bytes>(info.rkey.begin(), info.rkey.end());
    r.gpu = info.gpu;
    r.gpu_index = info.gpu_index;
    impl_->engine->post([impl = impl_.get(), key, r] { impl->regions.emplace(key, r); });
    return r;
}

Future Client::get(const RemoteRegion& region, std::uint64_t offset, std::uint32_t length) {
    auto c = impl_->new_call(region.target, Kind::get);
    c->region = region;
    c->offset = offset;
    c->length = length;
    impl_->submit_from_caller(c);
    return Future(c);
}

Future Client::put(const RemoteRegion& region, std::uint64_t offset, Bytes data) {
    auto c = impl_->new_call(region.target, Kind::put);
    c->region = region;
    c->offset = offset;
    c->args = std::move(data);
    impl_->submit_from_caller(c);
    return Future(c);
}

Future Client::get_chain(NextGet next) {
    auto c = impl_->new_call(0, Kind::chain);
    c->next = std::move(next);
    impl_->engine->post([impl = impl_.get(), c] {
        impl->pending[c->id] = c;
        impl->chain_step(c, {});
    });
    return Future(c);
}

} // namespace bitship
