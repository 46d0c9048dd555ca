#include "agent.hpp"

#include <atomic>
#include <cstdlib>
#include <random>
#include <unordered_map>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "engine.hpp"
#include "kernel_guard.hpp"
#include "runtime.hpp"
#include "topology.hpp"
#include "worker_pool.hpp"

namespace bitship::agent {
namespace {

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
    std::uint64_t id = 0;
    std::vector<std::byte> payload;
    wire::Run run;
};

#define BITSHIP_AGENT_COUNTERS(X)                                                                  \
    X(connections) X(runs) X(results) X(errors) X(need_code_sent) X(code_received)                 \
    X(code_bytes_received) X(compiles) X(compile_failures) X(cache_hits) X(disk_loads)             \
    X(malformed_messages) X(kernel_failures) X(kernel_crashes) X(kernel_timeouts) X(pings)           \
    X(last_compile_verify_ns) X(last_compile_parse_ns) X(last_compile_optimise_ns)                  \
    X(last_compile_codegen_ns) X(last_compile_link_ns)

struct Counters {
#define X(name) std::atomic<std::uint64_t> name{0};
    BITSHIP_AGENT_COUNTERS(X)
#undef X
};

} // namespace

struct Agent::Impl {
    AgentConfig config;
    std::unique_ptr<jit::Jit> jit;
    std::unique_ptr<Engine> engine;
    std::unique_ptr<WorkerPool> pool;
    Topology topology;
    std::uint16_t port = 0;
    std::uint64_t instance = 0;
    Counters counters;
    std::atomic<bool> stopped{false};

    // Progress thread only.
    std::unordered_map<ucp_ep_h, std::uint64_t> connections;
    std::uint64_t next_conn = 1;
    // Requests waiting for a compile of their hash that is already under way.
    std::unordered_map<CodeHash, std::vector<std::shared_ptr<RunRequest>>, CodeHashHasher> compiling;

    std::string address() const { return fmt::format("{}:{}", config.host, port); }

    // --- progress thread ------------------------------------------------------------------

    void reply(ucp_ep_h ep, std::uint64_t conn, wire::Encoded&& m) {
        auto it = connections.find(ep);
        if (it == connections.end() || it->second != conn) {
            spdlog::debug("reply {} to a closed connection dropped", m.header.request_id);
            return;
        }
        engine->send(ep, std::move(m));
    }

    void reply_error(ucp_ep_h ep, std::uint64_t conn, std::uint64_t id, const Error& e, std::int32_t kernel_code = 0) {
        counters.errors.fetch_add(1, std::memory_order_relaxed);
        spdlog::info("request {}: {}", id, e.describe());
        reply(ep, conn, wire::encode_error(id, e.code, e.message, kernel_code));
    }

    std::uint64_t conn_of(ucp_ep_h ep) const {
        auto it = connections.find(ep);
        return it == connections.end() ? 0 : it->second;
    }

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
        auto conn = conn_of(in.ep);
        if (!in.ep || !conn) {
            counters.malformed_messages.fetch_add(1, std::memory_order_relaxed);
            spdlog::warn("{} message with no reply endpoint dropped", wire::to_string(in.header.type));
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
        case wire::Type::run: {
            auto r = std::make_shared<RunRequest>();
            r->ep = in.ep;
            r->conn = conn;
            r->id = in.header.request_id;
            r->run = std::get<wire::Run>(msg->body); // spans into in.payload ...
            r->payload = std::move(in.payload);      // ... whose buffer moves, not reallocates
            on_run(std::move(r));
            return;
        }
        default:
            reply_error(in.ep, conn, in.header.request_id,
                        Error{Errc::unknown_message, fmt::format("an agent does not accept {} messages",
                                                                 wire::to_string(in.header.type))});
        }
    }

    void on_run(std::shared_ptr<RunRequest> r) {
        counters.runs.fetch_add(1, std::memory_order_relaxed);
        if (r->run.args.size() > config.limits.max_args) {
            reply_error(r->ep, r->conn, r->id, Error{Errc::too_large, fmt::format("{} bytes of arguments exceed the limit of {}",
                                                                                  r->run.args.size(), config.limits.max_args)});
            return;
        }
        if (auto code = jit->find(r->run.hash)) {
            counters.cache_hits.fetch_add(1, std::memory_order_relaxed);
            run_kernel(std::move(r), std::move(code));
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
        // Compiling takes milliseconds: a worker does it, never the progress thread.
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
            for (auto& r : waiting) reply_error(r->ep, r->conn, r->id, code.error());
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
        spdlog::info("compiled {}{}: verify {:.2f} ms, parse {:.2f} ms, optimise {:.2f} ms, codegen {:.2f} ms, link {:.2f} ms",
                     to_hex(hash, 16), s.from_disk ? " (from disk cache)" : "", s.verify_ms, s.parse_ms, s.optimise_ms,
                     s.codegen_ms, s.link_ms);
        for (auto& r : waiting) run_kernel(std::move(r), *code);
    }

    void run_kernel(std::shared_ptr<RunRequest> r, std::shared_ptr<const jit::CompiledCode> code) {
        auto fn = code->entry(r->run.entry);
        if (!fn) {
            reply_error(r->ep, r->conn, r->id, fn.error());
            return;
        }
        bool queued = pool->submit([this, r, code = std::move(code), fn = *fn] {
            bs_ctx ctx;
            ctx.args = r->run.args;
            ctx.max_result = config.limits.max_result;
            auto stopped = run_guarded(fn, &ctx, config.kernel_timeout);
            engine->post([this, r, stopped = std::move(stopped), ctx = std::move(ctx)]() mutable {
                finish_kernel(*r, stopped, ctx);
            });
        });
        if (!queued) reply_error(r->ep, r->conn, r->id, Error{Errc::shutting_down, "agent is shutting down"});
    }

    void finish_kernel(const RunRequest& r, const std::optional<Error>& stopped, bs_ctx& ctx) {
        if (stopped) {
            auto& c = stopped->code == Errc::kernel_timeout ? counters.kernel_timeouts : counters.kernel_crashes;
            c.fetch_add(1, std::memory_order_relaxed);
            spdlog::warn("kernel '{}' of {}: {}", r.run.entry, to_hex(r.run.hash, 16), stopped->message);
            reply_error(r.ep, r.conn, r.id,
                        Error{stopped->code, fmt::format("kernel '{}': {}", r.run.entry, stopped->message)});
            return;
        }
        if (ctx.failed) {
            counters.kernel_failures.fetch_add(1, std::memory_order_relaxed);
            reply_error(r.ep, r.conn, r.id,
                        Error{Errc::kernel_failed, fmt::format("kernel '{}' failed with code {}: {}", r.run.entry,
                                                               ctx.fail_code, ctx.fail_message)},
                        ctx.fail_code);
            return;
        }
        counters.results.fetch_add(1, std::memory_order_relaxed);
        reply(r.ep, r.conn, wire::encode_result(r.id, std::move(ctx.reply)));
    }

    void on_ep_error(ucp_ep_h ep, const Error& e) {
        if (connections.erase(ep)) spdlog::info("client went away: {}", e.message);
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
    install_kernel_guard();

    // 1. The JIT, linking kernels against the runtime, the curated libc subset and the
    //    operator's exports only.
    jit::JitOptions jo;
    jo.exports = runtime_exports();
    jo.exports.insert(jo.exports.end(), config.exports.begin(), config.exports.end());
    jo.opt_level = config.opt_level;
    jo.cache_dir = config.cache_dir;
    auto jit = jit::Jit::create(std::move(jo));
    if (!jit) return tl::make_unexpected(jit.error());
    impl->jit = std::move(*jit);

    // 2. Workers, then the engine whose progress thread hands them work.
    unsigned workers = config.workers ? config.workers : impl->topology.cores;
    impl->pool = std::make_unique<WorkerPool>(workers, config.worker_spin);

    // A restarted agent must be able to take its port back while the old connections sit in
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
    auto engine = Engine::create(eo, std::move(hooks));
    if (!engine) return tl::make_unexpected(engine.error());
    impl->engine = std::move(*engine);

    // 3. Listen before the thread starts, so a bad address fails start() itself.
    auto port = impl->engine->listen(config.host, config.port);
    if (!port) return tl::make_unexpected(port.error());
    impl->port = *port;
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
            for (auto& r : waiting) impl->reply_error(r->ep, r->conn, r->id, why);
        impl->compiling.clear();
    });
    impl_->engine->stop();
}

std::string Agent::address() const { return impl_->address(); }
std::uint16_t Agent::port() const { return impl_->port; }
std::vector<std::pair<std::string, std::uint64_t>> Agent::counters() const { return impl_->counter_values(); }

} // namespace bitship::agent
