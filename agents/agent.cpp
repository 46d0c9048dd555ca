#include "agent_impl.hpp"
#include "cuda_driver.hpp"

namespace bitship::agent {

bool Agent::Impl::begin_drain() {
    if (draining.exchange(true)) return false;
    // Checked on the progress thread, after any answer a finished kernel posted there.
    drain_waiter = std::thread([this] {
        constexpr auto kDrainPoll = std::chrono::milliseconds(10);
        // An answer is delivered when its send is done: a large one is a rendezvous the client
        // fetches. A client that never fetches holds the exit up to this long.
        constexpr auto kDeliveryWait = std::chrono::seconds(10);
        std::optional<Clock::time_point> answered; // when the last call was answered
        while (!stopped.load()) {
            std::promise<bool> idle;
            auto answer = idle.get_future();
            engine->post([this, &idle] {
                idle.set_value(pool->idle() && compiling.empty() && completing.empty() && gpu_compiling.empty());
            });
            if (answer.wait_for(std::chrono::seconds(1)) != std::future_status::ready) continue;
            if (answer.get()) {
                if (!answered) answered = Clock::now();
                if (engine->sends_in_flight() == 0) break;
                if (Clock::now() - *answered >= kDeliveryWait) {
                    spdlog::warn("drain: {} answer(s) not delivered after {} s; exiting without them",
                                 engine->sends_in_flight(),
                                 std::chrono::duration_cast<std::chrono::seconds>(kDeliveryWait).count());
                    break;
                }
            }
            std::this_thread::sleep_for(kDrainPoll);
        }
        // A send is done when the last of it left this process, not when the client has it: over
        // shared memory a large answer's last fragments may still wait in the client's FIFO, and
        // a client that sees this process gone first fails the answer as a reset (CI saw it
        // once in a few dozen runs, a group's 100 KB answer under ASan on two cores). A short
        // linger lets a client that is progressing at all take it.
        constexpr auto kLinger = std::chrono::milliseconds(100);
        for (auto end = Clock::now() + kLinger; !stopped.load() && Clock::now() < end;) std::this_thread::sleep_for(kDrainPoll);
        if (stopped.load()) return;
        spdlog::info("drained: every call in flight is answered");
        if (config.on_drained) config.on_drained();
    });
    return true;
}

Agent::Agent(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Agent::~Agent() { stop(); }

Result<std::unique_ptr<Agent>> Agent::start(const AgentConfig& config) {
    auto impl = std::make_unique<Impl>();
    impl->config = config;
    impl->topology = detect_topology(config.role);
    impl->instance = std::random_device{}() | (static_cast<std::uint64_t>(std::random_device{}()) << 32);
    for (const auto& [name, fn] : config.native_kernels) impl->natives.emplace(name, fn);
    if (config.peers.size() > 0xffff) return fail(Errc::invalid_argument, "at most 65535 --peer entries");
    if (config.self_index >= static_cast<int>(config.peers.size()))
        return fail(Errc::invalid_argument, fmt::format("self index {} is outside the {} configured peers", config.self_index,
                                                        config.peers.size()));
    install_kernel_guard();
    if (auto trust = set_up_trust(*impl); !trust) return tl::make_unexpected(trust.error());

    // 1. The sandbox (its arena holds regions and kernel data), then the JIT, linking kernels
    //    against the runtime (checked, under sfi), the curated libc subset and the operator's
    //    exports only.
    SandboxConfig sc;
    sc.mode = config.sandbox;
    sc.kernel_heap_mib = config.kernel_heap_mib;
    sc.arena_log2 = config.sandbox_arena_log2;
    sc.max_args = config.limits.max_args;
    sc.canary = config.sandbox_canary;
    // Workers, plus whichever thread leads progress and runs what it received.
    sc.threads = (config.workers ? config.workers : impl->topology.cores) + 2;
    auto sandbox = KernelSandbox::create(sc);
    if (!sandbox) return tl::make_unexpected(sandbox.error());
    impl->sandbox = std::move(*sandbox);
    if (auto* arena = impl->sandbox->arena()) {
        const std::size_t slot = std::max<std::size_t>(config.limits.max_args, 1);
        if (const auto slots = ArgsLanding::slots_for(sc.threads, slot); slots > 0) {
            auto landing = ArgsLanding::create(*arena, slots, slot);
            if (landing)
                impl->args_landing = std::move(*landing);
            else
                spdlog::warn("xagent: large arguments will be copied into each call's buffer: {}", landing.error().describe());
        }
    }
    jit::JitOptions jo;
    jo.exports = runtime_exports();
    jo.exports.insert(jo.exports.end(), config.exports.begin(), config.exports.end());
    impl->sandbox->configure(jo);
    jo.opt_level = config.opt_level;
    jo.cache_dir = config.cache_dir;
    jo.tiers = config.jit_tiers;
    jo.cache_mib = config.cache_mib;
    jo.cache_disk_mib = config.cache_disk_mib;
    jo.compiler = config.compiler;
    auto jit = jit::Jit::create(std::move(jo));
    if (!jit) return tl::make_unexpected(jit.error());
    impl->jit = std::move(*jit);
    // LLVM's one-time set-up now, not in the first caller's cold ship.
    if (auto warm = impl->jit->warm_up(); !warm) spdlog::warn("JIT warm-up: {}", warm.error().describe());
    // A restart's warm start: what ran here before is linked again behind the agent's start.
    impl->jit->preload(config.cache_preload);

    // 3. The engine. A restarted agent must be able to take its port back while the old connections sit in
    // TIME_WAIT (SO_REUSEADDR); an operator's own UCX_CM_REUSEADDR still wins.
    setenv("UCX_CM_REUSEADDR", "y", 0);
    EngineOptions eo;
    eo.transport = config.transport;
    eo.mode = config.progress;
    eo.spin = config.spin;
    eo.max_message = config.limits.max_message;
    eo.loopback_only = config.loopback_only;
    eo.inflight = {config.per_connection, config.all_connections};
    auto* raw = impl.get();
    EngineHooks hooks;
    hooks.on_message = [raw](Incoming&& in) { raw->on_message(std::move(in)); };
    hooks.on_bad_message = [raw](ucp_ep_h ep, std::uint64_t id, const Error& e) { raw->on_bad_message(ep, id, e); };
    hooks.on_ep_error = [raw](ucp_ep_h ep, const Error& e) { raw->on_ep_error(ep, e); };
    hooks.on_conn_request = [raw](ucp_conn_request_h r) { raw->on_conn_request(r); };
    // A plain RUN's arguments only: a window's, a group's and a GPU launch's are read elsewhere.
    if (auto* landing = impl->args_landing.get())
        hooks.land_args = [landing](const wire::Header& h, std::size_t bytes) -> std::optional<Landing> {
            if (h.type != wire::Type::run || h.flags != 0) return std::nullopt;
            return landing->take(bytes);
        };
    if (config.kernel_timeout.count() > 0) {
        hooks.on_watch = [] { check_kernel_budgets(); };
        hooks.watch_needed = [] { return kernels_running(); };
    }
    auto engine = Engine::create(eo, std::move(hooks));
    if (!engine) return tl::make_unexpected(engine.error());
    impl->engine = std::move(*engine);
    auto memory = config.region_memory;
    if (memory == AgentConfig::RegionMemory::automatic)
        memory = config.transport == Transport::tcp ? AgentConfig::RegionMemory::private_pages : AgentConfig::RegionMemory::shared;
    // Over TCP alone no client can map a window: none are made.
    const std::size_t window_bytes = config.transport == Transport::tcp ? 0 : config.bulk_window_mib << 20;
    impl->windows = std::make_unique<BulkWindows>(*impl->engine, window_bytes, config.bulk_windows_max);
    impl->regions = std::make_unique<RegionTable>(*impl->engine, memory == AgentConfig::RegionMemory::shared
                                                                     ? Engine::RegionMemory::shared
                                                                     : Engine::RegionMemory::private_pages,
                                                   impl->sandbox->arena());

    // 2. Workers: an idle one leads progress unless the operator said no.
    unsigned workers = config.workers ? config.workers : impl->topology.cores;
    impl->pool = std::make_unique<WorkerPool>(workers, config.worker_spin, config.workers_lead ? impl->engine.get() : nullptr);
    impl->pool->on_thread_start([sandbox = impl->sandbox.get()] { sandbox->prepare_thread(); });
    impl->compile_pool = std::make_unique<WorkerPool>(config.compiler.processes, std::chrono::microseconds{0});

    // 4. Regions from the command line, before anyone can connect; the GPUs and their regions.
    for (const auto& [name, size] : config.regions) {
        auto r = impl->regions->create(name, size);
        if (!r) return tl::make_unexpected(r.error());
    }
    if (auto gpus = impl->open_gpus(); !gpus) return tl::make_unexpected(gpus.error());

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
    impl->control = ControlContext{impl->address(), impl->instance, impl->topology, impl->pool->size(), Clock::now(),
                                   impl->jit.get(), &impl->kernel_stats, [raw] { return raw->begin_drain(); },
                                   trust_summary(*impl->gate), impl->cuda_summary,
                                   [box = impl->sandbox.get()] { return box->summary(); }};
    spdlog::info("xagent: sandbox: {}", impl->sandbox->summary());
    spdlog::info("xagent: cuda: {}", impl->control.cuda);
    // Its rate is measured here (1 ms), not on the first call.
    spdlog::debug("xagent: kernel runs timed by {}", CycleClock::uses_tsc() ? "the time-stamp counter" : "steady_clock");
    impl->pool->start();
    impl->compile_pool->start();
    impl->engine->start();
    return std::unique_ptr<Agent>(new Agent(std::move(impl)));
}

void Agent::stop() {
    if (!impl_ || impl_->stopped.exchange(true)) return;
    // A compile under way ends now (shutting_down): a hostile slice may take its whole CPU limit.
    impl_->jit->stop_compiles();
    // Running kernels get a moment to finish (WorkerPool::kStopGrace); past it they are stopped,
    // the GPU ones by the end of their GPU process, so a kernel that never returns (no kernel
    // timeout) cannot hold the agent's exit. Queued ones are answered.
    auto left = impl_->pool->stop(WorkerPool::kStopGrace, [impl = impl_.get()] {
        for (auto& gpu : impl->gpus) gpu->abort();
    });
    if (!left.empty()) spdlog::info("{} queued jobs dropped at shutdown", left.size());
    // The compile jobs under way end (stop_compiles above), their calls answered shutting_down
    // (as the queued ones are below).
    impl_->compile_pool->stop();
    impl_->engine->post([impl = impl_.get()] {
        Error why{Errc::shutting_down, "agent is shutting down"};
        for (auto* map : {&impl->compiling, &impl->completing}) {
            for (auto& [hash, waiting] : *map)
                for (auto& r : waiting) impl->answer_error(*r, why);
            map->clear();
        }
        for (auto& [key, waiting] : impl->gpu_compiling)
            for (auto& r : waiting) impl->answer_error(*r, why);
        impl->gpu_compiling.clear();
    });
    impl_->engine->stop();
    impl_->regions->clear();
    impl_->windows->clear();
    if (impl_->drain_waiter.joinable()) impl_->drain_waiter.join();
}

std::string Agent::address() const { return impl_->address(); }
std::uint16_t Agent::port() const { return impl_->port; }
wire::KernelStatsReply Agent::kernel_stats() const { return impl_->kernel_stats.snapshot(); }
wire::Fields Agent::info(std::vector<std::string>& storage) const { return info_fields(impl_->control, storage); }
void Agent::set_peers(std::vector<std::string> peers, int self_index) {
    // config.peers is read by whoever progresses: changed there, between two messages.
    std::promise<void> done;
    impl_->engine->post([impl = impl_.get(), &peers, self_index, &done] {
        impl->config.peers = std::move(peers);
        impl->config.self_index = self_index;
        done.set_value();
    });
    done.get_future().wait();
}
std::vector<std::pair<std::string, std::uint64_t>> Agent::counters() const { return impl_->counter_values(); }
AgentAccess Agent::access() const { return impl_->gate->access(); }

} // namespace bitship::agent
