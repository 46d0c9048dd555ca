#include <bitship/client.hpp>

#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "engine.hpp"
#include "wire.hpp"

namespace bitship {

using Clock = std::chrono::steady_clock;

namespace detail {

// One call's state, shared by the caller's Future and the client's pending table until the
// call completes. complete() is called once, on the progress thread.
struct CallState {
    std::atomic<bool> done{false};
    mutable std::mutex mutex;
    mutable std::condition_variable cv;
    Result<Bytes> result = fail(Errc::internal, "call never completed");
    Clock::time_point deadline;
    std::chrono::microseconds wait_spin{0};

    // Progress-thread bookkeeping.
    enum class Kind { run, ping, stats, connect, region, get, put, chain };
    std::uint64_t id = 0;
    std::uint64_t peer = 0;
    Kind kind = Kind::run;
    std::span<const std::byte> bundle; // the whole bundle (static storage, or `owned`)
    std::optional<std::size_t> forced_slice;
    std::string entry;
    Bytes args;
    CodeHash hash{};
    bool resent = false;
    bool native = false;  // a pre-installed kernel: no code, an all-zero hash
    bool forward = false; // may forward through the agents' configured peers
    // Forwarding: the peer table by address, this target's index in it, the hop budget.
    std::vector<std::string> peers;
    std::uint16_t self_index = 0;
    std::uint16_t hop_budget = 0;
    // RMA: the region, where, and (get_chain) the walk.
    RemoteRegion region;
    std::uint64_t offset = 0;
    std::string name;
    Client::NextGet next;
    Bytes scratch;

    void complete(Result<Bytes> r) {
        {
            std::lock_guard lock(mutex);
            if (done.load(std::memory_order_relaxed)) return;
            result = std::move(r);
            done.store(true, std::memory_order_release);
        }
        cv.notify_all();
    }
};

} // namespace detail

using detail::CallState;
using Kind = CallState::Kind;

bool Future::ready() const noexcept { return state_ && state_->done.load(std::memory_order_acquire); }

bool Future::wait_for(std::chrono::nanoseconds timeout) const {
    if (!state_) return true;
    auto start = Clock::now();
    // A short spin first: a reply often arrives within microseconds, and a futex sleep and
    // wake-up costs more than that.
    auto spin_until = start + std::min<std::chrono::nanoseconds>(state_->wait_spin, timeout);
    while (Clock::now() < spin_until)
        if (state_->done.load(std::memory_order_acquire)) return true;
    std::unique_lock lock(state_->mutex);
    return state_->cv.wait_until(lock, start + timeout, [&] { return state_->done.load(std::memory_order_acquire); });
}

Result<Bytes> Future::get() const {
    if (!state_) return fail(Errc::invalid_argument, "empty future");
    // The client fails every call at its deadline; the extra second only covers a client that
    // was destroyed while we waited.
    while (!wait_for(std::chrono::seconds(1))) {
        if (Clock::now() > state_->deadline + std::chrono::seconds(5))
            return fail(Errc::timeout, "call outlived its deadline (client gone?)");
    }
    std::lock_guard lock(state_->mutex);
    return state_->result;
}

namespace {

struct SliceChoice {
    CodeHash hash{};
    std::shared_ptr<const Bytes> code; // single-slice bundle sent to agents of this triple
};

struct Peer {
    std::uint64_t id = 0;
    std::string host;
    std::uint16_t port = 0;
    std::string address;
    ucp_ep_h ep = nullptr;
    bool welcomed = false;
    std::shared_ptr<const AgentInfo> info;
    Clock::time_point connect_deadline;
    std::vector<std::shared_ptr<CallState>> waiting;         // calls queued until connected
    std::shared_ptr<CallState> connecting;                     // connect()'s own call, if any
};

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

} // namespace

struct Client::Impl {
    ClientOptions options;
    std::unique_ptr<Engine> engine;
    std::atomic<std::uint64_t> next_id{1};
    std::atomic<std::uint64_t> next_peer{1};

    std::atomic<std::uint64_t> runs_sent{0}, bundles_sent{0}, bundle_bytes_sent{0}, need_code_received{0}, reconnects{0};

    // Progress thread only.
    std::unordered_map<std::uint64_t, Peer> peers;
    std::unordered_map<ucp_ep_h, std::uint64_t> peer_by_ep;
    std::unordered_map<std::uint64_t, std::shared_ptr<CallState>> pending;
    // Hashes each agent address holds, kept across reconnects: a restarted agent that lost
    // them answers NEED_CODE and gets the code once.
    std::map<std::string, std::set<CodeHash>> known;
    std::map<std::pair<const void*, std::string>, Result<SliceChoice>> slices;
    std::map<std::pair<std::uint64_t, std::string>, RemoteRegion> regions;
    std::map<std::pair<ucp_ep_h, const Bytes*>, ucp_rkey_h> rkeys;
    std::atomic<std::uint64_t> stray_replies{0};

    std::shared_ptr<CallState> new_call(std::uint64_t peer, Kind kind) {
        auto c = std::make_shared<CallState>();
        c->id = next_id.fetch_add(1);
        c->peer = peer;
        c->kind = kind;
        c->deadline = Clock::now() + options.call_timeout;
        c->wait_spin = options.wait_spin;
        return c;
    }

    std::string agent_name(const Peer& p) const { return fmt::format("agent {}", p.address); }

    // --- progress thread ------------------------------------------------------------------

    void start_connect(Peer& p) {
        p.welcomed = false;
        p.connect_deadline = Clock::now() + options.connect_timeout;
        auto ep = engine->connect(p.host, p.port);
        if (!ep) {
            fail_peer(p, Error{Errc::connect_failed, ep.error().message});
            return;
        }
        p.ep = *ep;
        peer_by_ep[p.ep] = p.id;
        engine->send(p.ep, wire::encode_hello("bitship-client"));
    }

    void fail_peer(Peer& p, const Error& why) {
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
        if (p.ep) {
            peer_by_ep.erase(p.ep);
            p.ep = nullptr;
        }
        p.welcomed = false;
    }

    Result<SliceChoice> choose_slice(const CallState& c, const Peer& p) {
        auto key = std::pair{static_cast<const void*>(c.bundle.data()), p.info->triple};
        if (c.forced_slice) key.second = fmt::format("#{}", *c.forced_slice);
        if (auto it = slices.find(key); it != slices.end()) return it->second;
        auto compute = [&]() -> Result<SliceChoice> {
            auto view = BundleView::parse(c.bundle);
            if (!view) return tl::make_unexpected(view.error());
            std::size_t index = 0;
            if (c.forced_slice) {
                if (*c.forced_slice >= view->slices.size())
                    return fail(Errc::invalid_argument, fmt::format("bundle has {} slices, slice {} asked for",
                                                                    view->slices.size(), *c.forced_slice));
                index = *c.forced_slice;
            } else {
                auto found = view->find_slice(p.info->triple);
                if (!found)
                    return fail(Errc::no_matching_slice, fmt::format("bundle has slices for [{}]; {} runs {}",
                                                                     view->triples(), agent_name(p), p.info->triple));
                index = *found;
            }
            SliceChoice s;
            s.hash = view->slices[index].hash;
            s.code = std::make_shared<const Bytes>(extract_slice(*view, index));
            return s;
        };
        return slices.emplace(key, compute()).first->second;
    }

    void send_run(Peer& p, const std::shared_ptr<CallState>& c, bool with_code) {
        if (c->native) {
            c->hash = CodeHash{};
            send_run_message(p, c, {});
            return;
        }
        auto choice = choose_slice(*c, p);
        if (!choice) {
            c->complete(tl::make_unexpected(choice.error()));
            return;
        }
        c->hash = choice->hash;
        if (c->args.size() > p.info->max_args) {
            c->complete(fail(Errc::too_large, fmt::format("{} bytes of arguments exceed {}'s limit of {}", c->args.size(),
                                                          agent_name(p), p.info->max_args)));
            return;
        }
        // A call that may forward carries every slice: agents of other architectures on its way
        // get theirs from the agent before them (agents/slice_siblings.hpp). Bundles that share
        // this slice may differ in others, so which bundle went whole is kept per bundle.
        const bool travels = !c->peers.empty() || c->forward;
        auto code = travels ? c->bundle : std::span<const std::byte>(*choice->code);
        auto& known_here = known[travels ? fmt::format("{} (every slice of bundle {})", p.address,
                                                       static_cast<const void*>(c->bundle.data()))
                                         : p.address];
        with_code = with_code || !known_here.contains(c->hash);
        if (with_code && code.size() + c->args.size() > p.info->max_message) {
            c->complete(fail(Errc::too_large, fmt::format("code ({} bytes) and arguments exceed {}'s message limit of {}",
                                                          code.size(), agent_name(p), p.info->max_message)));
            return;
        }
        send_run_message(p, c, with_code ? code : std::span<const std::byte>{});
        if (with_code) {
            bundles_sent.fetch_add(1, std::memory_order_relaxed);
            bundle_bytes_sent.fetch_add(code.size(), std::memory_order_relaxed);
            known_here.insert(c->hash);
        }
    }

    void send_run_message(Peer& p, const std::shared_ptr<CallState>& c, std::span<const std::byte> code) {
        wire::Run run;
        run.hash = c->hash;
        run.origin = c->id;
        run.entry = c->entry;
        run.args = c->args;
        run.code = code;
        if (!c->peers.empty() || c->forward) {
            run.reply_to = engine->worker_address();
            for (const auto& a : c->peers) run.peers.push_back(a);
            run.self_index = c->self_index;
            run.hop_budget = c->hop_budget;
        }
        engine->send(p.ep, wire::encode_run(c->id, run));
        runs_sent.fetch_add(1, std::memory_order_relaxed);
        pending[c->id] = c;
    }

    void dispatch(Peer& p, const std::shared_ptr<CallState>& c) {
        switch (c->kind) {
        case Kind::run: send_run(p, c, false); return;
        case Kind::ping:
            engine->send(p.ep, wire::encode_ping(wire::Type::ping, c->id, c->args));
            pending[c->id] = c;
            return;
        case Kind::stats:
            engine->send(p.ep, wire::encode_stats(c->id));
            pending[c->id] = c;
            return;
        case Kind::region:
            engine->send(p.ep, wire::encode_region(c->id, c->name));
            pending[c->id] = c;
            return;
        case Kind::get:
        case Kind::put: start_rma(p, c); return;
        default: c->complete(fail(Errc::internal, "unknown call kind")); return;
        }
    }

    Result<ucp_rkey_h> rkey_for(Peer& p, const RemoteRegion& r) {
        auto key = std::pair{p.ep, r.packed_rkey.get()};
        if (auto it = rkeys.find(key); it != rkeys.end()) return it->second;
        auto rkey = engine->unpack_rkey(p.ep, *r.packed_rkey);
        if (rkey) rkeys.emplace(key, *rkey);
        return rkey;
    }

    void drop_rkeys(ucp_ep_h ep) {
        for (auto it = rkeys.begin(); it != rkeys.end();) {
            if (it->first.first == ep) {
                ucp_rkey_destroy(it->second);
                it = rkeys.erase(it);
            } else {
                ++it;
            }
        }
    }

    // One GET or PUT for call `c`; `after` runs on completion with the call still pending.
    void issue_rma(Peer& p, const std::shared_ptr<CallState>& c, const RemoteRegion& region, std::uint64_t offset,
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

    void start_rma(Peer& p, const std::shared_ptr<CallState>& c) {
        bool is_get = c->kind == Kind::get;
        auto length = is_get ? c->scratch.size() : c->args.size();
        issue_rma(p, c, c->region, c->offset, length, is_get, [this, c, is_get](ucs_status_t s) {
            if (!pending.erase(c->id)) return; // already failed (disconnect, deadline)
            if (s != UCS_OK) c->complete(tl::make_unexpected(from_ucs(s, is_get ? "RDMA GET" : "RDMA PUT")));
            else c->complete(is_get ? std::move(c->scratch) : Bytes{});
        });
    }

    // The next step of a dependent GET walk; runs on the progress thread after each GET.
    void chain_step(const std::shared_ptr<CallState>& c, std::span<const std::byte> last) {
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

    void submit(const std::shared_ptr<CallState>& c) {
        auto it = peers.find(c->peer);
        if (it == peers.end()) {
            c->complete(fail(Errc::invalid_argument, "target does not belong to this client"));
            return;
        }
        auto& p = it->second;
        if (p.welcomed) {
            dispatch(p, c);
            return;
        }
        // Not connected (the agent went away): reconnect once for this call.
        p.waiting.push_back(c);
        if (!p.ep) {
            reconnects.fetch_add(1, std::memory_order_relaxed);
            start_connect(p);
        }
    }

    Peer* peer_of(ucp_ep_h ep) {
        auto it = peer_by_ep.find(ep);
        if (it == peer_by_ep.end()) return nullptr;
        auto p = peers.find(it->second);
        return p == peers.end() ? nullptr : &p->second;
    }

    void on_welcome(Peer& p, const wire::Welcome& w) {
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
        p.info = std::move(info);
        p.welcomed = true;
        if (p.connecting) {
            p.connecting->complete(Bytes{});
            p.connecting.reset();
        }
        auto waiting = std::move(p.waiting);
        p.waiting.clear();
        for (auto& c : waiting) dispatch(p, c);
    }

    // An answer from an agent this client did not call directly: the last hop of a forwarded
    // call, answering the reply-to. Matched by request id alone; its message names the agent.
    void on_forwarded_reply(Incoming&& in) {
        auto it = pending.find(in.header.request_id);
        if (it == pending.end() || it->second->kind != Kind::run) {
            if (in.header.request_id < next_id.load()) stray_replies.fetch_add(1, std::memory_order_relaxed);
            spdlog::debug("client: {} for unknown request {} dropped", wire::to_string(in.header.type), in.header.request_id);
            return;
        }
        auto c = it->second;
        if (in.header.type == wire::Type::result) {
            pending.erase(it);
            c->complete(std::move(in.payload));
            return;
        }
        if (in.header.type == wire::Type::error) {
            auto msg = wire::decode(in.header, in.payload);
            pending.erase(it);
            if (!msg) c->complete(tl::make_unexpected(msg.error()));
            else {
                const auto& e = std::get<wire::ErrorMsg>(msg->body);
                c->complete(fail(e.code, std::string(e.message)));
            }
        }
    }

    void on_message(Incoming&& in) {
        auto* p = peer_of(in.ep);
        if (!p) {
            on_forwarded_reply(std::move(in));
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
        auto it = pending.find(in.header.request_id);
        if (it == pending.end()) {
            if (in.header.request_id < next_id.load()) stray_replies.fetch_add(1, std::memory_order_relaxed);
            spdlog::debug("client: {} for unknown request {} from {}", wire::to_string(in.header.type),
                          in.header.request_id, agent_name(*p));
            return;
        }
        auto c = it->second;
        switch (in.header.type) {
        case wire::Type::result:
        case wire::Type::pong:
        case wire::Type::stats_reply:
        case wire::Type::region_info:
            pending.erase(it);
            c->complete(std::move(in.payload));
            return;
        case wire::Type::error: {
            const auto& e = std::get<wire::ErrorMsg>(msg->body);
            pending.erase(it);
            c->complete(fail(e.code, fmt::format("{}: {}", agent_name(*p), e.message)));
            return;
        }
        case wire::Type::need_code:
            need_code_received.fetch_add(1, std::memory_order_relaxed);
            pending.erase(it);
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

    void on_ep_error(ucp_ep_h ep, const Error& e) {
        drop_rkeys(ep);
        auto* p = peer_of(ep);
        if (!p) return;
        Error why{p->welcomed ? Errc::disconnected : Errc::connect_failed,
                  p->welcomed ? fmt::format("{} disconnected: {}", agent_name(*p), e.message)
                              : fmt::format("no agent answered at {}: {}", p->address, e.message)};
        fail_peer(*p, why);
    }

    void on_tick() {
        auto now = Clock::now();
        for (auto& [id, p] : peers) {
            if (p.ep && !p.welcomed && now > p.connect_deadline) {
                auto ep = p.ep;
                fail_peer(p, Error{Errc::connect_failed,
                                   fmt::format("no agent answered at {} within {} ms", p.address, options.connect_timeout.count())});
                engine->close(ep);
            }
        }
        for (auto it = pending.begin(); it != pending.end();) {
            if (now > it->second->deadline) {
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

    void shutdown() {
        Error why{Errc::shutting_down, "client is shutting down"};
        for (auto& [id, p] : peers) fail_peer(p, why);
        for (auto& [id, c] : pending) c->complete(tl::make_unexpected(why));
        pending.clear();
        for (auto& [key, rkey] : rkeys) ucp_rkey_destroy(rkey);
        rkeys.clear();
    }
};

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::Client(Client&&) noexcept = default;
Client& Client::operator=(Client&&) noexcept = default;

Client::~Client() {
    if (!impl_) return;
    impl_->engine->post([impl = impl_.get()] { impl->shutdown(); });
    impl_->engine->stop();
}

Result<Client> Client::create(const ClientOptions& options) {
    auto impl = std::make_unique<Impl>();
    impl->options = options;
    EngineOptions eo;
    eo.transport = options.transport;
    eo.mode = options.progress;
    eo.spin = options.spin;
    eo.loopback_only = options.loopback_only;
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
    auto fetched = std::make_shared<CallState>();
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
    impl_->engine->post([impl = impl_.get(), c] { impl->submit(c); });
    return Future(c);
}

Future Client::ship_bytes(const Kernel& kernel, const Target& target, Bytes args, const ShipOptions& options) {
    auto c = impl_->new_call(target.id(), Kind::run);
    if (!set_peers(*c, target, options)) return Future(c);
    if (!kernel.bundle) {
        c->complete(fail(Errc::invalid_argument, "kernel handle has no bundle"));
        return Future(c);
    }
    c->bundle = kernel.bundle();
    c->entry = std::string(kernel.entry);
    c->args = std::move(args);
    impl_->engine->post([impl = impl_.get(), c] { impl->submit(c); });
    return Future(c);
}

Future Client::ship_slice(std::span<const std::byte> bundle, std::size_t slice, std::string_view entry,
                          const Target& target, Bytes args) {
    auto c = impl_->new_call(target.id(), Kind::run);
    c->bundle = bundle;
    c->forced_slice = slice;
    c->entry = std::string(entry);
    c->args = std::move(args);
    impl_->engine->post([impl = impl_.get(), c] { impl->submit(c); });
    return Future(c);
}

Future Client::ping(const Target& target, std::span<const std::byte> payload) {
    auto c = impl_->new_call(target.id(), Kind::ping);
    c->args.assign(payload.begin(), payload.end());
    impl_->engine->post([impl = impl_.get(), c] { impl->submit(c); });
    return Future(c);
}

Result<std::vector<std::pair<std::string, std::uint64_t>>> Client::agent_stats(const Target& target) {
    auto c = impl_->new_call(target.id(), Kind::stats);
    impl_->engine->post([impl = impl_.get(), c] { impl->submit(c); });
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

ClientStats Client::stats() const {
    ClientStats s;
    s.runs_sent = impl_->runs_sent.load();
    s.bundles_sent = impl_->bundles_sent.load();
    s.bundle_bytes_sent = impl_->bundle_bytes_sent.load();
    s.need_code_received = impl_->need_code_received.load();
    s.reconnects = impl_->reconnects.load();
    s.stray_replies = impl_->stray_replies.load();
    return s;
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
    impl_->engine->post([impl = impl_.get(), key, r] { impl->regions.emplace(key, r); });
    return r;
}

Future Client::get(const RemoteRegion& region, std::uint64_t offset, std::uint32_t length) {
    auto c = impl_->new_call(region.target, Kind::get);
    c->region = region;
    c->offset = offset;
    c->scratch.resize(length);
    impl_->engine->post([impl = impl_.get(), c] { impl->submit(c); });
    return Future(c);
}

Future Client::put(const RemoteRegion& region, std::uint64_t offset, Bytes data) {
    auto c = impl_->new_call(region.target, Kind::put);
    c->region = region;
    c->offset = offset;
    c->args = std::move(data);
    impl_->engine->post([impl = impl_.get(), c] { impl->submit(c); });
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
