#pragma once
// xagent's private parts, shared by the files that implement Agent:
//   agent.cpp       start, stop, counters
//   sessions.cpp    client connections: HELLO/WELCOME, pings, stats, regions, answers
//   dispatch.cpp    RUN: code cache, compiles, running kernels, their outcomes
//   forwarding.cpp  calls a kernel forwards to peer agents, and answers to a caller's reply-to
//   trust.cpp       who may call (AUTH, SIGHUP's new keys) and whose code may run (signatures)
//   gpu_calls.cpp   GPU RUNs (PTX compiles, launches) and GPU region reads and writes
// Everything marked "whoever progresses" is touched by one thread at a time: the engine's
// own, or a worker leading progress.

#include "agent.hpp"

#include <bitship/identity.hpp>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "core/bulk_window.hpp"
#include "core/engine.hpp"
#include "args_landing.hpp"
#include "bulk_windows.hpp"
#include "control.hpp"
#include "gpu_process.hpp"
#include "core/held_count.hpp"
#include "code_signatures.hpp"
#include "cycle_clock.hpp"
#include "kernel_guard.hpp"
#include "kernel_stats.hpp"
#include "last_call.hpp"
#include "load_gauge.hpp"
#include "log_limiter.hpp"
#include "kernel_sandbox.hpp"
#include "regions.hpp"
#include "runtime.hpp"
#include "session_gate.hpp"
#include "slice_siblings.hpp"
#include "topology.hpp"
#include "worker_pool.hpp"

namespace bitship::agent {

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

// A RUN in flight: the payload that `run`'s spans point into travels with it, and goes back
// to `payload_home` (the engine's ReceiveBuffers) when the request is done with.
struct RunRequest {
    // Provided (not defaulted), so make_shared does not zero the whole request before the
    // member initialisers run (every member has one).
    RunRequest() {}
    RunRequest(const RunRequest&) = delete;
    RunRequest& operator=(const RunRequest&) = delete;
    ~RunRequest() {
        if (payload_home) payload_home->give_back(std::move(payload));
    }
    ucp_ep_h ep = nullptr;
    std::uint64_t conn = 0; ///< the connection's id, so a reply never reaches a reused ep
    std::uint64_t id = 0;   ///< this hop's request id (NEED_CODE answers it)
    std::vector<std::byte> payload;
    std::shared_ptr<ReceiveBuffers> payload_home;
    /// The landing slot run.args lie in (args_landing.hpp), when they landed: held until this
    /// is let go, then wiped.
    std::shared_ptr<void> args_home;
    Hold hold; ///< the connection's share of AgentConfig::per_connection, until this is let go
    wire::Run run;
    /// The session's bulk window when the RUN uses it (run.window): held until answered.
    std::shared_ptr<BulkWindow> window;
    /// Arguments copied out of the window, where no sandbox call buffer copies them.
    std::vector<std::byte> window_args;
    /// A GPU call whose module was unloaded to make room before it ran is loaded again once.
    bool gpu_reloaded = false;
    /// The kernel's stats slot once a worker looked it up (else the answer looks it up).
    KernelStats::KernelSlot* stats = nullptr;
};

/// A kernel this long pays the engine's thread's wake-up (a few µs) to keep the agent answering
/// while it runs; a shorter one keeps the token's hand-off free.
inline constexpr std::uint64_t kLongKernelNs = 100'000;
/// GPU region reads this large or more are answered from the GPU process's window (no copy in
/// the agent) when a read slot is free; smaller ones cost less copied into the message.
inline constexpr std::uint64_t kWindowReadMin = 64 << 10;
/// log_limiter's key for refused connections (no connection has this id).
inline constexpr std::uint64_t kRefusedConnections = ~std::uint64_t{0};
/// run_sandboxed's `started` for a kernel on a pool worker: the engine's watchdog looks at it.
inline void wake_watchdog(void* engine) { static_cast<Engine*>(engine)->wake_watch(); }

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
    /// For a peer of another architecture: the whole bundle, whose slice for the peer `hash`
    /// now names (agents/slice_siblings.hpp). Null: the code is the compiled slice's own.
    std::shared_ptr<const std::vector<std::byte>> sibling_bundle;
};

// A connection this agent made to a peer agent, to forward to.
struct Link {
    std::string address;
    ucp_ep_h ep = nullptr;
    bool welcomed = false;
    std::string triple;       ///< the peer's, from its WELCOME
    std::set<CodeHash> known; ///< hashes sent over this link
    std::vector<std::uint64_t> queued; ///< forwarded ids waiting for WELCOME (and AUTH's ACK)
    std::uint64_t auth_request = 0;    ///< our AUTH awaiting the peer's ACK (0: none)
};

#define BITSHIP_AGENT_COUNTERS(X)                                                                  \
    X(connections) X(runs) X(results) X(errors) X(need_code_sent) X(code_received)                 \
    X(code_bytes_received) X(compiles) X(compile_failures) X(cache_hits) X(disk_loads)             \
    X(malformed_messages) X(kernel_failures) X(kernel_crashes) X(kernel_timeouts) X(pings)           \
    X(forwards) X(forwards_local) X(code_forwarded) X(native_runs) X(unauthorized)                  \
    X(last_compile_verify_ns) X(last_compile_parse_ns) X(last_compile_optimise_ns)                  \
    X(last_compile_codegen_ns) X(last_compile_link_ns) X(last_compile_tier)                         \
    X(window_args) X(landed_args) X(window_results) X(partial_compiles) X(left_out_calls)                          \
    X(gpu_runs) X(gpu_compiles) X(gpu_compile_failures) X(gpu_reads) X(gpu_window_reads) X(gpu_writes) \
    X(last_gpu_ptx_ns) X(last_gpu_load_ns) X(group_runs) X(group_calls) X(busy_refusals) X(refused_connections) X(handshake_timeouts)

struct Counters {
#define X(name) std::atomic<std::uint64_t> name{0};
    BITSHIP_AGENT_COUNTERS(X)
#undef X
};

/// trust.cpp: the access mode, authorized keys, identity and signature table from the config;
/// fails (naming the file, or the address) where the config is not safe to start with.
Result<void> set_up_trust(Agent::Impl& impl);
/// INFO's "trust" field: "keys (3 authorized; signed code only)", "open (loopback)", ...
std::string trust_summary(const SessionGate& gate);

/// "host:port" split; port 0 when missing or invalid.
std::pair<std::string, std::uint16_t> split_host_port(std::string_view a);


struct Agent::Impl {
    AgentConfig config;
    std::unique_ptr<KernelSandbox> sandbox; // before the JIT and regions, which live in its arena
    /// Large arguments land in its arena (sfi), where kernels read them; before the engine,
    /// which receives into it. Null without a sandbox, or when it could not be had.
    std::unique_ptr<ArgsLanding> args_landing;
    std::unique_ptr<jit::Jit> jit;
    std::unique_ptr<Engine> engine;
    std::unique_ptr<RegionTable> regions;
    std::unique_ptr<BulkWindows> windows; // whoever progresses
    /// The GPUs this agent runs kernels on (gpu_calls.cpp), by ordinal; before the pool, whose
    /// jobs use them. Fixed after start.
    std::vector<std::unique_ptr<GpuProcess>> gpus;
    std::string cuda_summary; ///< the driver and its GPUs, or why there are none (INFO, errors)
    std::unique_ptr<WorkerPool> pool;
    /// Compiles of CPU code (PTX: gpu_calls.cpp): threads of their own, one per compile that may run at once,
    /// so that a compile's milliseconds (mostly a wait for the compiler process) never hold a
    /// worker that runs kernels. With one worker, a cached call would wait out every compile.
    std::unique_ptr<WorkerPool> compile_pool;
    Topology topology;
    SliceSiblings siblings; // bundles' other slices, for forwards across architectures
    std::uint16_t port = 0;
    std::uint64_t instance = 0;
    Counters counters;
    std::atomic<bool> stopped{false};
    KernelStats kernel_stats;
    LoadGauge load_gauge; ///< kernels running now: stamped, with the pool's queue, on every RESULT and ERROR
    ControlContext control;
    std::atomic<bool> draining{false};
    std::thread drain_waiter;
    LogLimiter log_limiter; // whoever progresses
    std::map<std::string, bs_entry_fn, std::less<>> natives;
    std::unique_ptr<SessionGate> gate; // whoever progresses
    CodeSignatures signatures;         // whoever progresses
    std::optional<Identity> identity;  // what this agent presents to peers it forwards to

    // Touched only by whoever progresses (engine thread or leading worker), one at a time.
    std::unordered_map<ucp_ep_h, std::uint64_t> connections;
    /// Connections whose handshake is not done (HELLO, and AUTH where keys are asked for):
    /// when each was accepted, and whether its HELLO came. Closed past
    /// AgentConfig::handshake_timeout when a new connection comes, so connections that never
    /// finish cannot keep --max-connections full.
    struct Handshake {
        Clock::time_point since;
        bool hello = false;
    };
    std::unordered_map<ucp_ep_h, Handshake> handshaking;
    std::uint64_t next_conn = 1;
    std::uint64_t next_forward_id = 1;
    /// Bumped whenever `connections` or `link_by_ep` change.
    std::uint64_t routes_generation = 0;
    LastSender last_sender;     ///< last_call.hpp: what the next call skips looking up
    LastAdmitted last_admitted;
    LastEntry last_entry;
    // Requests waiting for a compile of their hash that is already under way: a first compile
    // (which may hold only the kernel its call named), and one of the slice whole, started by a
    // call whose kernel the first left out. Apart, because the first one's code may already be
    // cached (found by new calls) before its waiting calls are run: a call it left out must
    // then wait for the whole slice, not for the first compile's end.
    using WaitingCalls = std::unordered_map<CodeHash, std::vector<std::shared_ptr<RunRequest>>, CodeHashHasher>;
    WaitingCalls compiling;
    WaitingCalls completing;
    /// `completing` for a compile of the whole slice, else `compiling`.
    WaitingCalls& waiting_for(bool whole) { return whole ? completing : compiling; }
    // The same for GPU code, by (hash, GPU): a PTX compile and module load under way.
    std::map<std::pair<CodeHash, unsigned>, std::vector<std::shared_ptr<RunRequest>>> gpu_compiling;
    std::map<std::string, Link> links;
    std::unordered_map<ucp_ep_h, std::string> link_by_ep;
    std::unordered_map<std::uint64_t, Forwarded> forwarded;
    std::unordered_map<std::uint64_t, std::shared_ptr<const jit::CompiledCode>> forwarded_code;
    std::deque<std::uint64_t> forwarded_order;
    std::map<std::vector<std::byte>, ucp_ep_h> reply_eps; ///< caller worker address → ep
    std::unordered_map<ucp_ep_h, std::vector<std::byte>> reply_ep_address;

    std::string address() const { return fmt::format("{}:{}", config.host, port); }

    std::uint64_t conn_of(ucp_ep_h ep) const {
        auto it = connections.find(ep);
        return it == connections.end() ? 0 : it->second;
    }

    std::vector<std::pair<std::string, std::uint64_t>> counter_values() const {
        std::vector<std::pair<std::string, std::uint64_t>> out;
#define X(name) out.emplace_back(#name, counters.name.load(std::memory_order_relaxed));
        BITSHIP_AGENT_COUNTERS(X)
#undef X
        // The JIT's background work, read when asked: whoever times calls can wait for it.
        if (jit) {
            out.emplace_back("tier_ups_pending", jit->tier_ups_pending());
            out.emplace_back("tier_ups", jit->tier_ups_finished());
            out.emplace_back("disk_preloads", jit->preloaded());
        }
        // Messages that came, or went, many to one (Engine::Cork).
        out.emplace_back("batches_received", engine->batches_received());
        out.emplace_back("batches_sent", engine->batches_sent());
        // Polling threads that moved off a core they shared with their peer (core_sharing.hpp).
        out.emplace_back("core_moves", engine->core_moves());
        // Long kernels that had the engine's thread progress while they ran (dispatch.cpp).
        out.emplace_back("progress_handovers", engine->progress_handovers());
        // What every connection together has at the agent now, against --total-inflight-*.
        const auto [held_bytes, held_messages] = engine->inflight_held();
        out.emplace_back("inflight_messages", held_messages);
        out.emplace_back("inflight_bytes", held_bytes);
        // Large RUNs received into a buffer an earlier one left (no zero-fill first).
        out.emplace_back("receive_buffers_reused", engine->receive_buffers()->reused());
        // GPU contexts recreated (in a new bitship-gpu process) after a fault, a kernel past its
        // time or the process's death (gpu_process.hpp).
        std::uint64_t resets = 0, evictions = 0;
        for (const auto& g : gpus) {
            resets += g->restarts();
            evictions += g->module_evictions();
        }
        out.emplace_back("gpu_context_resets", resets);
        // GPU modules unloaded to make room for others (xagent --gpu-modules).
        out.emplace_back("gpu_module_evictions", evictions);
        return out;
    }

    // sessions.cpp
    // One line per failed call, but a client repeating failures gets a few lines per window.
    void log_failure(std::uint64_t conn, std::uint64_t id, const Error& e);
    void reply(ucp_ep_h ep, std::uint64_t conn, wire::Encoded&& m);
    // The final answer of a call: to the sender at hop 0, to the caller's reply-to after a forward.
    void answer(const RunRequest& r, wire::Encoded&& m);
    void answer_error(const RunRequest& r, const Error& e, std::int32_t kernel_code = 0);
    void reply_error(ucp_ep_h ep, std::uint64_t conn, std::uint64_t id, const Error& e);
    void on_conn_request(ucp_conn_request_h request);
    void on_bad_message(ucp_ep_h ep, std::uint64_t id, const Error& e);
    void on_message(Incoming&& in);
    void on_ep_error(ucp_ep_h ep, const Error& e);
    // Closes connections past their handshake time: called as a connection comes, when their
    // places are wanted (a timer would wake an idle agent).
    void close_stale_handshakes();
    // Forgets client connection `ep` (its session, window and handshake); `why` is logged.
    void forget_connection(ucp_ep_h ep, std::string_view why);

    // trust.cpp
    // AUTH on connection `conn`: ACK, or ERROR unauthorized.
    void on_auth(ucp_ep_h ep, std::uint64_t conn, std::uint64_t id, const wire::Auth& auth);
    // A RUN of shipped code may go on when its code is signed by an author this agent
    // authorizes; otherwise it has been answered (NEED_CODE for the signed code, or ERROR).
    bool admit_code(const std::shared_ptr<RunRequest>& r);
    // A peer's WELCOME on a link: AUTH with this agent's identity when it asks for keys (true).
    bool authenticate_link(Link& link, const wire::Welcome& w);
    // The peer's answer to our AUTH: the link is up, or every forward queued on it fails.
    void on_link_auth_reply(Link& link, const wire::Message& reply);
    // The link is up: its queued forwards go.
    void on_link_session(Link& link);

    // agent.cpp
    // xctl drain: refuse RUNs from now on; once nothing is queued, compiling or running, the
    // operator's on_drained (xagent: exit).
    bool begin_drain();

    // dispatch.cpp
    // A RUN that names the session's bulk window: its arguments read from it, its result
    // slot checked. False when it was refused (and answered).
    bool take_window(RunRequest& r);
    // The final answer of a kernel that returned `reply`: in the call's window slot when
    // it offered one that holds it, else in the message.
    void answer_result(const RunRequest& r, std::vector<std::byte>&& reply);
    void on_run(std::shared_ptr<RunRequest> r);
    /// Queues `r` behind the compile of its hash under way, or starts one: of `held`'s slice
    /// when given (code that left r's kernel out), else of the code r carries, else from disk.
    void start_compile(std::shared_ptr<RunRequest> r, std::shared_ptr<const jit::CompiledCode> held);
    void on_compiled(const CodeHash& hash, bool whole, Result<std::shared_ptr<const jit::CompiledCode>> code);
    /// Runs `r` on `code`. `generation`: jit->cache_generation() read before `code` was found in
    /// the cache (kept with it as the last call's, LastEntry); kNoCacheGeneration when it was not.
    void run_compiled(std::shared_ptr<RunRequest> r, std::shared_ptr<const jit::CompiledCode> code,
                      std::uint64_t generation = kNoCacheGeneration);
    /// The code held for `hash` (jit->find), the last call's again when the cache's
    /// `generation` (read by the caller, before) is the one it was found in.
    std::shared_ptr<const jit::CompiledCode> cached_code(const CodeHash& hash, std::uint64_t generation);
    const Region* create_region_from_worker(const char* name, std::size_t size);
    void prepare_ctx(bs_ctx& ctx, const RunRequest& r);
    void record_run(KernelStats::KernelSlot* stats, const Runnable& what, Clock::duration took);
    void run_kernel(std::shared_ptr<RunRequest> r, Runnable what);
    /// run_guarded, with shipped code bound to the sandbox for the call (kernel_sandbox.hpp).
    /// The caller counts the kernel in load_gauge (LoadGauge::Running, or RunningLeader on the
    /// leading worker).
    std::optional<Error> run_sandboxed(const Runnable& what, bs_ctx& ctx, void (*started)(void*) = nullptr,
                                       void* started_arg = nullptr);
    void finish_kernel(const std::shared_ptr<RunRequest>& r, const std::shared_ptr<const jit::CompiledCode>& code,
                       const std::optional<Error>& stopped, bs_ctx& ctx);
    // Kernels a pool worker ran, waiting for whoever progresses to answer them. A worker that
    // finds the list empty posts one answer_finished(), which answers every kernel done by then
    // under one Engine::Cork: when the engine's thread, not a leading worker, took a Batch's
    // calls (it progressed while a kernel ran long), their answers still travel together.
    struct FinishedKernel {
        std::shared_ptr<RunRequest> r;
        std::shared_ptr<const jit::CompiledCode> code;
        std::optional<Error> stopped;
        bs_ctx ctx;
    };
    std::mutex finished_mutex;
    std::vector<FinishedKernel> finished;       ///< under finished_mutex
    std::vector<FinishedKernel> finished_spare; ///< whoever progresses: storage for the next list
    void queue_finished(FinishedKernel&& done); ///< a pool worker
    void answer_finished();                     ///< whoever progresses

    // call_groups.cpp
    // A RUN for a group of calls (wire::Each, Client::ship_each): every call run where
    // run_kernel runs one, each a call of its own, and one RESULT with all their answers.
    void run_group(std::shared_ptr<RunRequest> r, Runnable what);
    struct GroupRun {
        std::vector<std::byte> answers; ///< wire::EachResultsWriter's
        std::uint32_t failures = 0;
        std::optional<Error> first_failure; ///< logged, as a single call's failure is
        Clock::duration took{};
    };
    // Runs the group's calls one after another (on a worker, the token released).
    GroupRun run_calls(const RunRequest& r, const Runnable& what, KernelStats::KernelSlot* stats, void (*started)(void*),
                       void* started_arg);
    // With the token: counts, logs and sends the group's answers.
    void finish_group(const RunRequest& r, const Runnable& what, KernelStats::KernelSlot* stats, GroupRun&& done);

    // gpu_calls.cpp
    // At start: the CUDA driver (never linked), each GPU it lists, the GPU regions; what
    // WELCOME says of them. Fails naming a GPU region that cannot be made.
    Result<void> open_gpus();
    // A RUN for a GPU slice (RUN's kFlagGpu): launched when its module is loaded, else after
    // one PTX compile and load per (hash, GPU); NEED_CODE when the agent lacks the code.
    void on_gpu_run(std::shared_ptr<RunRequest> r);
    void on_gpu_compiled(const CodeHash& hash, unsigned device, const Result<void>& loaded);
    void launch_gpu(std::shared_ptr<RunRequest> r);
    // GPU_READ and GPU_WRITE: staged by a worker through the GPU's pinned buffers.
    void on_gpu_transfer(Incoming&& in, std::uint64_t conn, const wire::Message& msg);
    // forwarding.cpp
    // A peer of another architecture gets the hash of its own slice of the call's bundle (once
    // per forward). False when there is none: the caller has been told, the forward dropped.
    bool retarget_forward(const Link& link, std::uint64_t id, Forwarded& fw);
    // The endpoint to a caller's worker (the reply-to of a forwarded call), made on first use.
    ucp_ep_h reply_ep(std::span<const std::byte> address);
    void forward(const RunRequest& r, const std::shared_ptr<const jit::CompiledCode>& code, ForwardRequest f);
    // Keeps a forwarded RUN (and the code it may need) for NEED_CODE; drops old ones.
    void remember(std::uint64_t id, Forwarded fw, const std::shared_ptr<const jit::CompiledCode>& code);
    void forget(std::uint64_t id);
    // Tells the caller of a forwarded call that it failed (the forward never ran, or may not have).
    void tell_caller(const Forwarded& fw, Errc code, const std::string& message);
    void send_forward(Link& link, std::uint64_t id, bool with_code = false);
    Link& link_to(const std::string& address);
    void on_link_message(const std::string& address, Incoming&& in);
    void fail_link(Link& link, const Error& why);
};

} // namespace bitship::agent
