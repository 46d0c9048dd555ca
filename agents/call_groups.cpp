// A group of calls (wire::Each, Client::ship_each): one RUN whose arguments hold `count` sets,
// the kernel run once per set, each run a call of its own (its own sandbox call, time budget
// and answer, as run_kernel makes one), and one RESULT with every call's answer. What a group
// saves is the per-message work: one decode, one code lookup, one admission, one answer. A call
// that runs past its budget is stopped and the calls after it are not run (each answered so):
// a group of hung calls holds a worker for one budget, not one per call. Once the agent drains
// or stops, the calls not yet started are not run either.
#include "agent_impl.hpp"

namespace bitship::agent {
namespace {
// The smallest answer a call can have (an error with an empty message): room the group keeps
// for each call not yet run, so every call gets an answer within max_result.
constexpr std::size_t kAnswerMin = 1 + 4 + 4 + 2;
constexpr std::size_t kResultHeader = 1 + 4;

void start_call(bs_ctx& ctx) {
    ctx.answered = false;
    ctx.failed = false;
    ctx.fail_code = 0;
    ctx.fail_message.clear();
    ctx.runtime_error.reset();
    ctx.forward.reset();
    ctx.reply.clear(); // its capacity stays for the next call
}

// A call's error, as finish_kernel tells one call's (none: it answered), counted where it counts.
std::optional<Error> outcome_of(Counters& counters, std::string_view entry, bs_ctx& ctx, std::optional<Error> stopped,
                                std::int32_t& kernel_code) {
    if (stopped) {
        auto& c = stopped->code == Errc::kernel_timeout ? counters.kernel_timeouts : counters.kernel_crashes;
        c.fetch_add(1, std::memory_order_relaxed);
        return Error{stopped->code, fmt::format("kernel '{}': {}", entry, stopped->message)};
    }
    if (ctx.runtime_error) return std::move(ctx.runtime_error);
    if (ctx.forward)
        return Error{Errc::invalid_argument, fmt::format("kernel '{}' forwarded, which a call of a group (Client::ship_each) cannot", entry)};
    if (ctx.failed) {
        counters.kernel_failures.fetch_add(1, std::memory_order_relaxed);
        kernel_code = ctx.fail_code;
        return Error{Errc::kernel_failed, fmt::format("kernel '{}' failed with code {}: {}", entry, ctx.fail_code, ctx.fail_message)};
    }
    return std::nullopt;
}
} // namespace

void Agent::Impl::run_group(std::shared_ptr<RunRequest> r, Runnable what) {
    const auto count = r->run.each->count;
    if (sizeof(std::uint32_t) + count * kAnswerMin > config.limits.max_result) {
        answer_error(*r, Error{Errc::too_large, fmt::format("a group of {} calls needs at least {} bytes of answers; this agent's "
                                                           "results are at most {} bytes",
                                                           count, sizeof(std::uint32_t) + count * kAnswerMin,
                                                           config.limits.max_result)});
        return;
    }
    counters.group_runs.fetch_add(1, std::memory_order_relaxed);
    counters.group_calls.fetch_add(count, std::memory_order_relaxed);
    auto* counted = kernel_stats.slot(r->run.hash, r->run.entry);
    if (WorkerPool::on_leading_worker()) {
        // As run_kernel: the worker that received the group runs it with the token released; a
        // group expected to run long wakes the engine's thread to progress meanwhile.
        WorkerPool::RunningHere running(*pool);
        const bool long_group = KernelStats::last_run_ns(counted) * count >= kLongKernelNs;
        GroupRun done;
        {
            LoadGauge::RunningLeader counted_load(load_gauge);
            engine->run_released([&] { done = run_calls(*r, what, counted, nullptr, nullptr); }, long_group);
        }
        finish_group(*r, what, counted, std::move(done));
        return;
    }
    bool queued = pool->submit([this, r, what, counted] {
        auto done = [&] {
            LoadGauge::Running counted_load(load_gauge);
            return run_calls(*r, what, counted, &wake_watchdog, engine.get());
        }();
        engine->post([this, r, what, counted, done = std::move(done)]() mutable { finish_group(*r, what, counted, std::move(done)); });
    });
    if (!queued) answer_error(*r, Error{Errc::shutting_down, "agent is shutting down"});
}

Agent::Impl::GroupRun Agent::Impl::run_calls(const RunRequest& r, const Runnable& what, KernelStats::KernelSlot* counted,
                                             void (*started)(void*), void* started_arg) {
    const auto& each = *r.run.each;
    const std::size_t stride = wire::each_stride(each.size);
    const std::size_t budget = config.limits.max_result;
    wire::EachResultsWriter out(each.count, std::size_t{each.count} * (kResultHeader + 8));
    GroupRun done;
    bs_ctx ctx;
    prepare_ctx(ctx, r);
    const auto began = Clock::now();
    std::optional<std::uint32_t> timed_out; // a call that ran past its budget: the rest do not run
    for (std::uint32_t i = 0; i < each.count; ++i) {
        // This call's answer may take what the calls after it leave free.
        const std::size_t room = budget - out.size() - kAnswerMin * (each.count - 1 - i);
        std::int32_t kernel_code = 0;
        std::optional<Error> failed;
        if (timed_out) {
            // One hung call costs the worker one budget, not one per call of the group.
            failed = Error{Errc::kernel_timeout, fmt::format("not run: call {} of the group ran past its budget", *timed_out)};
        } else if (stopped.load(std::memory_order_relaxed) || draining.load(std::memory_order_relaxed)) {
            // A drain, or a stop, waits for the calls in flight: the call running, not a
            // group's thousands still to start.
            failed = Error{Errc::shutting_down, stopped.load(std::memory_order_relaxed) ? "not run: the agent is shutting down"
                                                                                         : "not run: the agent is draining"};
        } else {
            start_call(ctx);
            ctx.args = r.run.args.subspan(i * stride, each.size);
            ctx.max_result = room - kResultHeader;
            auto stopped = run_sandboxed(what, ctx, started, started_arg);
            failed = outcome_of(counters, r.run.entry, ctx, std::move(stopped), kernel_code);
            if (failed && failed->code == Errc::kernel_timeout) timed_out = i;
        }
        if (!failed) {
            out.result(ctx.reply);
            continue;
        }
        ++done.failures;
        kernel_stats.on_error(counted, r.conn, failed->code);
        const auto& text = failed->message;
        out.error(failed->code, kernel_code, std::string_view(text).substr(0, std::min(text.size(), room - kAnswerMin)));
        if (!done.first_failure)
            done.first_failure = Error{failed->code, fmt::format("call {} of a group of {}: {}", i, each.count, text)};
    }
    done.took = Clock::now() - began;
    ctx.create_region = nullptr;
    done.answers = std::move(out).take();
    return done;
}

void Agent::Impl::finish_group(const RunRequest& r, const Runnable& what, KernelStats::KernelSlot* stats, GroupRun&& done) {
    const auto count = r.run.each->count;
    const auto mean = static_cast<std::uint64_t>(std::chrono::nanoseconds(done.took).count()) / count;
    kernel_stats.on_run(stats, mean, what.code.get(),
                        what.code ? static_cast<std::uint64_t>(what.code->stats().total_ms() * 1e6) : 0, count);
    // Bytes in: the calls' own arguments (not the padding between them); out: the answers.
    kernel_stats.on_calls(stats, r.conn, count, std::size_t{count} * r.run.each->size, done.answers.size());
    add_held(counters.results, count - done.failures);
    counters.errors.fetch_add(done.failures, std::memory_order_relaxed);
    if (done.first_failure) log_failure(r.conn, r.id, *done.first_failure);
    reply(r.ep, r.conn, wire::encode_result(r.id, std::move(done.answers)));
}

} // namespace bitship::agent
