// xagent: the resident agent that receives shipped kernels, JIT-compiles them for this host and
// runs them next to the data.

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "agent.hpp"
#include "chase.hpp"
#include "jit.hpp"
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

} // namespace

int main(int argc, char** argv) {
    CLI::App app{"xagent: runs kernels shipped by bitship clients, JIT-compiled for this host.\n"
                 "Kernels link only against the kernel.h runtime and a curated libc/libm subset."};
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

    app.add_option("--listen", listen, "HOST:PORT to listen on; port 0 picks a free one and prints it")->capture_default_str();
    app.add_option("--port-file", port_file, "write the bound port to this file once listening");
    app.add_option("--transport", transport, "data transport: tcp, shm (shared memory; TCP makes the handshake) or any")
        ->check(CLI::IsMember({"tcp", "shm", "any"}))->capture_default_str();
    app.add_option("--progress", progress, "how the thread progressing UCX waits: spin, block or spin-then-block")
        ->check(CLI::IsMember({"spin", "block", "spin-then-block"}))->capture_default_str();
    app.add_option("--spin-us", spin_us, "microseconds to poll after the last event before sleeping")->capture_default_str();
    app.add_option("--worker-spin-us", worker_spin_us, "microseconds an idle worker polls before sleeping")->capture_default_str();
    app.add_flag("--no-worker-progress", no_worker_progress,
                 "idle workers never take over progress: every call then wakes a worker from the progress thread");
    app.add_option("--workers", config.workers, "threads that compile and run kernels (0: one per core)")->capture_default_str();
    app.add_option("--cache-dir", cache_dir, "keep compiled code here across restarts (default: memory only)");
    app.add_option("--opt-level", config.opt_level, "JIT optimisation level")->check(CLI::Range(0, 3))->capture_default_str();
    app.add_option("--jit-tiers", config.jit_tiers, "2: new code compiled fast, then optimised in the background; 1: optimised at once")
        ->check(CLI::Range(1, 2))->capture_default_str();
    app.add_option("--cache-mib", config.cache_mib, "cap on compiled code in memory, MiB (0: unbounded)")->capture_default_str();
    app.add_option("--cache-disk-mib", config.cache_disk_mib, "cap on --cache-dir, MiB (0: unbounded)")->capture_default_str();
    app.add_option("--kernel-timeout-ms", timeout_ms, "stop a kernel that runs longer than this, checked every 5 ms (0: never)")->capture_default_str();
    app.add_option("--max-message", max_message, "largest message accepted, bytes")->capture_default_str();
    app.add_option("--max-args", max_args, "largest argument block, bytes")->capture_default_str();
    app.add_option("--max-result", max_result, "largest kernel reply, bytes")->capture_default_str();
    app.add_option("--region", region_specs, "allocate and register memory region NAME=SIZE (e.g. chase=1G); repeatable");
    std::string region_memory = "auto";
    app.add_option("--region-memory", region_memory,
                   "what backs regions: shared (same-host clients read them by direct loads; huge pages only where the "
                   "kernel gives them to shared memory), private (transparent huge pages; clients use RDMA GET), or "
                   "auto (shared when the transport includes shared memory)")
        ->check(CLI::IsMember({"auto", "shared", "private"}))->capture_default_str();
    app.add_option("--peer", peers, "HOST:PORT of an agent kernels may forward to when a call ships no peer table; "
                                    "give the same ordered list, this agent included, to every agent; repeatable");
    app.add_option("--self", self_index, "this agent's index among --peer (default: find --listen's address there)");
    app.add_flag("--no-native", no_native, "do not pre-install the native xrdma handlers (chase)");
    app.add_flag("--loopback", loopback, "pin UCX to the loopback device (UCX_NET_DEVICES=lo) unless set already");
    app.add_option("--log-level", log_level, "trace, debug, info, warn, error or off")
        ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "off"}))->capture_default_str();
    CLI11_PARSE(app, argc, argv);

    config.region_memory = region_memory == "shared"    ? agent::AgentConfig::RegionMemory::shared
                           : region_memory == "private" ? agent::AgentConfig::RegionMemory::private_pages
                                                        : agent::AgentConfig::RegionMemory::automatic;
    auto logger = spdlog::stderr_color_mt("xagent");
    spdlog::set_default_logger(logger);
    spdlog::set_level(spdlog::level::from_str(log_level));
    spdlog::set_pattern("[%H:%M:%S.%e] [xagent %P] [%^%l%$] %v");

    auto colon = listen.rfind(':');
    if (colon == std::string::npos) {
        std::cerr << "xagent: --listen '" << listen << "' is not HOST:PORT\n";
        return 2;
    }
    config.host = listen.substr(0, colon);
    try {
        auto port = std::stoul(listen.substr(colon + 1));
        if (port > 65535) throw std::out_of_range("port");
        config.port = static_cast<std::uint16_t>(port);
    } catch (const std::exception&) {
        std::cerr << "xagent: --listen '" << listen << "' has no valid port (0..65535)\n";
        return 2;
    }
    config.transport = *parse_transport(transport);
    config.progress = *parse_progress_mode(progress);
    config.spin = std::chrono::microseconds(spin_us);
    config.kernel_timeout = std::chrono::milliseconds(timeout_ms);
    config.worker_spin = std::chrono::microseconds(worker_spin_us);
    config.cache_dir = cache_dir;
    config.limits = {max_message, max_args, max_result};
    config.loopback_only = loopback;
    config.workers_lead = !no_worker_progress;
    config.peers = peers;
    config.self_index = self_index;
    for (const auto& spec : region_specs) {
        auto r = agent::parse_region_spec(spec);
        if (!r) {
            std::cerr << "xagent: --region: " << r.error().message << "\n";
            return 2;
        }
        config.regions.emplace_back(r->name, r->size);
    }
    if (!no_native)
        for (const auto& k : xrdma::native_kernels()) config.native_kernels.emplace_back(k.name, k.fn);

    // Every thread the agent starts inherits this mask; only sigwait below sees these signals.
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
    signal(SIGPIPE, SIG_IGN);

    auto agent = agent::Agent::start(config);
    if (!agent) {
        spdlog::error("cannot start: {}", agent.error().describe());
        return 1;
    }
    const auto& host = jit::host();
    spdlog::info("listening on {} (transport {}, progress {}, {} workers, {} {} LLVM {}, cache {})", (*agent)->address(),
                 transport, progress, config.workers ? config.workers : 0, host.triple, host.cpu, to_string(host.llvm),
                 cache_dir.empty() ? "memory" : cache_dir);
    std::printf("xagent listening on %s\n", (*agent)->address().c_str());
    std::fflush(stdout);
    if (!port_file.empty() && !write_port_file(port_file, (*agent)->port())) {
        spdlog::error("cannot write --port-file {}", port_file);
        return 1;
    }

    int sig = 0;
    while (sigwait(&stop_signals, &sig) != 0) {
    }
    spdlog::info("{} received, shutting down", sig == SIGINT ? "SIGINT" : "SIGTERM");
    (*agent)->stop();
    for (const auto& [name, value] : (*agent)->counters())
        if (value) spdlog::info("  {} = {}", name, value);
    return 0;
}
