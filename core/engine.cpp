#include "engine.hpp"
#include "held_count.hpp"
#include "spare_bytes.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/mman.h>
#include <sys/socket.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "memory_reuse.hpp"
#include "wire_split.hpp"

namespace bitship {
namespace {

// Every send lets the receiver answer on the endpoint it came in on. (UCX 1.13 has no
// COPY_HEADER flag: the header lives in the SendRecord until the send completes.)
constexpr std::uint32_t kSendFlags = UCP_AM_SEND_FLAG_REPLY;

// Sets an environment variable for as long as it lives, unless the operator set it already.
// UCT reads its settings from the environment when the worker opens its interfaces, and
// ucp_config_modify does not reach them, so this is how one engine's choice gets there
// without leaking into engines made later in the same process.
class ScopedEnv {
public:
    ScopedEnv(const char* name, const char* value) : name_(name), set_(!std::getenv(name)) {
        if (set_) setenv(name, value, 0);
    }
    ~ScopedEnv() {
        if (set_) unsetenv(name_);
    }
    ScopedEnv(const ScopedEnv&) = delete;
    ScopedEnv& operator=(const ScopedEnv&) = delete;

private:
    const char* name_;
    bool set_;
};

struct ConfigDeleter {
    void operator()(ucp_config_t* c) const noexcept { ucp_config_release(c); }
};

// Keeps the payload of one send alive until UCX calls back.
struct SendRecord {
    wire::Encoded message;
    std::vector<std::byte> am_header; ///< a split message's (wire_split.hpp); storage reused
    std::atomic<std::uint64_t>* in_flight = nullptr; ///< the engine's count of sends not yet done
    Hold hold; ///< the receiver's share of EngineOptions::inflight until UCX is done with it
};

struct RecvRecord {
    Engine* engine;
    Incoming incoming;
    std::size_t data_length = 0; ///< what UCX receives (after a split message's prefix)
};

Result<sockaddr_storage> resolve(const std::string& host, std::uint16_t port) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    if (int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), nullptr, &hints, &found); rc != 0)
        return fail(Errc::invalid_argument, fmt::format("cannot resolve '{}': {}", host, gai_strerror(rc)));
    sockaddr_storage out{};
    std::memcpy(&out, found->ai_addr, found->ai_addrlen);
    freeaddrinfo(found);
    if (out.ss_family == AF_INET) reinterpret_cast<sockaddr_in*>(&out)->sin_port = htons(port);
    else reinterpret_cast<sockaddr_in6*>(&out)->sin6_port = htons(port);
    return out;
}

socklen_t sockaddr_len(const sockaddr_storage& s) {
    return s.ss_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
}

// A payload made of three parts, copied as it is made (no zero-fill first): a split message's
// prefix, data and suffix, or (empty data) the fields around landed arguments.
std::vector<std::byte> laid_out(std::span<const std::byte> a, std::span<const std::byte> b, std::span<const std::byte> c) {
    // An empty payload (a kernel that answers nothing) needs no buffer: taken, the thread's
    // kept one would leave with the caller's result, and its next message would allocate.
    if (a.empty() && b.empty() && c.empty()) return {};
    auto out = SpareBytes::take();
    if (a.empty() && c.empty()) { // a plain message: its data alone
        out.assign(b.begin(), b.end());
        return out;
    }
    out.reserve(a.size() + b.size() + c.size());
    out.insert(out.end(), a.begin(), a.end());
    out.insert(out.end(), b.begin(), b.end());
    out.insert(out.end(), c.begin(), c.end());
    return out;
}

} // namespace

Error endpoint_failure(ucs_status_t status) {
    // The listener refused us: an agent does so past its connection limit.
    if (status == UCS_ERR_REJECTED)
        return Error{Errc::connect_failed, fmt::format("the agent refused the connection ({}): an agent does so while "
                                                       "it has as many as its limit (xagent --max-connections)",
                                                       ucs_status_string(status))};
    return from_ucs(status, "endpoint failed");
}

Error from_ucs(ucs_status_t status, std::string_view what) {
    Errc code = Errc::transport_error;
    switch (status) {
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_REJECTED:
    case UCS_ERR_NOT_CONNECTED: code = Errc::connect_failed; break;
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_CANCELED: code = Errc::disconnected; break;
    case UCS_ERR_TIMED_OUT: code = Errc::timeout; break;
    case UCS_ERR_INVALID_PARAM:
    case UCS_ERR_INVALID_ADDR: code = Errc::invalid_argument; break;
    case UCS_ERR_BUSY: code = Errc::connect_failed; break;
    default: break;
    }
    return Error{code, fmt::format("{}: {}", what, ucs_status_string(status))};
}

Result<Transport> parse_transport(std::string_view name) {
    if (name == "any") return Transport::any;
    if (name == "tcp") return Transport::tcp;
    if (name == "shm") return Transport::shm;
    return fail(Errc::invalid_argument, fmt::format("unknown transport '{}' (tcp, shm or any)", name));
}

std::string_view to_string(Transport t) noexcept {
    switch (t) {
    case Transport::any: return "any";
    case Transport::tcp: return "tcp";
    case Transport::shm: return "shm";
    }
    return "?";
}

Result<ProgressMode> parse_progress_mode(std::string_view name) {
    if (name == "spin") return ProgressMode::spin;
    if (name == "block") return ProgressMode::block;
    if (name == "spin-then-block") return ProgressMode::spin_then_block;
    return fail(Errc::invalid_argument, fmt::format("unknown progress mode '{}' (spin, block or spin-then-block)", name));
}

std::string_view to_string(ProgressMode m) noexcept {
    switch (m) {
    case ProgressMode::spin: return "spin";
    case ProgressMode::block: return "block";
    case ProgressMode::spin_then_block: return "spin-then-block";
    }
    return "?";
}

// The progress clocks start here, not on the engine's thread: they belong to whoever holds the
// token, and a guest (an agent's worker, a waiting caller) may lead before that thread starts.
Engine::Engine(const EngineOptions& options, EngineHooks hooks)
    : options_(options), hooks_(std::move(hooks)), last_event_(Clock::now()), last_tick_(last_event_),
      now_(last_event_), core_sharing_(options.shared_yields_after_wake), inflight_(options.inflight) {}

Result<std::unique_ptr<Engine>> Engine::create(const EngineOptions& options, EngineHooks hooks) {
    std::unique_ptr<Engine> engine(new Engine(options, std::move(hooks)));
    engine->receive_buffers_ = std::make_shared<ReceiveBuffers>(malloc_is_tunable() ? kKeptReceiveBytes : 0);

    // 1. Configuration: the transport choice overrides UCX_TLS; loopback pinning only when the
    //    environment has not chosen devices itself.
    ucp_config_t* raw_config = nullptr;
    if (auto s = ucp_config_read(nullptr, nullptr, &raw_config); s != UCS_OK) return tl::make_unexpected(from_ucs(s, "ucp_config_read"));
    std::unique_ptr<ucp_config_t, ConfigDeleter> config(raw_config);
    const char* tls = nullptr;
    if (options.transport == Transport::tcp) tls = "tcp";
    // Shared memory carries the data; TCP is still needed for the sockaddr handshake.
    if (options.transport == Transport::shm) tls = "sm,self,tcp";
    // Every endpoint asks for peer-failure handling, which UCX 1.13's shared-memory
    // transports offer only when told to (through keepalive): without this, endpoints made
    // through the listener silently fall back to TCP for everything. An operator's own
    // setting wins. (UCT settings are read from the environment when interfaces open.)
    if (options.transport != Transport::tcp) setenv("UCX_MM_ERROR_HANDLING", "y", 0);
    if (tls) {
        if (auto s = ucp_config_modify(config.get(), "TLS", tls); s != UCS_OK)
            return tl::make_unexpected(from_ucs(s, "setting UCX_TLS"));
    }
    if (options.loopback_only && !std::getenv("UCX_NET_DEVICES")) {
        if (auto s = ucp_config_modify(config.get(), "NET_DEVICES", "lo"); s != UCS_OK)
            return tl::make_unexpected(from_ucs(s, "setting UCX_NET_DEVICES"));
    }

    // Over shared memory TCP carries the handshake only. Able to PUT/GET, it would become the
    // endpoints' RMA lane (no shared-memory transport here does zero-copy RMA), and then every
    // progress call polls its sockets: an epoll_wait per iteration on the caller's and the
    // agent's hot path, half of both processes' time at a high call rate, and a cached ship
    // 1.8x slower. Without it, same-host regions are read by direct load (ucp_rkey_ptr) and
    // other RMA goes by UCX's AM-based protocol over shared memory.
    std::optional<ScopedEnv> tcp_rma_off;
    if (options.transport == Transport::shm) tcp_rma_off.emplace("UCX_TCP_PUT_ENABLE", "n");

    // 2. Context and worker.
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
    params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP | UCP_FEATURE_RMA;
    params.name = "bitship";
    ucp_context_h context = nullptr;
    if (auto s = ucp_init(&params, config.get(), &context); s != UCS_OK) return tl::make_unexpected(from_ucs(s, "ucp_init"));
    engine->context_.reset(context);

    ucp_worker_params_t wparams{};
    wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    // Several threads take turns (the engine's thread, a leading caller or worker), never two at
    // once: the progress token serialises them.
    wparams.thread_mode = UCS_THREAD_MODE_SERIALIZED;
    ucp_worker_h worker = nullptr;
    if (auto s = ucp_worker_create(context, &wparams, &worker); s != UCS_OK)
        return tl::make_unexpected(from_ucs(s, "ucp_worker_create"));
    engine->worker_.reset(worker);
    if (auto s = ucp_worker_get_efd(worker, &engine->event_fd_); s != UCS_OK)
        return tl::make_unexpected(from_ucs(s, "ucp_worker_get_efd"));
    ucp_address_t* address = nullptr;
    std::size_t address_length = 0;
    if (auto s = ucp_worker_get_address(worker, &address, &address_length); s != UCS_OK)
        return tl::make_unexpected(from_ucs(s, "ucp_worker_get_address"));
    auto* first = reinterpret_cast<const std::byte*>(address);
    engine->worker_address_.assign(first, first + address_length);
    ucp_worker_release_address(worker, address);
    ucp_worker_attr_t wattr{};
    wattr.field_mask = UCP_WORKER_ATTR_FIELD_MAX_AM_HEADER;
    if (auto s = ucp_worker_query(worker, &wattr); s != UCS_OK) return tl::make_unexpected(from_ucs(s, "ucp_worker_query"));
    engine->max_am_header_ = wattr.max_am_header;

    // 3. The one AM handler.
    ucp_am_handler_param_t handler{};
    handler.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                         UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
    handler.id = wire::kAmId;
    handler.cb = &Engine::on_am;
    handler.arg = engine.get();
    handler.flags = UCP_AM_FLAG_WHOLE_MSG;
    if (auto s = ucp_worker_set_am_recv_handler(worker, &handler); s != UCS_OK)
        return tl::make_unexpected(from_ucs(s, "ucp_worker_set_am_recv_handler"));
    return engine;
}

Engine::~Engine() { stop(); }

void Engine::start() {
    thread_ = std::thread([this] { run(); });
}

void Engine::stop() {
    if (!thread_.joinable()) return;
    stopping_.store(true);
    ucp_worker_signal(worker_.get());
    {
        std::lock_guard lock(guest_mutex_);
        guest_cv_.notify_all();
    }
    notify_waiters();
    thread_.join();
}

void Engine::post(std::function<void()> fn) {
    {
        std::lock_guard lock(posted_mutex_);
        posted_.push_back(std::move(fn));
        has_posted_.store(true, std::memory_order_seq_cst);
    }
    if (sleepers_.load(std::memory_order_seq_cst) > 0) ucp_worker_signal(worker_.get());
    if (guest_busy_.load(std::memory_order_acquire)) {
        std::lock_guard lock(guest_mutex_);
        guest_cv_.notify_all();
    }
}

ucs_status_t Engine::on_am(void* arg, const void* header, size_t header_length, void* data, size_t length,
                           const ucp_am_recv_param_t* param) noexcept {
    auto* self = static_cast<Engine*>(arg);
    ucp_ep_h ep = (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ? param->reply_ep : nullptr;
    try {
        auto am = wire::decode_am_header(std::span(static_cast<const std::byte*>(header), header_length), length);
        if (!am) {
            std::uint64_t id = 0;
            if (header_length >= offsetof(wire::Header, request_id) + sizeof id)
                std::memcpy(&id, static_cast<const char*>(header) + offsetof(wire::Header, request_id), sizeof id);
            self->bad_.push_back({ep, id, am.error()});
            return UCS_OK;
        }
        const auto* hdr = &am->header;
        // The payload: the AM data, with a split message's parts around it (wire_split.hpp).
        const std::size_t whole = hdr->payload_size;
        if (whole > self->options_.max_message) {
            self->bad_.push_back({ep, hdr->request_id,
                                  Error{Errc::too_large, fmt::format("{} message of {} bytes exceeds this agent's limit of {} bytes",
                                                                     wire::to_string(hdr->type), whole,
                                                                     self->options_.max_message)}});
            return UCS_OK; // a rendezvous we do not receive is dropped by UCX
        }
        // The sender's share is taken before the payload is allocated (or a rendezvous fetched).
        // An eager BATCH is opened in this same pass and its items held one by one, each
        // refused with its own request id (open_batch): refused whole, its calls would never hear.
        const bool eager = !(param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV);
        auto hold = eager && hdr->type == wire::Type::batch ? Result<Hold>(Hold{}) : self->inflight_.admit(ep, whole);
        if (!hold) {
            self->bad_.push_back({ep, hdr->request_id, std::move(hold.error())});
            return UCS_OK;
        }
        const std::span<const std::byte> bytes(static_cast<const std::byte*>(data), length);
        // A split message's data lands where the owner says, when it says; the payload then
        // holds the parts around it.
        std::optional<Landing> landing;
        if (!am->prefix.empty() && self->hooks_.land_args)
            if (landing = self->hooks_.land_args(*hdr, length); landing && landing->at.size() < length) landing.reset();
        auto landed = [&] {
            Incoming in{ep, *hdr, laid_out(am->prefix, {}, am->suffix), std::move(*hold)};
            in.outside = {landing->at.first(length), am->prefix.size()};
            in.outside_keep = std::move(landing->keep);
            return in;
        };
        if (eager && landing) {
            std::memcpy(landing->at.data(), bytes.data(), length);
            self->arrived_.push_back(landed());
            return UCS_OK;
        }
        if (eager) {
            self->arrived_.emplace_back(ep, *hdr, laid_out(am->prefix, bytes, am->suffix), std::move(*hold));
            return UCS_OK;
        }
        // Rendezvous: start the receive now, into `at`; the message is queued when it lands.
        auto receive = [&](Incoming&& in, std::byte* at) {
            auto* record = new RecvRecord{self, std::move(in), length};
            ucp_request_param_t rp{};
            rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
            rp.cb.recv_am = &Engine::on_recv_data;
            rp.user_data = record;
            return std::pair{record, ucp_am_recv_data_nbx(self->worker_.get(), data, at, length, &rp)};
        };
        std::pair<RecvRecord*, void*> started;
        if (landing) {
            auto* at = landing->at.data();
            started = receive(landed(), at);
        } else {
            Incoming in{ep, *hdr, self->receive_buffers_->take(whole), std::move(*hold)};
            auto* at = in.payload.data();
            if (!am->prefix.empty()) std::memcpy(at, am->prefix.data(), am->prefix.size());
            if (!am->suffix.empty()) std::memcpy(at + am->prefix.size() + length, am->suffix.data(), am->suffix.size());
            started = receive(std::move(in), at + am->prefix.size());
        }
        auto [record, req] = started;
        if (req == nullptr) {
            self->arrived_.push_back(std::move(record->incoming));
            delete record;
        } else if (UCS_PTR_IS_ERR(req)) {
            self->bad_.push_back({ep, hdr->request_id, from_ucs(UCS_PTR_STATUS(req), "receiving a rendezvous payload")});
            delete record;
        }
        return UCS_OK;
    } catch (const std::bad_alloc&) {
        self->bad_.push_back({ep, 0, Error{Errc::too_large, "out of memory receiving a message"}});
        return UCS_OK;
    }
}

void Incoming::join_outside() {
    if (!outside_keep) return;
    const std::span<const std::byte> fields(payload);
    payload = laid_out(fields.first(outside.at), outside.bytes, fields.subspan(outside.at));
    outside = {};
    outside_keep.reset();
}

void Engine::on_recv_data(void* request, ucs_status_t status, size_t length, void* user_data) noexcept {
    auto* record = static_cast<RecvRecord*>(user_data);
    auto* self = record->engine;
    try {
        if (status == UCS_OK && length == record->data_length)
            self->arrived_.push_back(std::move(record->incoming));
        else
            self->bad_.push_back({record->incoming.ep, record->incoming.header.request_id,
                                  status == UCS_OK ? Error{Errc::malformed_message, "rendezvous payload length mismatch"}
                                                   : from_ucs(status, "receiving a rendezvous payload")});
    } catch (...) {
    }
    delete record;
    ucp_request_free(request);
}

void Engine::on_send_done(void* request, ucs_status_t status, void* user_data) noexcept {
    if (status != UCS_OK && status != UCS_ERR_CANCELED)
        spdlog::debug("send failed: {}", ucs_status_string(status));
    auto* record = static_cast<SendRecord*>(user_data);
    record->in_flight->fetch_sub(1, std::memory_order_relaxed);
    delete record;
    ucp_request_free(request);
}

void Engine::on_ep_failed(void* arg, ucp_ep_h ep, ucs_status_t status) noexcept {
    auto* self = static_cast<Engine*>(arg);
    try {
        self->failed_.push_back({ep, status});
    } catch (...) {
    }
}

void Engine::on_connection(ucp_conn_request_h request, void* arg) noexcept {
    auto* self = static_cast<Engine*>(arg);
    try {
        self->conn_requests_.push_back(request);
    } catch (...) {
        ucp_listener_reject(self->listener_.get(), request);
    }
}

ucp_ep_h Engine::make_ep(ucp_ep_params_t& params, Result<ucp_ep_h>& out) {
    params.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler.cb = &Engine::on_ep_failed;
    params.err_handler.arg = this;
    ucp_ep_h ep = nullptr;
    if (auto s = ucp_ep_create(worker_.get(), &params, &ep); s != UCS_OK) {
        out = tl::make_unexpected(from_ucs(s, "ucp_ep_create"));
        return nullptr;
    }
    endpoints_.push_back(ep);
    out = ep;
    return ep;
}

Result<ucp_ep_h> Engine::connect(const std::string& host, std::uint16_t port) {
    auto addr = resolve(host, port);
    if (!addr) return tl::make_unexpected(addr.error());
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR;
    params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&*addr);
    params.sockaddr.addrlen = sockaddr_len(*addr);
    Result<ucp_ep_h> out = nullptr;
    make_ep(params, out);
    if (!out) out.error().message = fmt::format("connecting to {}:{}: {}", host, port, out.error().message);
    return out;
}

Result<ucp_ep_h> Engine::accept(ucp_conn_request_h request) {
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST;
    params.conn_request = request;
    Result<ucp_ep_h> out = nullptr;
    make_ep(params, out);
    return out;
}

void Engine::reject(ucp_conn_request_h request) {
    ucp_listener_reject(listener_.get(), request);
}

Result<std::uint16_t> Engine::listen(const std::string& host, std::uint16_t port) {
    auto addr = resolve(host, port);
    if (!addr) return tl::make_unexpected(addr.error());
    ucp_listener_params_t params{};
    params.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&*addr);
    params.sockaddr.addrlen = sockaddr_len(*addr);
    params.conn_handler.cb = &Engine::on_connection;
    params.conn_handler.arg = this;
    ucp_listener_h listener = nullptr;
    if (auto s = ucp_listener_create(worker_.get(), &params, &listener); s != UCS_OK) {
        auto e = from_ucs(s, fmt::format("listening on {}:{}", host, port));
        e.code = Errc::invalid_argument;
        return tl::make_unexpected(e);
    }
    listener_.reset(listener);
    ucp_listener_attr_t attr{};
    attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
    if (auto s = ucp_listener_query(listener, &attr); s != UCS_OK) return tl::make_unexpected(from_ucs(s, "ucp_listener_query"));
    const auto& sa = attr.sockaddr;
    return sa.ss_family == AF_INET ? ntohs(reinterpret_cast<const sockaddr_in&>(sa).sin_port)
                                   : ntohs(reinterpret_cast<const sockaddr_in6&>(sa).sin6_port);
}

void Engine::send(ucp_ep_h ep, wire::Encoded&& message) {
    if (cork_depth_ > 0 && gather(ep, message)) {
        SpareBytes::give(std::move(message.payload)); // copied into the BATCH: the next message's buffer
        return;
    }
    if (!gathered_.empty()) send_gathered(ep); // what was gathered for `ep` goes first
    send_now(ep, std::move(message));
}

void Engine::send_now(ucp_ep_h ep, wire::Encoded&& message) {
    // Most sends complete at once (eager, short): their record is kept for the thread's next
    // send rather than freed, so a call's messages allocate no record each.
    thread_local std::unique_ptr<SendRecord> spare;
    SendRecord* record = spare ? spare.release() : new SendRecord;
    record->message = std::move(message);
    record->in_flight = &sends_in_flight_;
    auto& m = record->message;
    // A split message goes as one (its bulk copied in) where its parts exceed UCX's AM header.
    if (m.split() && wire::kSplitFrameBytes + m.payload.size() > max_am_header_) wire::join_split(m);
    const void* header = &m.header;
    std::size_t header_length = sizeof m.header;
    auto bytes = m.split() ? m.borrowed : m.bytes();
    if (m.split()) {
        wire::write_split_header(m, record->am_header);
        header = record->am_header.data();
        header_length = record->am_header.size();
    }
    ucp_request_param_t rp{};
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    rp.cb.send = &Engine::on_send_done;
    rp.user_data = record;
    rp.flags = kSendFlags;
    add_held(bytes_sent_, m.header.payload_size); // only the token's holder sends
    auto* req = ucp_am_send_nbx(ep, wire::kAmId, header, header_length, bytes.data(), bytes.size(), &rp);
    if (req == nullptr) {
        SpareBytes::give(std::move(m.payload)); // for this thread's next message
        m.payload = {};
        m.borrowed = {};
        m.keep.reset();
        m.split_at = 0;
        spare.reset(record);
    } else if (!UCS_PTR_IS_ERR(req)) {
        sends_in_flight_.fetch_add(1, std::memory_order_relaxed); // on_send_done takes it off
        record->hold = inflight_.charge(ep, m.header.payload_size); // ... and this
    } else {
        spdlog::debug("{} send failed: {}", wire::to_string(m.header.type), ucs_status_string(UCS_PTR_STATUS(req)));
        delete record;
    }
}

void Engine::close(ucp_ep_h ep) {
    std::erase(endpoints_, ep);
    inflight_.forget(ep);
    drop_gathered(ep);
    ucp_request_param_t rp{};
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    rp.flags = UCP_EP_CLOSE_FLAG_FORCE;
    auto* req = ucp_ep_close_nbx(ep, &rp);
    if (req != nullptr && !UCS_PTR_IS_ERR(req)) {
        // Finished by later progress; nobody waits for it.
        ucp_request_free(req);
    }
}

Result<ucp_ep_h> Engine::connect_to_worker(std::span<const std::byte> address) {
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
    params.address = reinterpret_cast<const ucp_address_t*>(address.data());
    Result<ucp_ep_h> out = nullptr;
    make_ep(params, out);
    return out;
}

bool Engine::drain() {
    bool did = false;
    if (has_posted_.load(std::memory_order_acquire)) {
        std::vector<std::function<void()>> work;
        {
            std::lock_guard lock(posted_mutex_);
            work.swap(posted_);
            has_posted_.store(false, std::memory_order_relaxed);
        }
        for (auto& fn : work) fn();
        did = did || !work.empty();
    }
    // Swap out before dispatching: hooks may progress nothing, but may send, which can call back.
    if (!conn_requests_.empty()) {
        auto requests = std::move(conn_requests_);
        conn_requests_.clear();
        for (auto* r : requests) {
            if (hooks_.on_conn_request) hooks_.on_conn_request(r);
            else ucp_listener_reject(listener_.get(), r);
        }
        did = true;
    }
    if (!arrived_.empty()) {
        // The queue takes the spare's storage, so a steady stream of messages allocates none
        // (a hook that drains again meanwhile finds the spare empty: it allocates, and is right).
        auto batch = std::move(arrived_);
        arrived_ = std::move(arrived_spare_);
        arrived_.clear();
        for (auto& in : batch) {
            if (in.header.type == wire::Type::batch) open_batch(std::move(in));
            else if (hooks_.on_message) hooks_.on_message(std::move(in));
            // A payload its owner read and let be: the next message's buffer.
            if (in.payload.capacity() != 0) SpareBytes::give(std::move(in.payload));
        }
        batch.clear();
        if (batch.capacity() > arrived_spare_.capacity()) arrived_spare_ = std::move(batch);
        did = true;
    }
    if (!rma_done_.empty()) {
        auto batch = std::move(rma_done_);
        rma_done_.clear();
        for (auto& r : batch) r.done(r.status);
        did = true;
    }
    if (!bad_.empty()) {
        auto batch = std::move(bad_);
        bad_.clear();
        for (auto& b : batch)
            if (hooks_.on_bad_message) hooks_.on_bad_message(b.ep, b.request_id, b.error);
        did = true;
    }
    if (!failed_.empty()) {
        auto batch = std::move(failed_);
        failed_.clear();
        for (auto& f : batch) {
            if (hooks_.on_ep_error) hooks_.on_ep_error(f.ep, endpoint_failure(f.status));
            close(f.ep);
        }
        did = true;
    }
    return did;
}

} // namespace bitship
