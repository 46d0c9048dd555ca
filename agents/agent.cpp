#include "agent.hpp"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <deque>
#include <future>
#include <map>
#include <random>
#include <set>
#include <unordered_map>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "core/engine.hpp"
#include "kernel_guard.hpp"
#include "regions.hpp"
#include "runtime.hpp"
#include "topology.hpp"
#include "worker_pool.hpp"

namespace bitship::agent {
namespace {

using Clock = std::chrono::steady_clock;

/// How long a forwarded RUN is remembered, so the next agent can ask for its code.
constexpr auto kForwardMemory = std::chrono::seconds(30);
/// Messages queued for a peer agent while its connection is being made.
constexpr std::size_t kMaxQueuedPerLink = 1 << 16;

struct CodeHashHasher {
    std::size_t operator()(const CodeHash& h) const noexcept {
        std::size_t v;
        std::memcpy(&v, h.data(), sizeof v);
        return v;
    }
};

// A RUN in flight: the payload that `run`'s spans point into travels with it.
struct RunRequest {
    ucp_ep_h ep = nullptr;
    std::uint64_t conn = 0; ///< the connection's id, so a reply never reaches a reused ep
    std::uint64_t id = 0;   ///< this hop's request id (NEED_CODE answers it)
    std::vector<std::byte> payload;
    wire::Run run;
};

// A compiled kernel or an operator's native one: what a worker runs.
struct Runnable {
    std::shared_ptr<const jit::CompiledCode> code; // keeps JIT code loaded while it runs
    bs_entry_fn fn = nullptr;
};

// A forwarded RUN, owned, for a resend with code on NEED_CODE.
struct Forwarded {
    std::string link;
    CodeHash hash{};
    wire::Encoded message; // as sent, without code
    Clock::time_point sent;
};

// A connection this agent made to a peer agent, to forward to.
struct Link {
    std::string address;
    ucp_ep_h ep = nullptr;
    bool welcomed = false;
    std::set<CodeHash> known; ///< hashes sent over this link
    std::vector<std::uint64_t> queued; ///< forwarded ids waiting for WELCOME
};

#define BITSHIP_AGENT_COUNTERS(X)                                                                  \
    X(connections) X(runs) X(results) X(errors) X(need_code_sent) X(code_received)                 \
    X(code_bytes_received) X(compiles) X(compile_failures) X(cache_hits) X(disk_loads)             \
    X(malformed_messages) X(kernel_failures) X(kernel_crashes) X(kernel_timeouts) X(pings)           \
    X(forwards) X(forwards_local) X(code_forwarded) X(native_runs)                                  \
    X(last_compile_verify_ns) X(last_compile_parse_ns) X(last_compile_optimise_ns)                  \
    X(last_compile_codegen_ns) X(last_compile_link_ns) X(last_compile_tier)

struct Counters {
#define X(name) std::atomic<std::uint64_t> name{0};
    BITSHIP_AGENT_COUNTERS(X)
#undef X
};

std::pair<std::string, std::uint16_t> split_host_port(std::string_view a) {
    auto colon = a.rfind(':');
    if (colon == std::string_view::npos) return {std::string(a), 0};
    unsigned port = 0;
    for (char c : a.substr(colon + 1)) port = c >= '0' && c <= '9' && port < 65536 ? port * 10 + unsigned(c - '0') : 70000;
    return {std::string(a.substr(0, colon)), port > 65535 ? std::uint16_t{0} : static_cast<std::uint16_t>(port)};
}

} // namespace

struct Agent::Impl {
    AgentConfig config;
    std::unique_ptr<jit::Jit> jit;
    std::unique_ptr<Engine> engine;
    std::unique_ptr<RegionTable> regions;
    std::unique_ptr<WorkerPool> pool;
    Topology topology;
    std::uint16_t port = 0;
    std::uint64_t instance = 0;
    Counters counters;
    std::atomic<bool> stopped{false};
    std::map<std::string, bs_entry_fn, std::less<>> natives;

    // Touched only by whoever progresses (engine thread or leading worker), one at a time.
    std::unordered_map<ucp_ep_h, std::uint64_t> connections;
    std::uint64_t next_conn = 1;
    std::uint64_t next_forward_id = 1;
    // Requests waiting for a compile of their hash that is already under way.
    std::unordered_map<CodeHash, std::vector<std::shared_ptr<RunRequest>>, CodeHashHasher> compiling;
    std::map<std::string, Link> links;
    std::unordered_map<ucp_ep_h, std::string> link_by_ep;
    std::unordered_map<std::uint64_t, Forwarded> forwarded;
    std::unordered_map<std::uint64_t, std::shared_ptr<const jit::CompiledCode>> forwarded_code;
    std::deque<std::uint64_t> forwarded_order;
    std::map<std::vector<std::byte>, ucp_ep_h> reply_eps; ///< caller worker address → ep
    std::unordered_map<ucp_ep_h, std::vector<std::byte>> reply_ep_address;

    std::string address() const { return fmt::format("{}:{}", config.host, port); }

    // --- answering (whoever progresses) ---------------------------------------------------

    void reply(ucp_ep_h ep, std::uint64_t conn, wire::Encoded&& m) {
        auto it = connections.find(ep);
        if (it == connections.end() || it->second != conn) {
            spdlog::debug("reply {} to a closed connection dropped", m.header.request_id);
            return;
        }
        engine->send(ep, std::move(m));
    }

    // The endpoint to a caller's worker (the reply-to of a forwarded call), made on first use.
    ucp_ep_h reply_ep(std::span<const std::byte> address) {
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

    // The final answer of a call: to the sender at hop 0, to the caller's reply-to after a forward.
    void answer(const RunRequest& r, wire::Encoded&& m) {
        m.header.request_id = r.run.hops == 0 ? r.id : r.run.origin;
        if (r.run.hops == 0 || r.run.reply_to.empty()) {
            reply(r.ep, r.conn, std::move(m));
            return;
        }
        if (auto* ep = reply_ep(r.run.reply_to)) engine->send(ep, std::move(m));
    }

    void answer_error(const RunRequest& r, const Error& e, std::int32_t kernel_code = 0) {
        counters.errors.fetch_add(1, std::memory_order_relaxed);
        spdlog::info("request {}: {}", r.id, e.describe());
        // After a forward the caller has no connection to us, so the message says who we are.
        auto text = r.run.hops == 0 ? e.message : fmt::format("agent {}: {}", address(), e.message);
        answer(r, wire::encode_error(0, e.code, text, kernel_code));
    }

    void reply_error(ucp_ep_h ep, std::uint64_t conn, std::uint64_t id, const Error& e) {
        counters.errors.fetch_add(1, std::memory_order_relaxed);
        spdlog::info("request {}: {}", id, e.describe());
        reply(ep, conn, wire::encode_error(id, e.code, e.message));
    }

    std::uint64_t conn_of(ucp_ep_h ep) const {
        auto it = connections.find(ep);
        return it == connections.end() ? 0 : it->second;
    }

    // --- events (whoever progresses) ------------------------------------------------------

    void on_conn_request(ucp_conn_request_h request) {
        auto ep = engine->accept(request);
        if (!ep) {
            spdlog::warn("could not accept a connection: {}", ep.error().describe());
            return;
        }
        connections[*ep] = next_conn++;
        counters.connections.fetch_add(1, std::memory_order_relaxed);
    }

    void on_bad_message(ucp_ep_h ep, std::uint64_t id, const Error& e) {
        counters.malformed_messages.fetch_add(1, std::memory_order_relaxed);
        spdlog::warn("bad message (request {}): {}", id, e.describe());
        if (ep && connections.contains(ep)) reply_error(ep, conn_of(ep), id, e);
    }

    void on_message(Incoming&& in) {
        if (auto link = link_by_ep.find(in.ep); link != link_by_ep.end()) {
            on_link_message(link->second, std::move(in));
            return;
        }
        auto conn = conn_of(in.ep);
        if (!in.ep || !conn) {
            counters.malformed_messages.fetch_add(1, std::memory_order_relaxed);
            spdlog::warn("{} message from no known connection dropped", wire::to_string(in.header.type));
            return;
        }
        auto msg = wire::decode(in.header, in.payload);
        if (!msg) {
            counters.malformed_messages.fetch_add(1, std::memory_order_relaxed);
            reply_error(in.ep, conn, in.header.request_id, msg.error());
            return;
        }
        switch (in.header.type) {
        case wire::Type::hello: {
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
            reply(in.ep, conn, wire::encode_welcome(w));
            return;
        }
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
                reply_error(in.ep, conn, in.header.request_id,
                            Error{Errc::region_not_found, fmt::format("agent has no memory region '{}'", name)});
                return;
            }
            wire::RegionInfo info{reinterpret_cast<std::uint64_t>(r->base), r->size, r->mapped.packed_rkey};
            reply(in.ep, conn, wire::encode_region_info(in.header.request_id, info));
            return;
        }
        case wire::Type::run: {
            auto r = std::make_shared<RunRequest>();
            r->ep = in.ep;
            r->conn = conn;
            r->id = in.header.request_id;
            r->run = std::get<wire::Run>(std::move(msg->body)); // spans into in.payload ...
            r->payload = std::move(in.payload);                  // ... whose buffer moves, not reallocates
            on_run(std::move(r));
            return;
        }
        case wire::Type::need_code: // a peer agent asking over a connection it made to us: not ours
        default:
            reply_error(in.ep, conn, in.header.request_id,
                        Error{Errc::unknown_message, fmt::format("an agent does not accept {} messages",
                                                                 wire::to_string(in.header.type))});
        }
    }

    void on_run(std::shared_ptr<RunRequest> r) {
        counters.runs.fetch_add(1, std::memory_order_relaxed);
        if (r->run.peers.empty() && !config.peers.empty()) {
            // No table shipped: the operator's. It outlives every request (it is config).
            for (const auto& p : config.peers) r->run.peers.push_back(p);
            r->run.self_index = static_cast<std::uint16_t>(config.self_index);
        }
        if (r->run.args.size() > config.limits.max_args) {
            answer_error(*r, Error{Errc::too_large, fmt::format("{} bytes of arguments exceed the limit of {}",
                                                               r->run.args.size(), config.limits.max_args)});
            return;
        }
        if (r->run.hash == CodeHash{}) { // an operator's native kernel
            auto it = natives.find(r->run.entry);
            if (it == natives.end()) {
                answer_error(*r, Error{Errc::entry_not_found, fmt::format("agent has no native kernel '{}'", r->run.entry)});
                return;
            }
            counters.native_runs.fetch_add(1, std::memory_order_relaxed);
            run_kernel(std::move(r), Runnable{nullptr, it->second});
            return;
        }
        if (auto code = jit->find(r->run.hash)) {
            counters.cache_hits.fetch_add(1, std::memory_order_relaxed);
            run_compiled(std::move(r), std::move(code));
            return;
        }
        if (auto it = compiling.find(r->run.hash); it != compiling.end()) {
            it->second.push_back(std::move(r));
            return;
        }
        bool has_code = !r->run.code.empty();
        if (!has_code && !jit->on_disk(r->run.hash)) {
            counters.need_code_sent.fetch_add(1, std::memory_order_relaxed);
            reply(r->ep, r->conn, wire::encode_need_code(r->id, r->run.hash));
            return;
        }
        if (has_code) {
            counters.code_received.fetch_add(1, std::memory_order_relaxed);
            counters.code_bytes_received.fetch_add(r->run.code.size(), std::memory_order_relaxed);
        }
        auto hash = r->run.hash;
        compiling[hash].push_back(r);
        // Compiling takes milliseconds: it runs as a job, never while progressing UCX.
        bool queued = pool->submit([this, r, has_code] {
            auto code = has_code ? jit->compile(r->run.code, r->run.hash) : jit->load(r->run.hash);
            engine->post([this, hash = r->run.hash, code = std::move(code)]() mutable { on_compiled(hash, std::move(code)); });
        });
        if (!queued) on_compiled(hash, fail(Errc::shutting_down, "agent is shutting down"));
    }

    void on_compiled(const CodeHash& hash, Result<std::shared_ptr<const jit::CompiledCode>> code) {
        auto node = compiling.extract(hash);
        if (node.empty()) return;
        auto waiting = std::move(node.mapped());
        if (!code) {
            counters.compile_failures.fetch_add(1, std::memory_order_relaxed);
            for (auto& r : waiting) answer_error(*r, code.error());
            return;
        }
        counters.compiles.fetch_add(1, std::memory_order_relaxed);
        const auto& s = (*code)->stats();
        if (s.from_disk) counters.disk_loads.fetch_add(1, std::memory_order_relaxed);
        auto ns = [](double ms) { return static_cast<std::uint64_t>(ms * 1e6); };
        counters.last_compile_verify_ns.store(ns(s.verify_ms), std::memory_order_relaxed);
        counters.last_compile_parse_ns.store(ns(s.parse_ms), std::memory_order_relaxed);
        counters.last_compile_optimise_ns.store(ns(s.optimise_ms), std::memory_order_relaxed);
        counters.last_compile_codegen_ns.store(ns(s.codegen_ms), std::memory_order_relaxed);
        counters.last_compile_link_ns.store(ns(s.link_ms), std::memory_order_relaxed);
        counters.last_compile_tier.store(s.tier, std::memory_order_relaxed);
        spdlog::info("compiled {} at tier {}{}: verify {:.2f} ms, parse {:.2f} ms, optimise {:.2f} ms, codegen {:.2f} ms, link {:.2f} ms",
                     to_hex(hash, 16), s.tier, s.from_object ? " (object from disk cache)" : s.from_disk ? " (from disk cache)" : "",
                     s.verify_ms, s.parse_ms, s.optimise_ms, s.codegen_ms, s.link_ms);
        for (auto& r : waiting) run_compiled(std::move(r), *code);
    }

    void run_compiled(std::shared_ptr<RunRequest> r, std::shared_ptr<const jit::CompiledCode> code) {
        auto fn = code->entry(r->run.entry);
        if (!fn) {
            answer_error(*r, fn.error());
            return;
        }
        run_kernel(std::move(r), Runnable{std::move(code), *fn});
    }

    const Region* create_region_from_worker(const char* name, std::size_t size) {
        // Registration belongs to whoever progresses: ask and wait (it never waits on a kernel).
        auto done = std::make_shared<std::promise<const Region*>>();
        auto result = done->get_future();
        engine->post([this, done, name = std::string(name), size] {
            auto r = regions->create(name, size);
            if (!r) spdlog::warn("a kernel's region: {}", r.error().describe());
            done->set_value(r ? *r : nullptr);
        });
        return result.get();
    }

    void run_kernel(std::shared_ptr<RunRequest> r, Runnable what) {
        bool queued = pool->submit([this, r, what = std::move(what)] {
            bs_ctx ctx;
            ctx.args = r->run.args;
            ctx.max_result = config.limits.max_result;
            ctx.max_args = config.limits.max_args;
            ctx.run = &r->run;
            ctx.regions = regions.get();
            ctx.create_region = [this](const char* name, std::size_t size) { return create_region_from_worker(name, size); };
            auto stopped = run_guarded(what.fn, &ctx, config.kernel_timeout);
            ctx.create_region = nullptr;
            engine->post([this, r, code = what.code, stopped = std::move(stopped), ctx = std::move(ctx)]() mutable {
                finish_kernel(r, code, stopped, ctx);
            });
        });
        if (!queued) answer_error(*r, Error{Errc::shutting_down, "agent is shutting down"});
    }

    void finish_kernel(const std::shared_ptr<RunRequest>& r, const std::shared_ptr<const jit::CompiledCode>& code,
                       const std::optional<Error>& stopped, bs_ctx& ctx) {
        if (stopped) {
            auto& c = stopped->code == Errc::kernel_timeout ? counters.kernel_timeouts : counters.kernel_crashes;
            c.fetch_add(1, std::memory_order_relaxed);
            spdlog::warn("kernel '{}' of {}: {}", r->run.entry, to_hex(r->run.hash, 16), stopped->message);
            answer_error(*r, Error{stopped->code, fmt::format("kernel '{}': {}", r->run.entry, stopped->message)});
            return;
        }
        if (ctx.runtime_error) {
            answer_error(*r, *ctx.runtime_error);
            return;
        }
        if (ctx.forward) {
            forward(*r, code, std::move(*ctx.forward));
            return;
        }
        if (ctx.failed) {
            counters.kernel_failures.fetch_add(1, std::memory_order_relaxed);
            answer_error(*r,
                         Error{Errc::kernel_failed, fmt::format("kernel '{}' failed with code {}: {}", r->run.entry,
                                                                ctx.fail_code, ctx.fail_message)},
                         ctx.fail_code);
            return;
        }
        counters.results.fetch_add(1, std::memory_order_relaxed);
        answer(*r, wire::encode_result(0, std::move(ctx.reply)));
    }

    // --- forwarding (whoever progresses) --------------------------------------------------

    void forward(const RunRequest& r, const std::shared_ptr<const jit::CompiledCode>& code, ForwardRequest f) {
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
        Forwarded fw{address, r.run.hash, wire::encode_run(id, next), Clock::now()};
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

    // Keeps a forwarded RUN (and the code it may need) for NEED_CODE; drops old ones.
    void remember(std::uint64_t id, Forwarded fw, const std::shared_ptr<const jit::CompiledCode>& code) {
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
    void forget(std::uint64_t id) {
        forwarded.erase(id);
        forwarded_code.erase(id);
    }

    // Tells the caller of a forwarded call that it failed (the forward never ran, or may not have).
    void tell_caller(const Forwarded& fw, Errc code, const std::string& message) {
        auto m = wire::decode(fw.message.header, fw.message.payload);
        if (!m) return;
        const auto& run = std::get<wire::Run>(m->body);
        counters.errors.fetch_add(1, std::memory_order_relaxed);
        if (auto* ep = reply_ep(run.reply_to)) engine->send(ep, wire::encode_error(run.origin, code, message));
    }

    void send_forward(Link& link, std::uint64_t id, bool with_code = false) {
        auto it = forwarded.find(id);
        if (it == forwarded.end()) return;
        auto& fw = it->second;
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
        run.code = code->bundle();
        counters.code_forwarded.fetch_add(1, std::memory_order_relaxed);
        engine->send(link.ep, wire::encode_run(id, run));
        link.known.insert(fw.hash);
    }

    Link& link_to(const std::string& address) {
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
            engine->send(link.ep, wire::encode_hello("xagent " + this->address()));
        }
        return link;
    }

    void on_link_message(const std::string& address, Incoming&& in) {
        auto& link = links[address];
        auto msg = wire::decode(in.header, in.payload);
        if (!msg) {
            spdlog::warn("bad message from peer {}: {}", address, msg.error().describe());
            return;
        }
        switch (in.header.type) {
        case wire::Type::welcome: {
            link.welcomed = true;
            auto queued = std::move(link.queued);
            link.queued.clear();
            for (auto id : queued) send_forward(link, id);
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

    void fail_link(Link& link, const Error& why) {
        // Every forward over this link that is still remembered may now never be answered: its
        // caller is told at once instead of waiting for its deadline. One that the peer did
        // answer before dying gets a second, late answer, which its client drops.
        std::vector<std::uint64_t> gone;
        for (const auto& [id, fw] : forwarded)
            if (fw.link == link.address) gone.push_back(id);
        for (auto id : gone) {
            tell_caller(forwarded.at(id), Errc::disconnected,
                        fmt::format("agent {}: peer {} went away with this call forwarded to it: {}", address(), link.address,
                                    why.message));
            forget(id);
        }
        link.queued.clear();
        link.known.clear();
        link.welcomed = false;
        if (link.ep) link_by_ep.erase(link.ep);
        link.ep = nullptr;
    }

    void on_ep_error(ucp_ep_h ep, const Error& e) {
        if (connections.erase(ep)) spdlog::info("client went away: {}", e.message);
        if (auto it = link_by_ep.find(ep); it != link_by_ep.end()) {
            spdlog::warn("peer {} went away: {}", it->second, e.message);
            fail_link(links[it->second], e);
        }
        if (auto it = reply_ep_address.find(ep); it != reply_ep_address.end()) {
            reply_eps.erase(it->second);
            reply_ep_address.erase(it);
        }
    }

    std::vector<std::pair<std::string, std::uint64_t>> counter_values() const {
        std::vector<std::pair<std::string, std::uint64_t>> out;
#define X(name) out.emplace_back(#name, counters.name.load(std::memory_order_relaxed));
        BITSHIP_AGENT_COUNTERS(X)
#undef X
        return out;
    }
};

Agent::Agent(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Agent::~Agent() { stop(); }

Result<std::unique_ptr<Agent>> Agent::start(const AgentConfig& config) {
    auto impl = std::make_unique<Impl>();
    impl->config = config;
    impl->topology = detect_topology();
    impl->instance = std::random_device{}() | (static_cast<std::uint64_t>(std::random_device{}()) << 32);
    for (const auto& [name, fn] : config.native_kernels) impl->natives.emplace(name, fn);
    if (config.peers.size() > 0xffff) return fail(Errc::invalid_argument, "at most 65535 --peer entries");
    if (config.self_index >= static_cast<int>(config.peers.size()))
        return fail(Errc::invalid_argument, fmt::format("self index {} is outside the {} configured peers", config.self_index,
                                                        config.peers.size()));
    install_kernel_guard();

    // 1. The JIT, linking kernels against the runtime, the curated libc subset and the
    //    operator's exports only.
    jit::JitOptions jo;
    jo.exports = runtime_exports();
    jo.exports.insert(jo.exports.end(), config.exports.begin(), config.exports.end());
    jo.opt_level = config.opt_level;
    jo.cache_dir = config.cache_dir;
    jo.tiers = config.jit_tiers;
    jo.cache_mib = config.cache_mib;
    jo.cache_disk_mib = config.cache_disk_mib;
    auto jit = jit::Jit::create(std::move(jo));
    if (!jit) return tl::make_unexpected(jit.error());
    impl->jit = std::move(*jit);
    // LLVM's one-time set-up now, not in the first caller's cold ship.
    if (auto warm = impl->jit->warm_up(); !warm) spdlog::warn("JIT warm-up: {}", warm.error().describe());

    // 3. The engine. A restarted agent must be able to take its port back while the old connections sit in
    // TIME_WAIT (SO_REUSEADDR); an operator's own UCX_CM_REUSEADDR still wins.
    setenv("UCX_CM_REUSEADDR", "y", 0);
    EngineOptions eo;
    eo.transport = config.transport;
    eo.mode = config.progress;
    eo.spin = config.spin;
    eo.max_message = config.limits.max_message;
    eo.loopback_only = config.loopback_only;
    auto* raw = impl.get();
    EngineHooks hooks;
    hooks.on_message = [raw](Incoming&& in) { raw->on_message(std::move(in)); };
    hooks.on_bad_message = [raw](ucp_ep_h ep, std::uint64_t id, const Error& e) { raw->on_bad_message(ep, id, e); };
    hooks.on_ep_error = [raw](ucp_ep_h ep, const Error& e) { raw->on_ep_error(ep, e); };
    hooks.on_conn_request = [raw](ucp_conn_request_h r) { raw->on_conn_request(r); };
    if (config.kernel_timeout.count() > 0) hooks.on_watch = [] { check_kernel_budgets(); };
    auto engine = Engine::create(eo, std::move(hooks));
    if (!engine) return tl::make_unexpected(engine.error());
    impl->engine = std::move(*engine);
    impl->regions = std::make_unique<RegionTable>(*impl->engine);

    // 2. Workers: an idle one leads progress unless the operator said no.
    unsigned workers = config.workers ? config.workers : impl->topology.cores;
    impl->pool = std::make_unique<WorkerPool>(workers, config.worker_spin, config.workers_lead ? impl->engine.get() : nullptr);

    // 4. Regions from the command line, before anyone can connect.
    for (const auto& [name, size] : config.regions) {
        auto r = impl->regions->create(name, size);
        if (!r) return tl::make_unexpected(r.error());
    }

    // 5. Listen before any thread progresses, so a bad address fails start() itself; then
    //    the workers (who may lead progress at once) and the engine's own thread.
    auto port = impl->engine->listen(config.host, config.port);
    if (!port) return tl::make_unexpected(port.error());
    impl->port = *port;
    if (!config.peers.empty() && config.self_index < 0) {
        auto me = std::find(config.peers.begin(), config.peers.end(), impl->address());
        if (me == config.peers.end())
            return fail(Errc::invalid_argument, fmt::format("this agent ({}) is not among its configured peers; add it, or "
                                                            "give its index with --self", impl->address()));
        impl->config.self_index = static_cast<int>(me - config.peers.begin());
    }
    impl->pool->start();
    impl->engine->start();
    return std::unique_ptr<Agent>(new Agent(std::move(impl)));
}

void Agent::stop() {
    if (!impl_ || impl_->stopped.exchange(true)) return;
    // Running kernels finish (bounded by the kernel timeout); queued ones are answered.
    auto left = impl_->pool->stop();
    if (!left.empty()) spdlog::info("{} queued jobs dropped at shutdown", left.size());
    impl_->engine->post([impl = impl_.get()] {
        Error why{Errc::shutting_down, "agent is shutting down"};
        for (auto& [hash, waiting] : impl->compiling)
            for (auto& r : waiting) impl->answer_error(*r, why);
        impl->compiling.clear();
    });
    impl_->engine->stop();
    impl_->regions->clear();
}

std::string Agent::address() const { return impl_->address(); }
std::uint16_t Agent::port() const { return impl_->port; }
std::vector<std::pair<std::string, std::uint64_t>> Agent::counters() const { return impl_->counter_values(); }

} // namespace bitship::agent
