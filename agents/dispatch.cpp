#include "agent_impl.hpp"
#include "core/coarse_clock.hpp"

namespace bitship::agent {

bool Agent::Impl::take_window(RunRequest& r) {
    const auto& use = *r.run.window;
    r.window = r.run.hops == 0 ? windows->find(r.conn) : nullptr;
    if (!r.window) {
        answer_error(r, Error{Errc::invalid_argument, "the RUN names a bulk window this session does not hold"});
        return false;
    }
    if (use.args_size > config.limits.max_args) {
        answer_error(r, Error{Errc::too_large, fmt::format("{} bytes of arguments exceed the limit of {}", use.args_size,
                                                          config.limits.max_args)});
        return false;
    }
    auto args = r.window->at(use.args_offset, use.args_size);
    auto slot = r.window->at(use.result_offset, use.result_capacity);
    if (!args || !slot) {
        answer_error(r, args ? slot.error() : args.error());
        return false;
    }
    // The client may write its window while the call runs: the arguments are copied once
    // before anyone reads them, by the sandbox into its call buffer (shipped code under sfi),
    // else here.
    if (use.args_size == 0) return true; // the arguments are in the message
    counters.window_args.fetch_add(1, std::memory_order_relaxed);
    if (sandbox->mode() == SandboxMode::sfi && r.run.hash != CodeHash{}) {
        r.run.args = *args;
    } else {
        r.window_args.assign(args->begin(), args->end());
        r.run.args = r.window_args;
    }
    return true;
}

void Agent::Impl::answer_result(const RunRequest& r, std::vector<std::byte>&& reply) {
    if (r.window && reply.size() >= kWindowResultMin && reply.size() <= r.run.window->result_capacity) {
        if (auto slot = r.window->at(r.run.window->result_offset, reply.size())) {
            std::memcpy(slot->data(), reply.data(), reply.size());
            counters.window_results.fetch_add(1, std::memory_order_relaxed);
            answer(r, wire::encode_window_result(0, {r.run.window->result_offset, reply.size()}));
            return;
        }
    }
    answer(r, wire::encode_result(0, std::move(reply)));
}

void Agent::Impl::on_run(std::shared_ptr<RunRequest> r) {
    add_held(counters.runs);
    if (draining.load(std::memory_order_relaxed)) {
        answer_error(*r, Error{Errc::shutting_down, "agent is draining: it takes no new calls"});
        return;
    }
    if (r->run.window && !take_window(*r)) return;
    if (r->run.peers.empty() && !config.peers.empty()) {
        // No table shipped: the operator's. It outlives every request (it is config).
        for (const auto& p : config.peers) r->run.peers.push_back(p);
        r->run.self_index = static_cast<std::uint16_t>(config.self_index);
    }
    // A group's calls each have their own arguments; the message limit bounds them together.
    const std::size_t call_args = r->run.each ? r->run.each->size : r->run.args.size();
    if (call_args > config.limits.max_args) {
        answer_error(*r, Error{Errc::too_large, fmt::format("{} bytes of arguments exceed the limit of {}", call_args,
                                                           config.limits.max_args)});
        return;
    }
    const bool native = r->run.hash == CodeHash{}; // (a library call to compare: once per call)
    if (native && r->run.gpu) {
        answer_error(*r, Error{Errc::invalid_argument, "a GPU call needs shipped code (native kernels run on the CPU)"});
        return;
    }
    if (native) { // an operator's native kernel
        auto it = natives.find(r->run.entry);
        if (it == natives.end()) {
            answer_error(*r, Error{Errc::entry_not_found, fmt::format("agent has no native kernel '{}'", r->run.entry)});
            return;
        }
        counters.native_runs.fetch_add(1, std::memory_order_relaxed);
        run_kernel(std::move(r), Runnable{nullptr, it->second});
        return;
    }
    if (!admit_code(r)) return; // trust.cpp: signed by an author this agent authorizes
    if (r->run.gpu) { // gpu_calls.cpp
        on_gpu_run(std::move(r));
        return;
    }
    if (!r->run.code.empty()) siblings.remember(r->run.hash, r->run.code);
    const auto generation = jit->cache_generation(); // before the lookup (LastEntry::generation)
    if (auto code = cached_code(r->run.hash, generation)) {
        add_held(counters.cache_hits);
        run_compiled(std::move(r), std::move(code), generation);
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
    start_compile(std::move(r), nullptr);
}

void Agent::Impl::start_compile(std::shared_ptr<RunRequest> r, std::shared_ptr<const jit::CompiledCode> held) {
    auto hash = r->run.hash;
    const bool whole = held != nullptr; // completing the slice `held` holds a part of
    auto [waiting, first] = waiting_for(whole).try_emplace(hash);
    waiting->second.push_back(r);
    if (!first) return; // it runs on the code of the compile under way
    // Compiling takes milliseconds: it runs on a compile thread, never while progressing UCX nor
    // on a worker that runs kernels (whoever leads progress goes on leading, and a cached call
    // meanwhile runs at once). The call's entry goes with it: a first compile makes that kernel
    // alone (Jit::compile).
    bool queued = compile_pool->submit([this, r, whole, held = std::move(held)] {
        auto code = held                   ? jit->compile(held->bundle(), r->run.hash, r->run.entry)
                    : !r->run.code.empty() ? jit->compile(r->run.code, r->run.hash, r->run.entry)
                                           : jit->load(r->run.hash);
        engine->post([this, hash = r->run.hash, whole, code = std::move(code)]() mutable {
            on_compiled(hash, whole, std::move(code));
        });
    });
    if (!queued) on_compiled(hash, whole, fail(Errc::shutting_down, "agent is shutting down"));
}

void Agent::Impl::on_compiled(const CodeHash& hash, bool whole, Result<std::shared_ptr<const jit::CompiledCode>> code) {
    auto node = waiting_for(whole).extract(hash);
    if (node.empty()) return;
    auto waiting = std::move(node.mapped());
    if (!code) {
        counters.compile_failures.fetch_add(1, std::memory_order_relaxed);
        for (auto& r : waiting) answer_error(*r, code.error());
        return;
    }
    counters.compiles.fetch_add(1, std::memory_order_relaxed);
    if ((*code)->partial()) counters.partial_compiles.fetch_add(1, std::memory_order_relaxed);
    const auto& s = (*code)->stats();
    if (s.from_disk) counters.disk_loads.fetch_add(1, std::memory_order_relaxed);
    auto ns = [](double ms) { return static_cast<std::uint64_t>(ms * 1e6); };
    counters.last_compile_verify_ns.store(ns(s.verify_ms), std::memory_order_relaxed);
    counters.last_compile_parse_ns.store(ns(s.parse_ms), std::memory_order_relaxed);
    counters.last_compile_optimise_ns.store(ns(s.optimise_ms), std::memory_order_relaxed);
    counters.last_compile_codegen_ns.store(ns(s.codegen_ms), std::memory_order_relaxed);
    counters.last_compile_link_ns.store(ns(s.link_ms), std::memory_order_relaxed);
    counters.last_compile_tier.store(s.tier, std::memory_order_relaxed);
    spdlog::info("compiled {} at tier {}{} for {} target-cpu={}: verify {:.2f} ms, parse {:.2f} ms, optimise {:.2f} ms, codegen {:.2f} ms, link {:.2f} ms",
                 to_hex(hash, 16), s.tier, s.from_object ? " (object from disk cache)" : s.from_disk ? " (from disk cache)" : "",
                 jit::host().triple, jit::host().cpu, s.verify_ms, s.parse_ms, s.optimise_ms, s.codegen_ms, s.link_ms);
    for (auto& r : waiting) run_compiled(std::move(r), *code);
}

std::shared_ptr<const jit::CompiledCode> Agent::Impl::cached_code(const CodeHash& hash, std::uint64_t generation) {
    // The last call's code, while the cache has changed nothing since: no lock, no lookup.
    if (last_entry.generation == generation && last_entry.hash == hash)
        if (auto code = last_entry.code.lock()) {
            code->touch(coarse_now_ns());
            return code;
        }
    return jit->find(hash);
}

void Agent::Impl::run_compiled(std::shared_ptr<RunRequest> r, std::shared_ptr<const jit::CompiledCode> code,
                               std::uint64_t generation) {
    if (last_entry.same_code(code) && r->run.entry == last_entry.entry) {
        last_entry.generation = generation;
        r->stats = last_entry.stats;
        const auto fn = last_entry.fn;
        run_kernel(std::move(r), Runnable{std::move(code), fn});
        return;
    }
    auto fn = code->entry(r->run.entry);
    if (!fn) {
        // The tier 0 made for another kernel of the slice: the slice is compiled whole.
        if (code->left_out(r->run.entry)) {
            counters.left_out_calls.fetch_add(1, std::memory_order_relaxed);
            spdlog::debug("call {}: kernel '{}' is left out of the tier-{} part of {}; the slice is compiled whole{}", r->id,
                          r->run.entry, code->stats().tier, to_hex(r->run.hash, 16),
                          completing.contains(r->run.hash) ? " (joining the compile under way)" : "");
            start_compile(std::move(r), std::move(code));
            return;
        }
        answer_error(*r, fn.error());
        return;
    }
    r->stats = kernel_stats.slot(r->run.hash, r->run.entry);
    last_entry.generation = generation;
    last_entry.hash = r->run.hash;
    last_entry.code = code;
    last_entry.entry = r->run.entry;
    last_entry.fn = *fn;
    last_entry.stats = r->stats;
    run_kernel(std::move(r), Runnable{std::move(code), *fn});
}

const Region* Agent::Impl::create_region_from_worker(const char* name, std::size_t size) {
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

void Agent::Impl::record_run(KernelStats::KernelSlot* stats, const Runnable& what, Clock::duration took) {
    kernel_stats.on_run(stats, static_cast<std::uint64_t>(std::chrono::nanoseconds(took).count()), what.code.get(),
                        what.code ? static_cast<std::uint64_t>(what.code->stats().total_ms() * 1e6) : 0);
}

void Agent::Impl::prepare_ctx(bs_ctx& ctx, const RunRequest& r) {
    ctx.args = r.run.args;
    ctx.args_landed = r.args_home != nullptr;
    ctx.max_result = config.limits.max_result;
    ctx.max_args = config.limits.max_args;
    ctx.run = &r.run;
    ctx.regions = regions.get();
    ctx.create_region = [this](const char* name, std::size_t size) { return create_region_from_worker(name, size); };
    // A single call's large result goes straight into the slot its RUN offered (a group's
    // results go together in one RESULT).
    if (r.window && r.run.window && !r.run.each)
        if (auto slot = r.window->at(r.run.window->result_offset, r.run.window->result_capacity))
            ctx.slot = *slot;
}

std::optional<Error> Agent::Impl::run_sandboxed(const Runnable& what, bs_ctx& ctx, void (*started)(void*), void* arg) {
    // Shipped code runs bound to its thread's area of the arena (under sfi); an operator's
    // native kernel (no code object) is its own and runs as it is.
    if (!what.code) return run_guarded(what.fn, &ctx, config.kernel_timeout, started, arg);
    if (auto entered = sandbox->enter(ctx); !entered) return entered.error();
    auto stopped = run_guarded(what.fn, &ctx, config.kernel_timeout, started, arg);
    sandbox->leave();
    return stopped;
}

void Agent::Impl::run_kernel(std::shared_ptr<RunRequest> r, Runnable what) {
    if (r->run.each) { // call_groups.cpp
        run_group(std::move(r), std::move(what));
        return;
    }
    if (WorkerPool::on_leading_worker()) {
        // The worker that received the RUN runs it and answers, with no hand-off to another
        // thread. It lets the progress token go while the kernel runs, so a long kernel has
        // the engine's thread take over progress within Engine::kTakeover.
        WorkerPool::RunningHere running(*pool);
        bs_ctx ctx;
        prepare_ctx(ctx, *r);
        std::optional<Error> stopped;
        const auto began = CycleClock::now();
        // No watchdog wake-up for a short kernel (it would cost more than the kernel runs): the
        // watchdog sees it within Engine::kDeepWait. A kernel whose last run was long wakes the
        // engine's thread to progress while it runs: without that, on TCP an emulated GET of this
        // agent's memory, or a ping, waits for the whole kernel (up to Engine::kTakeover).
        auto* counted = r->stats ? r->stats : kernel_stats.slot(r->run.hash, r->run.entry);
        r->stats = counted;
        const bool long_kernel = KernelStats::last_run_ns(counted) >= kLongKernelNs;
        {
            LoadGauge::RunningLeader counted_load(load_gauge);
            engine->run_released([&] { stopped = run_sandboxed(what, ctx); }, long_kernel);
        }
        const auto took = std::chrono::nanoseconds(CycleClock::ns_since(began));
        ctx.create_region = nullptr;
        finish_kernel(r, what.code, stopped, ctx);
        // After the answer left (not in its way): this thread reads the next message only after
        // this, so whoever asks for the stats next finds the run in them.
        record_run(counted, what, took);
        return;
    }
    bool queued = pool->submit([this, r, what = std::move(what)] {
        bs_ctx ctx;
        prepare_ctx(ctx, *r);
        const auto began = CycleClock::now();
        auto stopped = [&] {
            LoadGauge::Running counted_load(load_gauge);
            return run_sandboxed(what, ctx, &wake_watchdog, engine.get());
        }();
        if (!r->stats) r->stats = kernel_stats.slot(r->run.hash, r->run.entry);
        record_run(r->stats, what, std::chrono::nanoseconds(CycleClock::ns_since(began)));
        ctx.create_region = nullptr;
        queue_finished(FinishedKernel{std::move(r), what.code, std::move(stopped), std::move(ctx)});
    });
    if (!queued) answer_error(*r, Error{Errc::shutting_down, "agent is shutting down"});
}

void Agent::Impl::queue_finished(FinishedKernel&& done) {
    bool first;
    {
        std::lock_guard lock(finished_mutex);
        first = finished.empty();
        finished.push_back(std::move(done));
    }
    if (first) engine->post([this] { answer_finished(); });
}

void Agent::Impl::answer_finished() {
    // Taken out whole (a nested drain finds the spare empty and is right); the storage comes
    // back, so a steady stream of pool-run kernels allocates no list.
    auto done = std::move(finished_spare);
    {
        std::lock_guard lock(finished_mutex);
        finished.swap(done);
    }
    {
        Engine::Cork answers_together(*engine);
        for (auto& f : done) finish_kernel(f.r, f.code, f.stopped, f.ctx);
    }
    done.clear();
    finished_spare = std::move(done);
}

void Agent::Impl::finish_kernel(const std::shared_ptr<RunRequest>& r, const std::shared_ptr<const jit::CompiledCode>& code,
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
    add_held(counters.results);
    if (ctx.in_slot) {
        counters.window_results.fetch_add(1, std::memory_order_relaxed);
        answer(*r, wire::encode_window_result(0, {r->run.window->result_offset, ctx.in_slot}));
        return;
    }
    answer_result(*r, std::move(ctx.reply));
}
} // namespace bitship::agent
