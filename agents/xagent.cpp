// xagent: the resident agent that receives shipped kernels, JIT-compiles them for this host and
// runs them next to the data.

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <bit>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <tuple>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <bitship/peers.hpp>

#include "agent.hpp"
#include "chase.hpp"
#include "jit.hpp"
#include "core/memory_reuse.hpp"
#include "metrics.hpp"
#include "pmix_launch.hpp"
#include "regions.hpp"

namespace {

using namespace bitship;

// Written to a temporary file and renamed, so a script polling for it never reads half a port.
bool write_port_file(const std::filesystem::path& path, std::uint16_t port) {
    auto tmp = path;
    tmp += fmt::format(".tmp{}", getpid());
    {
        std::ofstream out(tmp);
        out << port << "\n";
        if (!out) return false;
    }
    std::error_code ec;
    std::filesystem::rename(tmp, path, ec);
    return !ec;
}

Result<std::pair<std::string, std::uint16_t>> parse_host_port(std::string_view option, const std::string& value) {
    auto colon = value.rfind(':');
    if (colon == std::string::npos || colon == 0)
        return fail(Errc::invalid_argument, fmt::format("{} '{}' is not HOST:PORT", option, value));
    try {
        std::size_t used = 0;
        auto port = std::stoul(value.substr(colon + 1), &used);
        if (port > 65535 || used != value.size() - colon - 1) throw std::out_of_range("port");
        return std::pair{value.substr(0, colon), static_cast<std::uint16_t>(port)};
    } catch (const std::exception&) {
        return fail(Errc::invalid_argument, fmt::format("{} '{}' has no valid port (0..65535)", option, value));
    }
}

std::string host_name() {
    char name[256] = {};
    if (gethostname(name, sizeof name - 1) != 0) return "localhost";
    return name;
}

} // namespace

int main(int argc, char** argv) {
    CLI::App app{"xagent: runs kernels shipped by bitship clients, JIT-compiled for this host.\n"
                 "Kernels link only against the kernel.h runtime and a curated libc/libm subset.\n"
                 "With --authorized-keys, only clients holding one of those keys may call, and only code signed by one\n"
                 "runs (make keys with: xctl key generate FILE). Without it, only loopback clients, unless --insecure.\n"
                 "SIGHUP re-reads --authorized-keys; SIGINT/SIGTERM stop the agent (kernels still running a second later\n"
                 "are stopped and answered shutting_down; `xctl drain` lets them finish instead)."};
    app.set_version_flag("--version", "xagent 0.1.0");
    std::string listen = "127.0.0.1:7000";
    std::string port_file, transport = "any", progress = "spin-then-block", log_level = "info", cache_dir;
    agent::AgentConfig config;
    unsigned spin_us = static_cast<unsigned>(config.spin.count());
    unsigned worker_spin_us = static_cast<unsigned>(config.worker_spin.count());
    unsigned timeout_ms = static_cast<unsigned>(config.kernel_timeout.count());
    std::uint64_t max_message = config.limits.max_message;
    std::uint32_t max_args = config.limits.max_args, max_result = config.limits.max_result;
    bool loopback = false;
    bool no_native = false;
    bool no_worker_progress = false;
    std::vector<std::string> region_specs;
    std::vector<std::string> peers;
    int self_index = -1;
    std::string peers_file;
    std::string role = "auto";

    std::string metrics;
    std::string authorized_keys, identity;
    bool insecure = false;
    app.set_config("--config", "", "read options from this TOML (or INI) file: one `name = value` per option, e.g. "
                                   "listen = \"0.0.0.0:7000\"; options given on the command line win");
    app.allow_config_extras(CLI::config_extras_mode::error); // a misspelt option in the file is an error, not ignored
    app.add_option("--listen", listen, "HOST:PORT to listen on; port 0 picks a free one and prints it")
        ->capture_default_str()->envname("BITSHIP_LISTEN");
    app.add_option("--port-file", port_file, "write the bound port to this file once listening");
    app.add_option("--transport", transport, "data transport: tcp, shm (shared memory; TCP makes the handshake) or any")
        ->check(CLI::IsMember({"tcp", "shm", "any"}))->capture_default_str()->envname("BITSHIP_TRANSPORT");
    app.add_option("--progress", progress, "how the thread progressing UCX waits: spin, block or spin-then-block")
        ->check(CLI::IsMember({"spin", "block", "spin-then-block"}))->capture_default_str();
    app.add_option("--spin-us", spin_us, "microseconds to poll after the last event before sleeping")->capture_default_str();
    app.add_option("--worker-spin-us", worker_spin_us, "microseconds an idle worker polls before sleeping")->capture_default_str();
    app.add_flag("--no-worker-progress", no_worker_progress,
                 "idle workers never take over progress: every call then wakes a worker from the progress thread");
    app.add_option("--workers", config.workers, "threads that run kernels (0: one per core; CPU code compiles on threads of its own, one per --compiler-processes)")
        ->capture_default_str()->envname("BITSHIP_WORKERS");
    app.add_option("--cache-dir", cache_dir, "keep compiled code here across restarts (default: memory only)")
        ->envname("BITSHIP_CACHE_DIR");
    app.add_option("--opt-level", config.opt_level, "JIT optimisation level")->check(CLI::Range(0, 3))->capture_default_str();
    app.add_option("--jit-tiers", config.jit_tiers, "2: new code compiled fast, then optimised in the background (code with writable globals, whose state must keep one copy, is optimised at once); 1: optimised at once")
        ->check(CLI::Range(1, 2))->capture_default_str();
    std::string compiler_mode = "process", compiler_path;
    unsigned compiler_cpu_s = static_cast<unsigned>(config.compiler.cpu_limit.count());
    app.add_option("--compiler", compiler_mode,
                   "where shipped bitcode is parsed, checked, optimised and compiled: process (bitship-compiler "
                   "processes, confined by seccomp and limited per compile, so no input can take the agent down) "
                   "or in-process (cheaper; for hosts without seccomp, and comparisons)")
        ->check(CLI::IsMember({"process", "in-process"}))->capture_default_str()->envname("BITSHIP_COMPILER");
    app.add_option("--compiler-path", compiler_path, "the bitship-compiler program (default: beside xagent)")
        ->envname("BITSHIP_COMPILER_PATH");
    app.add_option("--compiler-processes", config.compiler.processes, "compiles that may run at once, one process each")
        ->check(CLI::Range(1, 64))->capture_default_str();
    app.add_option("--compiler-cpu-s", compiler_cpu_s, "CPU seconds one compile may use; past them it fails with compile_failed")
        ->check(CLI::Range(1, 3600))->capture_default_str();
    app.add_option("--compiler-memory-mib", config.compiler.memory_mib,
                   "address space a compiler process may take beyond its start-up size, MiB")
        ->check(CLI::Range(64, 1 << 20))->capture_default_str();
    app.add_option("--cache-mib", config.cache_mib, "cap on compiled code in memory, MiB (0: unbounded)")
        ->capture_default_str()->envname("BITSHIP_CACHE_MIB");
    app.add_option("--cache-disk-mib", config.cache_disk_mib, "cap on --cache-dir, MiB (0: unbounded)")
        ->capture_default_str()->envname("BITSHIP_CACHE_DISK_MIB");
    app.add_option("--cache-preload", config.cache_preload,
                   "at start, link this many of --cache-dir's compiled objects (most recently used first) in the "
                   "background, while the memory cache is under half of --cache-mib (0: none)")
        ->capture_default_str();
    app.add_option("--kernel-timeout-ms", timeout_ms, "stop a kernel that runs longer than this, checked every 5 ms (0: never)")
        ->capture_default_str()->envname("BITSHIP_KERNEL_TIMEOUT_MS");
    app.add_option("--max-message", max_message, "largest message accepted, bytes")->capture_default_str();
    app.add_option("--max-args", max_args, "largest argument block, bytes")->capture_default_str();
    app.add_option("--max-result", max_result, "largest kernel reply, bytes")->capture_default_str();
    std::uint64_t inflight_calls = config.per_connection.messages, inflight_mib = config.per_connection.bytes >> 20;
    app.add_option("--max-inflight-calls", inflight_calls,
                   "messages one connection may have at this agent not yet answered (queued, compiling, running) "
                   "plus answers not yet delivered to it; past it, its new ones are refused at once with 'busy' "
                   "and other connections go on (0: no limit)")
        ->capture_default_str();
    app.add_option("--max-inflight-mib", inflight_mib,
                   "the same limit in bytes of those messages and answers, MiB (one message alone always fits: "
                   "--max-message bounds it; 0: no limit)")
        ->capture_default_str();
    std::uint64_t total_calls = config.all_connections.messages, total_mib = config.all_connections.bytes >> 20;
    app.add_option("--total-inflight-calls", total_calls,
                   "the same limit across all connections together; past it, new messages are refused with 'busy', "
                   "except one of up to 64 KiB from a connection that has nothing at the agent (0: no limit)")
        ->capture_default_str();
    app.add_option("--total-inflight-mib", total_mib,
                   "the limit across all connections in MiB of messages and answers (0: no limit)")
        ->capture_default_str();
    app.add_option("--max-connections", config.max_connections,
                   "connections open at once, other agents' forwarding links among them; past it, new ones are refused "
                   "and the caller's connect fails saying so (0: no limit)")
        ->capture_default_str();
    std::uint64_t handshake_ms = config.handshake_timeout.count();
    app.add_option("--handshake-timeout-ms", handshake_ms,
                   "a connection that has not finished its handshake (HELLO, and AUTH where keys are asked for) this long "
                   "after connecting is closed when another comes, so such connections cannot hold --max-connections "
                   "(0: never)")
        ->capture_default_str();
    app.add_option("--region", region_specs,
                   "allocate and register memory region NAME=SIZE (e.g. chase=1G), or NAME=SIZE@gpuN in GPU N's memory "
                   "(read and written through the agent; only GPU kernels see it; needs --sandbox none); repeatable");
    bool no_gpu = false;
    app.add_flag("--no-gpu", no_gpu,
                 "run no GPU kernels even where the CUDA driver (libcuda.so.1, found at run time) lists GPUs; by default, "
                 "under --sandbox none, every GPU it lists runs the bundles' nvptx64 slices (sfi cannot confine GPU "
                 "kernels, so an sfi agent runs none)");
    std::string cuda_library = config.cuda_library;
    app.add_option("--cuda-library", cuda_library,
                   "the CUDA driver library to dlopen (a driver outside the loader's path; tests use a fake)")
        ->capture_default_str();
    std::string gpu_program;
    app.add_option("--gpu-program", gpu_program,
                   "the program that holds each GPU's CUDA context, one process per GPU, restarted after a GPU fault "
                   "or a kernel past its timeout (default: bitship-gpu beside xagent)");
    std::size_t gpu_modules = config.gpu_modules;
    app.add_option("--gpu-modules", gpu_modules,
                   "GPU modules (shipped GPU code, with its PTX) each GPU keeps loaded; past it the least recently "
                   "launched is unloaded, and a later call to it is compiled again")
        ->check(CLI::PositiveNumber)->capture_default_str();
    std::string region_memory = "auto";
    app.add_option("--region-memory", region_memory,
                   "what backs regions: shared (same-host clients read them by direct loads; huge pages only where the "
                   "kernel gives them to shared memory), private (transparent huge pages; clients use RDMA GET), or "
                   "auto (shared when the transport includes shared memory)")
        ->check(CLI::IsMember({"auto", "shared", "private"}))->capture_default_str();
    app.add_option("--peer", peers, "HOST:PORT of an agent kernels may forward to when a call ships no peer table; "
                                    "give the same ordered list, this agent included, to every agent; repeatable");
    app.add_option("--self", self_index, "this agent's index among --peer (default: find --listen's address there)");
    app.add_option("--peers-file", peers_file, "under a PMIx launcher (mpirun, srun --mpi=pmix): rank 0 writes every agent's "
                                              "address, rank, host, triple and GPU count here once all have met (standalone: this agent alone)")
        ->envname("BITSHIP_PEERS_FILE");
    app.add_option("--metrics", metrics, "serve Prometheus metrics at http://HOST:PORT/metrics")->envname("BITSHIP_METRICS");
    app.add_option("--role", role, "what this node is, as WELCOME tells clients: host, dpu, or auto (a DPU when a "
                                  "BlueField PCI function is seen from aarch64 cores)")
        ->check(CLI::IsMember({"auto", "host", "dpu"}))->capture_default_str();
    app.add_option("--authorized-keys", authorized_keys,
                   "SSH-style file of the public keys allowed to call this agent and to author the code it runs, one "
                   "'ed25519 BASE64 NAME' per line (# comments); re-read on SIGHUP")
        ->envname("BITSHIP_AUTHORIZED_KEYS");
    app.add_flag("--insecure", insecure,
                 "without --authorized-keys, accept anyone who reaches a non-loopback --listen address (refused "
                 "otherwise); said at start and in every WELCOME");
    app.add_option("--identity", identity, "this agent's secret key file, presented to peer agents it forwards to")
        ->envname("BITSHIP_IDENTITY");
    std::string sandbox = "sfi";
    std::size_t arena_gib = std::size_t{1} << (config.sandbox_arena_log2 - 30);
    app.add_option("--sandbox", sandbox,
                   "how shipped kernels are confined: sfi (every load and store kept inside the agent's arena; kernel "
                   "heap per call) or none (kernels reach all agent memory: only for code you trust)")
        ->check(CLI::IsMember({"sfi", "none"}))->capture_default_str();
    app.add_option("--kernel-heap-mib", config.kernel_heap_mib,
                   "under --sandbox sfi: what one call may hold from malloc, MiB; reclaimed when the call ends")
        ->check(CLI::Range(1, 1 << 20))->capture_default_str();
    app.add_option("--sandbox-arena-gib", arena_gib,
                   "under --sandbox sfi: the arena's address space, GiB, a power of two from 4 to 16384 (regions, kernel "
                   "data, stacks and heaps live in it)")
        ->check([](const std::string& v) -> std::string {
            unsigned long long n = 0;
            try { n = std::stoull(v); } catch (...) { return "not a number"; }
            if (n < 4 || n > 16384 || (n & (n - 1)) != 0) return "a power of two from 4 to 16384";
            return {};
        })->capture_default_str();
    app.add_option("--bulk-window-mib", config.bulk_window_mib,
                   "shared memory per same-host client session, MiB, that its calls' large arguments and results pass "
                   "through instead of UCX's copies (made when the client asks; 0: none)")
        ->check(CLI::Range(0, 4096))->capture_default_str();
    app.add_flag("--sandbox-canary", config.sandbox_canary,
                 "keep a canary page outside the arena and report its address and state in INFO (tests)")->group("");
    app.add_flag("--no-native", no_native, "do not pre-install the native xrdma handlers (chase)");
    app.add_flag("--loopback", loopback, "pin UCX to the loopback device (UCX_NET_DEVICES=lo) unless set already")
        ->envname("BITSHIP_LOOPBACK");
    app.add_option("--log-level", log_level, "trace, debug, info, warn, error or off")
        ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "off"}))->capture_default_str()
        ->envname("BITSHIP_LOG_LEVEL");
    CLI11_PARSE(app, argc, argv);

    config.region_memory = region_memory == "shared"    ? agent::AgentConfig::RegionMemory::shared
                           : region_memory == "private" ? agent::AgentConfig::RegionMemory::private_pages
                                                        : agent::AgentConfig::RegionMemory::automatic;
    auto logger = spdlog::stderr_color_mt("xagent");
    spdlog::set_default_logger(logger);
    spdlog::set_level(spdlog::level::from_str(log_level));
    spdlog::set_pattern("[%H:%M:%S.%e] [xagent %P] [%^%l%$] %v");

    auto listen_at = parse_host_port("--listen", listen);
    if (!listen_at) {
        std::cerr << "xagent: " << listen_at.error().message << "\n";
        return 2;
    }
    std::tie(config.host, config.port) = *listen_at;
    std::optional<std::pair<std::string, std::uint16_t>> metrics_at;
    if (!metrics.empty()) {
        auto m = parse_host_port("--metrics", metrics);
        if (!m) {
            std::cerr << "xagent: " << m.error().message << "\n";
            return 2;
        }
        metrics_at = *m;
    }
    config.on_drained = [] { kill(getpid(), SIGTERM); };
    config.transport = *parse_transport(transport);
    config.progress = *parse_progress_mode(progress);
    config.spin = std::chrono::microseconds(spin_us);
    config.kernel_timeout = std::chrono::milliseconds(timeout_ms);
    config.worker_spin = std::chrono::microseconds(worker_spin_us);
    config.cache_dir = cache_dir;
    config.compiler.mode = compiler_mode == "in-process" ? jit::CompilerMode::in_process : jit::CompilerMode::process;
    config.compiler.path = compiler_path;
    config.compiler.cpu_limit = std::chrono::seconds(compiler_cpu_s);
    config.limits = {max_message, max_args, max_result};
    config.per_connection = {inflight_mib << 20, inflight_calls};
    config.all_connections = {total_mib << 20, total_calls};
    config.handshake_timeout = std::chrono::milliseconds(handshake_ms);
    // Freed message buffers are kept for the next message instead of unmapped, in the one heap
    // that every thread allocates from (memory_reuse.hpp).
    keep_freed_memory(max_message);
    one_heap_for_all_threads();
    config.loopback_only = loopback;
    config.workers_lead = !no_worker_progress;
    config.peers = peers;
    config.self_index = self_index;
    config.authorized_keys = authorized_keys;
    config.insecure = insecure;
    config.sandbox = sandbox == "none" ? SandboxMode::none : SandboxMode::sfi;
    config.sandbox_arena_log2 = static_cast<unsigned>(std::countr_zero(arena_gib)) + 30;
    config.identity = identity;
    if (role != "auto") config.role = role == "dpu" ? NodeKind::dpu : NodeKind::host;
    for (const auto& spec : region_specs) {
        auto r = agent::parse_region_spec(spec);
        if (!r) {
            std::cerr << "xagent: --region: " << r.error().message << "\n";
            return 2;
        }
        if (r->gpu) config.gpu_regions.push_back({r->name, r->size, *r->gpu});
        else config.regions.emplace_back(r->name, r->size);
    }
    config.gpus = !no_gpu;
    config.cuda_library = cuda_library;
    config.gpu_program = gpu_program;
    config.gpu_modules = gpu_modules;
    if (!no_native)
        for (const auto& k : xrdma::native_kernels()) config.native_kernels.emplace_back(k.name, k.fn);

    // Every thread the agent starts inherits this mask, PMIx's own thread included (so it is
    // set before PMIx_Init); only sigwait below sees these signals.
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGTERM);
    sigaddset(&stop_signals, SIGHUP); // re-read --authorized-keys
    pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
    signal(SIGPIPE, SIG_IGN);

    // Declared before the agent, so PMIx_Finalize runs after the agent stopped, on every path.
    auto job = agent::PmixJob::init();
    if (!job) {
        spdlog::error("{}", job.error().describe());
        return 1;
    }
    if (!*job && agent::launcher_task_count() > 1)
        spdlog::warn("the launcher says this job has {} tasks but there is no PMIx (srun without --mpi=pmix?): this agent "
                     "runs alone and knows no peers",
                     agent::launcher_task_count());
    if (*job && (!peers.empty() || self_index >= 0)) {
        spdlog::error("--peer/--self and a PMIx launch both give the peer table: use one");
        return 2;
    }
    // Several agents of a job may share a node: unless told otherwise, each takes a free port.
    if (*job && app.count("--listen") == 0) config.port = 0;
    if (*job) {
        // The launcher gone (killed, node lost): stop as on SIGTERM instead of living on orphaned.
        auto lost = (*job)->on_launcher_lost([] {
            spdlog::warn("the launcher is gone (PMIx lost its connection): stopping");
            kill(getpid(), SIGTERM);
        });
        if (!lost) spdlog::warn("cannot watch the launcher: {}", lost.error().describe());
    }

    auto agent = agent::Agent::start(config);
    if (!agent) {
        spdlog::error("cannot start: {}", agent.error().describe());
        return 1;
    }
    const auto& host = jit::host();
    spdlog::info("listening on {} (transport {}, progress {}, {} workers, {} {} LLVM {}, cache {}, access {})",
                 (*agent)->address(), transport, progress, config.workers ? config.workers : 0, host.triple, host.cpu,
                 to_string(host.llvm), cache_dir.empty() ? "memory" : cache_dir, to_string((*agent)->access()));
    std::printf("xagent listening on %s\n", (*agent)->address().c_str());
    std::fflush(stdout);
    if (*job) {
        // Meet the other agents: one fence, then every agent knows the table in rank order.
        auto started = std::chrono::steady_clock::now();
        // Listening on every interface: peers reach us by host name.
        auto reachable = config.host == "0.0.0.0" ? fmt::format("{}:{}", host_name(), (*agent)->port()) : (*agent)->address();
        auto table = (*job)->exchange(PeerRecord{(*job)->rank(), reachable, host_name(), host.triple, 0});
        if (!table) {
            spdlog::error("cannot meet the other agents of the job: {}", table.error().describe());
            return 1;
        }
        std::vector<std::string> addresses;
        for (const auto& p : *table) addresses.push_back(p.address);
        (*agent)->set_peers(std::move(addresses), static_cast<int>((*job)->rank()));
        spdlog::info("rank {} of {} (PMIx namespace {}): met every agent in {:.1f} ms", (*job)->rank(), (*job)->size(),
                     (*job)->nspace(),
                     std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count());
        if ((*job)->rank() == 0 && !peers_file.empty()) {
            if (auto w = write_peers_file(peers_file, *table); !w) {
                spdlog::error("{}", w.error().describe());
                return 1;
            }
        }
    } else if (!peers_file.empty()) {
        // Standalone: a job of one, so tools can use the same file either way.
        if (auto w = write_peers_file(peers_file, {PeerRecord{0, (*agent)->address(), host_name(), host.triple, 0}}); !w) {
            spdlog::error("{}", w.error().describe());
            return 1;
        }
    }
    std::unique_ptr<agent::MetricsServer> metrics_server; // destroyed before the agent it reads
    if (metrics_at) {
        auto* served = agent->get();
        auto m = agent::MetricsServer::start(metrics_at->first, metrics_at->second,
                                             [served] { return agent::render_prometheus(*served); });
        if (!m) {
            spdlog::error("{}", m.error().describe());
            return 1;
        }
        metrics_server = std::move(*m);
        spdlog::info("metrics at http://{}:{}/metrics", metrics_at->first, metrics_server->port());
    }
    if (!port_file.empty() && !write_port_file(port_file, (*agent)->port())) {
        spdlog::error("cannot write --port-file {}", port_file);
        return 1;
    }

    int sig = 0;
    for (;;) {
        if (sigwait(&stop_signals, &sig) != 0) continue;
        if (sig != SIGHUP) break;
        auto reloaded = (*agent)->reload_authorized_keys();
        if (!reloaded) spdlog::error("SIGHUP: keeping the authorized keys in force: {}", reloaded.error().describe());
    }
    spdlog::info("{} received, shutting down", sig == SIGINT ? "SIGINT" : "SIGTERM");
    (*agent)->stop();
    spdlog::debug("agent stopped");
    for (const auto& [name, value] : (*agent)->counters())
        if (value) spdlog::info("  {} = {}", name, value);
    return 0;
}
