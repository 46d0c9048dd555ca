// The engine's progress and who leads it: one pass (UCX progress, what callbacks queued, the
// tick), spinning then sleeping on the worker's event fd, callers that lead while they wait
// (guests) and hand over to each other, and the engine's own thread, which leads when nobody
// else does and watches over a guest's long kernel. Endpoints and messages are engine.cpp.
#include "engine.hpp"

#include <poll.h>

#include <cerrno>
#include <thread>

namespace bitship {

int Engine::sleep_timeout_ms(bool engine_thread) const {
    // Owners with deadlines get a tick, a watcher its watch; the others sleep until something
    // happens.
    int timeout_ms = hooks_.on_tick ? static_cast<int>(kTick.count()) : -1;
    if (hooks_.on_watch && engine_thread) timeout_ms = static_cast<int>(kTakeover.count());
    return timeout_ms;
}

bool Engine::sleep_until_event(std::unique_lock<ProgressToken>& token, bool release_token, int timeout_ms) {
    // Counted, not flagged: the engine's thread (without the token) and a leading guest may
    // sleep at once, and one waking must not hide the other from post().
    sleepers_.fetch_add(1, std::memory_order_seq_cst);
    // A post() or a guest asking for the token that raced with us saw no sleeper and did not
    // signal: look once more (both sides store, then load, sequentially consistent).
    if (has_posted_.load(std::memory_order_seq_cst) || stopping_.load() ||
        (release_token && guests_.load(std::memory_order_seq_cst) > 0)) {
        sleepers_.fetch_sub(1, std::memory_order_seq_cst);
        return true;
    }
    auto s = ucp_worker_arm(worker_.get());
    if (s != UCS_OK) { // UCS_ERR_BUSY: events are pending, do not sleep
        sleepers_.fetch_sub(1, std::memory_order_seq_cst);
        return true;
    }
    pollfd pfd{event_fd_, POLLIN, 0};
    // The engine's own thread sleeps without the token, so a caller that wants to lead takes it
    // at once instead of waking this thread and waiting for it to let go.
    if (release_token) token.unlock();
    else guest_asleep_.store(true, std::memory_order_seq_cst);
    while (::poll(&pfd, 1, timeout_ms) < 0 && errno == EINTR) {
    }
    sleepers_.fetch_sub(1, std::memory_order_seq_cst);
    // core_sharing_ belongs to the token's holder (iterate).
    if (release_token) {
        if (!token.try_lock()) return false;
        core_sharing_.woke();
        return true;
    }
    core_sharing_.woke();
    // A leading guest woke: an engine thread waiting without a timeout for it resumes its watch
    // (this costs only calls after an idle spell, which pay a wake-up anyway).
    guest_asleep_.store(false, std::memory_order_seq_cst);
    if (deep_wait_.load(std::memory_order_seq_cst)) {
        std::lock_guard lock(guest_mutex_);
        guest_cv_.notify_all();
    }
    return true;
}

void Engine::watch(Clock::time_point now) {
    if (!hooks_.on_watch) return;
    if (now - last_watch_ < kTakeover) return;
    last_watch_ = now;
    hooks_.on_watch();
}

// One pass: UCX progress, then what the callbacks queued, then the tick. Token held.
bool Engine::iterate() {
    bool did = ucp_worker_progress(worker_.get()) != 0;
    did = drain() || did;
    // Reading the clock costs as much as a progress pass: passes read it every kClockEvery
    // only (deadlines and spin windows are far coarser than that). A busy pass that does not
    // read it makes the time since the last event read 0 until the next read, which stamps it.
    if (did) {
        last_event_ = now_;
        event_unclocked_ = true;
        if (++busy_passes_ % kClockEvery != 0) return true;
    } else if (++idle_passes_ % kClockEvery != 0) {
        return false;
    }
    auto now = Clock::now();
    now_ = now;
    if (event_unclocked_) {
        last_event_ = now;
        event_unclocked_ = false;
    }
    // Polling with nothing to do for a while, the thread lets any other runnable thread on its
    // core go first: on a host with few cores, what it waits for (a peer just woken, UCX's own
    // thread) may be queued behind it for a whole time slice. A woken peer is often put on the
    // waker's core (a sync wake-up) and, both polling and cache-hot, the scheduler moves
    // neither: a thread that keeps finding its core taken moves itself (yield_core,
    // core_sharing.hpp). With nothing else runnable, the yield returns at once; replies that
    // come within kYieldAfter never pay it.
    if (!did && now - last_event_ >= kYieldAfter) yield_core(now);
    if (now - last_tick_ >= kTick) {
        last_tick_ = now;
        if (hooks_.on_tick) hooks_.on_tick();
    }
    return did;
}

void Engine::yield_core(Clock::time_point now) {
    std::this_thread::yield();
    auto back = Clock::now();
    now_ = back;
    if (core_sharing_.yielded(back - now, back)) core_moves_.fetch_add(1, std::memory_order_relaxed);
}

bool Engine::should_sleep(Clock::duration idle) const {
    return options_.mode == ProgressMode::block || (options_.mode == ProgressMode::spin_then_block && idle >= options_.spin);
}

void Engine::lead_locked(std::unique_lock<ProgressToken>& token, FunctionRef<bool()> done, Clock::time_point until,
                         Clock::time_point now) {
    guest_leading_.store(true, std::memory_order_relaxed);
    last_event_ = now_ = now;
    while (!done() && !stopping_.load(std::memory_order_relaxed)) {
        if (iterate()) continue;
        if (done()) break;
        auto now = now_;
        if (now >= until) break;
        if (should_sleep(now - last_event_)) {
            int timeout_ms = sleep_timeout_ms(false);
            if (until != Clock::time_point::max()) {
                auto left = std::chrono::ceil<std::chrono::milliseconds>(until - now).count();
                timeout_ms = timeout_ms < 0 ? static_cast<int>(left) : std::min<int>(timeout_ms, static_cast<int>(left));
            }
            sleep_until_event(token, false, timeout_ms);
        }
    }
    guest_leading_.store(false, std::memory_order_relaxed);
}

void Engine::lead_until(FunctionRef<bool()> done) {
    guests_.fetch_add(1, std::memory_order_seq_cst);
    // No signal needed: the engine's thread never sleeps holding the token, and when awake it
    // sees guests_ within one pass.
    {
        std::unique_lock token(token_);
        lead_locked(token, done, Clock::time_point::max(), Clock::now());
    }
    // No wake-up for the engine's thread: most jobs take microseconds and this thread leads
    // again right after. If it does not come back, the engine's thread takes over within
    // kTakeover (a long kernel stalls progress at most that long).
    guests_.fetch_sub(1, std::memory_order_seq_cst);
}

bool Engine::acquire_as_guest(std::unique_lock<ProgressToken>& token) {
    // Called with guests_ already counting us. The engine's own thread lets go within one
    // pass once it sees a guest (and never sleeps holding the token); another guest leading
    // holds it until its own result is in, so we do not wait for it.
    for (unsigned spins = 0;; ++spins) {
        if (token.try_lock()) return true;
        if (guest_leading_.load(std::memory_order_relaxed) || guest_busy_.load(std::memory_order_relaxed) ||
            stopping_.load(std::memory_order_relaxed))
            return false;
        if (spins > 64) std::this_thread::yield();
    }
}

Engine::Lead Engine::try_lead_until(FunctionRef<bool()> done, Clock::time_point until, Clock::time_point now) {
    guests_.fetch_add(1, std::memory_order_seq_cst);
    Lead outcome = Lead::other_leader;
    {
        std::unique_lock token(token_, std::defer_lock);
        if (acquire_as_guest(token)) {
            lead_locked(token, done, until, now);
            outcome = Lead::led;
        }
    }
    guests_.fetch_sub(1, std::memory_order_seq_cst);
    leader_left();
    return outcome;
}

bool Engine::try_progress_once(FunctionRef<void()> fn) {
    guests_.fetch_add(1, std::memory_order_seq_cst);
    bool ran = false;
    {
        std::unique_lock token(token_, std::defer_lock);
        if (acquire_as_guest(token)) {
            fn();
            ran = true;
        }
    }
    guests_.fetch_sub(1, std::memory_order_seq_cst);
    return ran;
}

void Engine::poll_once() {
    if (ProgressToken::held_here()) return;
    // Only when nobody holds the token: whoever does (a waiting caller, or the engine's thread)
    // progresses already. Not counted as a guest, so the engine's thread, which may be asleep on
    // the event fd without the token, never goes into its deep wait for a poller.
    std::unique_lock token(token_, std::try_to_lock);
    if (token.owns_lock()) iterate();
}

void Engine::leader_left() {
    // Others waiting for a result that this leader was not waiting for may lead now.
    if (handoff_sleepers_.load(std::memory_order_seq_cst) == 0) return;
    std::lock_guard lock(handoff_mutex_);
    ++handoff_generation_;
    handoff_cv_.notify_all();
}

void Engine::wait_for_handoff(FunctionRef<bool()> done, Clock::time_point until) {
    std::unique_lock lock(handoff_mutex_);
    handoff_sleepers_.fetch_add(1, std::memory_order_seq_cst);
    auto generation = handoff_generation_;
    // Bounded: a completion notifies through notify_waiters(); the bound covers a leader
    // that left between our failed try and this wait.
    auto bound = std::min(until, Clock::now() + kHandoffCheck);
    handoff_cv_.wait_until(lock, bound, [&] {
        return done() || handoff_generation_ != generation ||
               (!guest_leading_.load(std::memory_order_seq_cst) && !guest_busy_.load(std::memory_order_seq_cst));
    });
    handoff_sleepers_.fetch_sub(1, std::memory_order_seq_cst);
}

void Engine::run_released(FunctionRef<void()> fn, bool hand_over) {
    // guest_leading_ always describes whoever holds the token: not us while we run. Only the
    // token's holder writes it: a load and a store, no locked instruction.
    bool was_leading = guest_leading_.load(std::memory_order_relaxed);
    guest_leading_.store(false, std::memory_order_relaxed);
    // No wake-up of a deeply waiting engine thread: most kernels take microseconds, and waking
    // it costs the call more than the kernel. It looks at least every kDeepWait.
    guest_busy_.store(true, std::memory_order_seq_cst);
    token_.unlock();
    if (hand_over) {
        // Flagged before the wake-up: an engine thread not yet asleep sees the flag and skips
        // its wait (wake_watch() only reaches one already waiting).
        handover_wanted_.store(true, std::memory_order_seq_cst);
        handovers_.fetch_add(1, std::memory_order_relaxed);
        wake_watch();
    }
    fn();
    handover_wanted_.store(false, std::memory_order_relaxed);
    guest_busy_.store(false, std::memory_order_release);
    // The engine's thread may have taken over meanwhile: it lets go once it sees us back.
    if (sleepers_.load(std::memory_order_seq_cst) > 0) ucp_worker_signal(worker_.get());
    token_.lock();
    guest_leading_.store(was_leading, std::memory_order_relaxed);
}

void Engine::wake_watch() noexcept {
    if (!deep_wait_.load(std::memory_order_seq_cst)) return;
    std::lock_guard lock(guest_mutex_);
    watch_wanted_.store(true);
    guest_cv_.notify_all();
}

void Engine::hand_over() noexcept {
    // The engine's thread waits on guest_cv_ while a guest leads; woken with none left (guests_
    // is 0), it takes the token. Its deep waits check guests_ before they begin (under this
    // lock): a hand-over just before one is not lost.
    std::lock_guard lock(guest_mutex_);
    guest_cv_.notify_all();
}

void Engine::notify_waiters() {
    if (handoff_sleepers_.load(std::memory_order_seq_cst) == 0) return;
    std::lock_guard lock(handoff_mutex_);
    handoff_cv_.notify_all();
}

void Engine::run() {
    while (!stopping_.load(std::memory_order_relaxed)) {
        if (guests_.load(std::memory_order_seq_cst) == 0) {
            std::unique_lock token(token_, std::try_to_lock);
            if (token.owns_lock()) {
                while (!stopping_.load(std::memory_order_relaxed) && guests_.load(std::memory_order_seq_cst) == 0) {
                    watch(now_);
                    if (iterate()) continue;
                    // Lost the token while asleep: a guest leads now.
                    if (should_sleep(now_ - last_event_) && !sleep_until_event(token, true, sleep_timeout_ms(true))) break;
                }
                continue;
            }
        }
        // A guest leads (or is about to): look again every kTakeover, keeping the watch. A
        // guest that released the token to run a kernel (unlocked()) for longer than that
        // gets progress taken over meanwhile, so a long kernel stalls nobody.
        {
            std::unique_lock lock(guest_mutex_);
            // Nothing to watch (no kernel running, none released): sleep until a guest leaves, a
            // queued kernel starts (wake_watch) or kDeepWait passes, so an idle agent whose
            // worker sleeps as the leader wakes a few times a second instead of 200. deep_wait_ is set before the check; a
            // kernel publishes itself before it reads deep_wait_ (both sequentially consistent).
            deep_wait_.store(true, std::memory_order_seq_cst);
            bool watching = hooks_.watch_needed ? hooks_.watch_needed() : static_cast<bool>(hooks_.on_watch);
            if (handover_wanted_.exchange(false, std::memory_order_seq_cst) && guest_busy_.load(std::memory_order_seq_cst)) {
                // A long kernel began: take over now (below).
            } else if (!watching && !guest_busy_.load(std::memory_order_seq_cst)) {
                auto wake = [&] {
                    return guests_.load(std::memory_order_seq_cst) == 0 || stopping_.load() || watch_wanted_.exchange(false) ||
                           guest_busy_.load(std::memory_order_seq_cst);
                };
                // The leader asleep on the event fd runs nothing: no timeout until it wakes.
                if (guest_asleep_.load(std::memory_order_seq_cst))
                    guest_cv_.wait(lock, [&] { return wake() || !guest_asleep_.load(std::memory_order_seq_cst); });
                else
                    guest_cv_.wait_for(lock, kDeepWait, wake);
            } else {
                guest_cv_.wait_for(lock, kTakeover);
            }
            deep_wait_.store(false, std::memory_order_relaxed);
        }
        watch(Clock::now());
        if (guest_busy_.load(std::memory_order_acquire)) {
            std::unique_lock token(token_, std::try_to_lock);
            while (token.owns_lock() && guest_busy_.load(std::memory_order_acquire) && !stopping_.load()) {
                watch(Clock::now());
                if (iterate()) continue;
                // Short naps: the guest signals when its kernel returns and wants the token back.
                if (Clock::now() - last_event_ >= options_.spin) sleep_until_event(token, false, kTakeoverNapMs);
            }
        }
    }
    // Finish what was posted (replies to send, futures to fail), then close every endpoint.
    std::unique_lock token(token_);
    drain();
    for (auto* ep : std::vector(endpoints_)) close(ep);
    auto deadline = Clock::now() + kCloseTimeout;
    while (Clock::now() < deadline && ucp_worker_progress(worker_.get()) != 0) {
    }
    listener_.reset();
}

} // namespace bitship
