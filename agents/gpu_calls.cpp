// GPU calls: the agent's GPUs (found at start through the CUDA driver it opens with dlopen, each
// held by a bitship-gpu process: gpu_process.hpp),
// RUNs of nvptx64 slices (PTX made by the JIT's compiler, loaded once per GPU, launched by a
// worker) and GPU region reads and writes (staged by a worker through pinned host memory).
// A worker waits for its GPU call to finish (or to pass the kernel timeout); the answer is
// posted to whoever progresses, as for CPU kernels.
#include "agent_impl.hpp"
#include "cuda_driver.hpp"

#include <cctype>
#include <fstream>

namespace bitship::agent {
namespace {
// The NUMA node a PCI device sits near, as the kernel reports it (what hwloc's PCI discovery
// reads too; the agent's hwloc runs without it): -1 when unknown.
std::int32_t numa_node_of(std::string bus_id) {
    for (auto& c : bus_id) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    std::ifstream in("/sys/bus/pci/devices/" + bus_id + "/numa_node");
    int node = -1;
    if (bus_id.empty() || !(in >> node)) return -1;
    return node;
}
} // namespace

Result<void> Agent::Impl::open_gpus() {
    auto driver = load_cuda_driver(config.cuda_library);
    cuda_summary = describe(driver);
    // The sfi sandbox confines CPU code to the arena; a GPU kernel reaches all of its context's
    // device memory, the pinned staging buffers and, where the driver maps it (HMM), the
    // agent's host memory: running one would void the sandbox's promise.
    const bool confined = config.sandbox == SandboxMode::sfi;
    if (confined && !config.gpu_regions.empty())
        return fail(Errc::invalid_argument,
                    fmt::format("GPU region '{}': GPU kernels cannot be confined by --sandbox sfi (they reach all GPU "
                                "memory and, through the driver, host memory); start the agent with --sandbox none to "
                                "run GPU kernels", config.gpu_regions.front().name));
    if (driver && !config.gpus) cuda_summary += " (not used: --no-gpu)";
    else if (driver && confined) cuda_summary += " (not used: GPU kernels cannot be confined by --sandbox sfi)";
    if (driver && config.gpus && !confined && !driver->devices.empty()) {
        // Each GPU in a process of its own (gpu_process.hpp: the driver recovers from a fault
        // or a kernel that never returns only by the end of the process).
        auto program = GpuProcess::find_program(config.gpu_program);
        if (!program) cuda_summary += fmt::format(" (no GPU runs kernels: {})", program.error().message);
        for (const auto& d : program ? driver->devices : std::vector<CudaDevice>{}) {
            auto gpu = GpuProcess::start({*program, d.ordinal, config.cuda_library, config.gpu_modules});
            if (!gpu) { // later ordinals would shift: stop at the first that cannot be used
                spdlog::warn("xagent: GPU {} ({}) cannot run kernels: {}", d.ordinal, d.name, gpu.error().describe());
                cuda_summary += fmt::format(" (GPU {} unusable: {})", d.ordinal, gpu.error().message);
                break;
            }
            gpus.push_back(std::move(*gpu));
        }
    }
    for (const auto& g : config.gpu_regions) {
        if (g.device >= gpus.size())
            return fail(Errc::no_device, fmt::format("GPU region '{}' is for GPU {}, and this agent runs kernels on {} GPU(s): {}",
                                                     g.name, g.device, gpus.size(), cuda_summary));
        if (regions->find(g.name))
            return fail(Errc::invalid_argument, fmt::format("GPU region '{}' has the name of a host region", g.name));
        for (const auto& other : gpus)
            if (other->region(g.name) != std::nullopt)
                return fail(Errc::invalid_argument, fmt::format("GPU region '{}' is named twice", g.name));
        if (auto made = gpus[g.device]->add_region(g.name, g.size); !made)
            return fail(made.error().code, fmt::format("GPU region '{}' ({} bytes on GPU {}): {}", g.name, g.size, g.device,
                                                       made.error().message));
    }
    auto& caps = topology.caps;
    caps.gpus = static_cast<std::uint32_t>(gpus.size());
    caps.gpu_devices.clear();
    caps.gpu_regions.clear();
    for (const auto& g : gpus) {
        const auto& gpu = g->info();
        caps.gpu_devices.push_back(
            {gpu.name, gpu.sm, gpu.limits.multiprocessors, gpu.memory_bytes, numa_node_of(gpu.pci_bus_id)});
        for (const auto& r : g->regions())
            caps.gpu_regions.push_back({r.name, r.size, static_cast<std::uint32_t>(g->ordinal())});
    }
    return {};
}

void Agent::Impl::on_gpu_run(std::shared_ptr<RunRequest> r) {
    const auto& launch = *r->run.gpu;
    if (gpus.empty()) {
        answer_error(*r, Error{Errc::no_matching_slice, fmt::format("code {} is a GPU slice and this agent runs no GPU kernels: {}",
                                                                    to_hex(r->run.hash, 16), cuda_summary)});
        return;
    }
    if (launch.device >= gpus.size()) {
        answer_error(*r, Error{Errc::no_device, fmt::format("the call asks for GPU {}; this agent runs kernels on {}",
                                                            launch.device, gpus.size())});
        return;
    }
    if (launch.result_bytes > config.limits.max_result) {
        answer_error(*r, Error{Errc::too_large, fmt::format("a GPU result of {} bytes exceeds the limit of {}", launch.result_bytes,
                                                           config.limits.max_result)});
        return;
    }
    if (r->run.hops != 0) { // a client never sends this: GPU calls are not forwarded
        answer_error(*r, Error{Errc::invalid_argument, "a GPU call cannot arrive by a forward"});
        return;
    }
    auto& gpu = *gpus[launch.device];
    if (gpu.has_module(r->run.hash)) {
        add_held(counters.cache_hits);
        launch_gpu(std::move(r));
        return;
    }
    auto key = std::pair{r->run.hash, launch.device};
    if (auto it = gpu_compiling.find(key); it != gpu_compiling.end()) {
        it->second.push_back(std::move(r));
        return;
    }
    if (r->run.code.empty() && !jit->on_disk(r->run.hash)) {
        counters.need_code_sent.fetch_add(1, std::memory_order_relaxed);
        reply(r->ep, r->conn, wire::encode_need_code(r->id, r->run.hash));
        return;
    }
    if (!r->run.code.empty()) {
        counters.code_received.fetch_add(1, std::memory_order_relaxed);
        counters.code_bytes_received.fetch_add(r->run.code.size(), std::memory_order_relaxed);
    }
    gpu_compiling[key].push_back(r);
    // PTX is made where CPU code is compiled (a confined compiler process by default), then
    // the driver loads it: milliseconds, on a worker. Not on a compile thread, as CPU code is
    // (dispatch.cpp): with --gpu-modules below the modules in use, a load unloads another
    // module that calls were routed to, and in the workers' one queue those calls' launches
    // come before a later load; on a thread of its own the load overtook them more than once
    // (an ASan run failed a call so). Holding a routed call's module until it is launched
    // would lift this.
    bool queued = pool->submit([this, r, &gpu, device = launch.device] {
        engine->hand_over(); // others are answered while this worker waits for the compile
        auto began = Clock::now();
        auto ptx = jit->compile_ptx(r->run.code, r->run.hash, gpu.info().sm);
        auto compiled = Clock::now();
        Result<void> loaded = ptx ? gpu.load_module(r->run.hash, **ptx) : Result<void>(tl::make_unexpected(ptx.error()));
        auto ns = [](Clock::duration d) { return static_cast<std::uint64_t>(std::chrono::nanoseconds(d).count()); };
        if (loaded) { // the cold call's split: PTX from the compiler (or its cache), then the driver's load
            counters.last_gpu_ptx_ns.store(ns(compiled - began), std::memory_order_relaxed);
            counters.last_gpu_load_ns.store(ns(Clock::now() - compiled), std::memory_order_relaxed);
        }
        engine->post([this, hash = r->run.hash, device, loaded = std::move(loaded)] { on_gpu_compiled(hash, device, loaded); });
    });
    if (!queued) on_gpu_compiled(r->run.hash, launch.device, fail(Errc::shutting_down, "agent is shutting down"));
}

void Agent::Impl::on_gpu_compiled(const CodeHash& hash, unsigned device, const Result<void>& loaded) {
    auto node = gpu_compiling.extract(std::pair{hash, device});
    if (node.empty()) return;
    if (!loaded) {
        counters.gpu_compile_failures.fetch_add(1, std::memory_order_relaxed);
        for (auto& r : node.mapped()) answer_error(*r, loaded.error());
        return;
    }
    counters.gpu_compiles.fetch_add(1, std::memory_order_relaxed);
    spdlog::info("compiled {} to PTX and loaded it on GPU {} ({}, sm_{})", to_hex(hash, 16), device, gpus[device]->info().name,
                 gpus[device]->info().sm);
    for (auto& r : node.mapped()) launch_gpu(std::move(r));
}

void Agent::Impl::launch_gpu(std::shared_ptr<RunRequest> r) {
    bool queued = pool->submit([this, r] {
        const auto& launch = *r->run.gpu;
        auto& gpu = *gpus[launch.device];
        // A zero x asks for the kernel's declared geometry, else the device's default, per
        // grid and per block.
        GpuGeometry geometry = gpu.geometry_for(r->run.hash, r->run.entry);
        if (launch.grid[0] != 0) std::copy(launch.grid.begin(), launch.grid.end(), geometry.grid);
        if (launch.block[0] != 0) std::copy(launch.block.begin(), launch.block.end(), geometry.block);
        auto began = Clock::now();
        Result<Bytes> out = [&] {
            LoadGauge::Running running(load_gauge);
            // --kernel-timeout-ms 0 (never) waits as long as the GPU runs, in practice.
            const auto timeout = config.kernel_timeout.count() > 0 ? config.kernel_timeout
                                                                   : std::chrono::milliseconds(std::chrono::hours(24 * 365));
            return gpu.launch(r->run.hash, r->run.entry, r->run.args, launch.result_bytes, geometry, timeout);
        }();
        auto took = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - began).count();
        kernel_stats.on_run(kernel_stats.slot(r->run.hash, r->run.entry), static_cast<std::uint64_t>(took), nullptr, 0);
        engine->post([this, r, out = std::move(out)]() mutable {
            if (!out && out.error().code == Errc::code_missing && !r->gpu_reloaded) {
                // Its module was unloaded to make room (--gpu-modules) after the call was
                // routed: the call takes the first call's path again (compile, or NEED_CODE).
                r->gpu_reloaded = true;
                spdlog::debug("GPU kernel '{}' of {}: its module was unloaded before it ran; loading it again",
                              r->run.entry, to_hex(r->run.hash, 16));
                on_gpu_run(std::move(r));
                return;
            }
            counters.gpu_runs.fetch_add(1, std::memory_order_relaxed);
            if (!out) {
                if (out.error().code == Errc::kernel_timeout) counters.kernel_timeouts.fetch_add(1, std::memory_order_relaxed);
                if (out.error().code == Errc::kernel_crashed) counters.kernel_crashes.fetch_add(1, std::memory_order_relaxed);
                spdlog::warn("GPU kernel '{}' of {}: {}", r->run.entry, to_hex(r->run.hash, 16), out.error().message);
                answer_error(*r, Error{out.error().code, fmt::format("GPU kernel '{}': {}", r->run.entry, out.error().message)});
                return;
            }
            add_held(counters.results);
            answer_result(*r, std::move(*out));
        });
    });
    if (!queued) answer_error(*r, Error{Errc::shutting_down, "agent is shutting down"});
}

void Agent::Impl::on_gpu_transfer(Incoming&& in, std::uint64_t conn, const wire::Message& msg) {
    const bool is_read = in.header.type == wire::Type::gpu_read;
    const auto name = is_read ? std::get<wire::GpuRead>(msg.body).name : std::get<wire::GpuWrite>(msg.body).name;
    const auto offset = is_read ? std::get<wire::GpuRead>(msg.body).offset : std::get<wire::GpuWrite>(msg.body).offset;
    const auto id = in.header.request_id;
    GpuProcess* gpu = nullptr;
    for (const auto& g : gpus)
        if (g->region(name)) gpu = g.get();
    if (!gpu) {
        reply_error(in.ep, conn, id, Error{Errc::region_not_found, fmt::format("agent has no GPU region '{}'", name)});
        return;
    }
    if (is_read && std::get<wire::GpuRead>(msg.body).length > config.limits.max_result) {
        reply_error(in.ep, conn, id, Error{Errc::too_large, fmt::format("a read of {} bytes exceeds the limit of {} a call",
                                                                        std::get<wire::GpuRead>(msg.body).length,
                                                                        config.limits.max_result)});
        return;
    }
    // The job keeps the message (a write's bytes are a view into it).
    struct Transfer {
        Incoming in;
        std::string name;
        std::uint64_t offset = 0, length = 0;
        std::span<const std::byte> bytes;
    };
    auto t = std::make_shared<Transfer>();
    t->name = std::string(name);
    t->offset = offset;
    if (is_read) t->length = std::get<wire::GpuRead>(msg.body).length;
    else t->bytes = std::get<wire::GpuWrite>(msg.body).bytes; // stays valid: the payload's buffer moves with `in`
    t->in = std::move(in);
    bool queued = pool->submit([this, t, gpu, conn, is_read] {
        Result<Bytes> out = Bytes{};
        if (is_read) {
            // Answered from the GPU process's window, where the device put the bytes: no copy
            // here, and the read slot goes back once the send is done with it. A small read, or
            // one that finds every slot in use, is copied.
            auto leased = t->length >= kWindowReadMin ? gpu->read_in_window(t->name, t->offset, t->length)
                                                      : Result<std::optional<GpuProcess::WindowRead>>{};
            if (leased && *leased) {
                counters.gpu_window_reads.fetch_add(1, std::memory_order_relaxed);
                engine->post([this, t, conn, read = std::move(**leased)]() mutable {
                    counters.gpu_reads.fetch_add(1, std::memory_order_relaxed);
                    reply(t->in.ep, conn, wire::encode_result(t->in.header.request_id, read.bytes, std::move(read.lease)));
                });
                return;
            }
            out = leased ? gpu->read(t->name, t->offset, t->length) : tl::make_unexpected(leased.error());
        } else if (auto w = gpu->write(t->name, t->offset, t->bytes); !w) {
            out = tl::make_unexpected(w.error());
        }
        engine->post([this, t, conn, is_read, out = std::move(out)]() mutable {
            (is_read ? counters.gpu_reads : counters.gpu_writes).fetch_add(1, std::memory_order_relaxed);
            const auto id = t->in.header.request_id;
            if (!out) reply_error(t->in.ep, conn, id, out.error());
            else if (is_read) reply(t->in.ep, conn, wire::encode_result(id, std::move(*out)));
            else reply(t->in.ep, conn, wire::encode_ack(id, true, {}));
        });
    });
    if (!queued) reply_error(t->in.ep, conn, id, Error{Errc::shutting_down, "agent is shutting down"});
}

} // namespace bitship::agent
