#pragma once
// xagent's core: accepts clients, answers HELLO with what this host is, and runs shipped
// kernels. The progress thread decodes and routes; compiles and kernels run on the worker pool.
//
//   auto agent = Agent::start(config);     // listening when this returns
//   fmt::print("{}\n", (*agent)->address());
//   ...                                    // until SIGINT/SIGTERM
//   (*agent)->stop();

#include <chrono>
#include <cstdint>
#include <functional>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <bitship/capabilities.hpp>
#include <bitship/errc.hpp>
#include <bitship/identity.hpp>
#include <bitship/transport.hpp>

#include "jit.hpp"
#include "core/inflight_limits.hpp"
#include "core/wire.hpp"

namespace bitship::agent {

struct AgentConfig {
    std::string host = "127.0.0.1";
    std::uint16_t port = 0; ///< 0 picks a free port
    Transport transport = Transport::any;
    ProgressMode progress = ProgressMode::spin_then_block;
    std::chrono::microseconds spin = kDefaultSpin;
    unsigned workers = 0; ///< 0: one per core
    /// How long an idle worker polls its queue before sleeping.
    std::chrono::microseconds worker_spin{0};
    /// An idle worker takes over progress, so calls reach a worker without a wake-up.
    bool workers_lead = true;
    std::filesystem::path cache_dir;
    unsigned opt_level = 2;
    unsigned jit_tiers = 2;         ///< jit::JitOptions::tiers
    std::size_t cache_mib = 0;      ///< jit::JitOptions::cache_mib (0: unbounded)
    std::size_t cache_disk_mib = 0; ///< jit::JitOptions::cache_disk_mib (0: unbounded)
    /// At start, link this many of cache_dir's objects (most recently used first) in the
    /// background, so the first call to code run before a restart finds it ready (Jit::preload).
    std::size_t cache_preload = 64;
    /// Where shipped bitcode is compiled: confined bitship-compiler processes by default.
    jit::CompilerOptions compiler = [] {
        jit::CompilerOptions c;
        c.mode = jit::CompilerMode::process;
        return c;
    }();
    std::chrono::milliseconds kernel_timeout{10000};
    wire::Limits limits;
    /// What one connection may make this agent hold: its messages not yet answered (queued,
    /// compiling, running) and its answers not yet delivered. Past either, its new messages are
    /// refused with Errc::busy before their payload is received (xagent --max-inflight-calls,
    /// --max-inflight-mib); other connections are not affected. 0: no limit.
    InflightLimits per_connection{256ull << 20, 16384};
    /// The same across all connections together (xagent --total-inflight-calls,
    /// --total-inflight-mib). Past it, new messages are refused with Errc::busy, except one of
    /// up to 64 KiB from a connection that holds nothing (so a flood by some does not starve the
    /// rest). 0: no limit.
    InflightLimits all_connections{1ull << 30, 65536};
    /// Connections to this agent open at once, other agents' forwarding links among them
    /// (xagent --max-connections); past it, new ones are refused and the caller's connect fails
    /// saying so. With the in-flight limits it bounds what connections make the agent hold.
    /// 0: no limit.
    std::size_t max_connections = 1024;
    /// A connection that has not finished its handshake (HELLO, and AUTH where keys are asked
    /// for) this long after it was accepted is closed when another one comes (xagent
    /// --handshake-timeout-ms). 0: never.
    std::chrono::milliseconds handshake_timeout{10000};
    bool loopback_only = false;
    /// Symbols the operator exports to kernels on purpose, beyond the runtime and libc subset.
    std::vector<jit::Export> exports;
    /// Memory regions made at start ("NAME=SIZE" parsed), registered for RDMA.
    std::vector<std::pair<std::string, std::size_t>> regions;
    /// Run the bundles' nvptx64 slices on the GPUs the CUDA driver lists (found with dlopen at
    /// start; an agent without one runs none and says why).
    bool gpus = true;
    std::string cuda_library = "libcuda.so.1";
    /// The program that holds each GPU's context (bitship-gpu, gpu_process.hpp); empty: the one
    /// beside this program.
    std::filesystem::path gpu_program;
    /// GPU modules kept loaded per GPU, with their PTX (GpuProcess::Options::max_modules): past
    /// it the least recently launched is unloaded.
    std::size_t gpu_modules = 64;
    /// GPU regions made at start ("NAME=SIZE@gpuN"): device memory only GPU kernels see.
    struct GpuRegion {
        std::string name;
        std::uint64_t size = 0;
        unsigned device = 0;
    };
    std::vector<GpuRegion> gpu_regions;
    /// What backs regions: shared memory lets same-host clients read them by direct loads
    /// (ucp_rkey_ptr); private memory gets transparent huge pages where shared memory may not.
    /// Default: shared when the transport includes shared memory.
    enum class RegionMemory { automatic, private_pages, shared } region_memory = RegionMemory::automatic;
    /// The agents kernels may forward to when a call ships no peer table of its own
    /// ("host:port", the same ordered list on every agent), and this agent's index in it
    /// (-1: find our own listen address in the list).
    std::vector<std::string> peers;
    int self_index = -1;
    /// Native (pre-compiled) kernels the operator installs, run like shipped ones: the
    /// baseline shipped code is compared against. Called by RUNs with an all-zero hash.
    std::vector<std::pair<std::string, bs_entry_fn>> native_kernels;
    /// Called (from a helper thread) once a drain (xctl drain) answered every call in flight;
    /// xagent then exits as on SIGTERM.
    std::function<void()> on_drained;
    /// What kind of node this is, by the operator's word (xagent --role); unset: detected.
    std::optional<NodeKind> role;
    /// Authorized keys file (xagent --authorized-keys; SSH-style, see <bitship/identity.hpp>):
    /// clients must authenticate with one of its keys, and shipped code must be signed by one.
    /// Empty: no keys, which start() allows only on a loopback address unless `insecure`.
    std::filesystem::path authorized_keys;
    /// Accept anyone who reaches a non-loopback address, with no keys (xagent --insecure).
    bool insecure = false;
    /// This agent's secret key file, presented to peer agents it forwards to (empty: none; a
    /// peer with authorized keys then refuses its forwards).
    std::filesystem::path identity;
    /// How shipped kernels are confined (xagent --sandbox): sfi by default; none for operators
    /// who trust their code and want the last percent.
    SandboxMode sandbox = SandboxMode::sfi;
    /// Under sfi: each call's kernel heap quota, MiB (xagent --kernel-heap-mib), and the
    /// arena's size as a power of two (xagent --sandbox-arena-gib).
    std::size_t kernel_heap_mib = 64;
    unsigned sandbox_arena_log2 = 36;
    /// A canary page outside the arena whose state INFO reports (tests; xagent --sandbox-canary).
    bool sandbox_canary = false;
    /// Each same-host client's bulk window, MiB (xagent --bulk-window-mib; 0: none): shared
    /// memory its calls' large arguments and results pass through (agents/bulk_windows.hpp).
    std::size_t bulk_window_mib = 16;
    /// At most this many sessions hold a window at once; later ones use UCX's path.
    std::size_t bulk_windows_max = 64;
};

/// Whether `host` is a loopback address (127.0.0.0/8, ::1, localhost).
bool is_loopback_host(std::string_view host);

class Agent {
public:
    static Result<std::unique_ptr<Agent>> start(const AgentConfig& config);
    ~Agent();
    /// Stops accepting work, finishes running kernels, answers queued ones with
    /// shutting_down, closes every connection. Idempotent.
    void stop();
    /// "host:port" actually bound.
    [[nodiscard]] std::string address() const;
    [[nodiscard]] std::uint16_t port() const;
    /// Replaces the operator's peer table and this agent's index in it (a PMIx launch learns
    /// them only once every agent listens). Takes effect for RUNs that arrive after it.
    void set_peers(std::vector<std::string> peers, int self_index);
    /// Per-kernel and per-client statistics (xctl stats, metrics).
    [[nodiscard]] wire::KernelStatsReply kernel_stats() const;
    /// INFO's fields (xctl info, metrics); the views point into `storage`.
    [[nodiscard]] wire::Fields info(std::vector<std::string>& storage) const;
    /// Counter name → value.
    [[nodiscard]] std::vector<std::pair<std::string, std::uint64_t>> counters() const;
    /// SIGHUP: reads the authorized keys file again. The new set is in force for messages that
    /// arrive after this returns; sessions of removed keys can make no more calls. On error
    /// (unreadable file, malformed line: the message names it) the old set stays. Returns the
    /// number of keys now authorized.
    Result<std::size_t> reload_authorized_keys();
    /// How clients are admitted: open, keys or insecure.
    [[nodiscard]] AgentAccess access() const;

    struct Impl;

private:
    explicit Agent(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

} // namespace bitship::agent
