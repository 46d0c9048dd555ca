#pragma once
// The threads kernels (and a GPU call's first compile) run on, never inside a UCX callback. (The
// agent's CPU compiles run on a pool of their own, made without an engine: its threads only run
// jobs.)
//
// Leader/follower: one idle worker takes over UCX progress from the engine's thread
// (Engine::lead_until). A RUN it decodes queues a job that this same worker then runs, after
// handing progress back, so a cached call costs no thread wake-up on its way in; the engine's
// thread progresses while the kernel runs, so a long kernel never stalls other callers. The
// other idle workers sleep on a condition variable.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "core/engine.hpp"
#include "core/held_count.hpp"

namespace bitship::agent {

class WorkerPool {
public:
    /// `engine`: when set, an idle worker leads progress as above.
    WorkerPool(unsigned threads, std::chrono::microseconds spin, Engine* engine = nullptr);
    ~WorkerPool();
    /// Starts the threads. Separate from construction: a leading worker may run the owner's
    /// hooks at once, and those must find the pool in place.
    void start();
    /// Run by each worker thread as it starts, before its first job (set before start()): what
    /// a thread's first kernel would otherwise pay (KernelSandbox::prepare_thread).
    void on_thread_start(std::function<void()> prepare) { thread_start_ = std::move(prepare); }
    WorkerPool(const WorkerPool&) = delete;
    WorkerPool& operator=(const WorkerPool&) = delete;

    /// Queues a job; false once stop() has begun (the caller answers it itself).
    bool submit(std::function<void()> job);
    /// Finishes the running jobs, returns the ones never started, joins the threads. No kernel
    /// starts on a worker once stop() has begun; kernels still running `grace` after it began
    /// are stopped (shutting_down: kernel_guard.hpp's stop_kernels), and `overdue` is called
    /// then too, and every kStopRetry until the workers are gone (the owner ends what else they
    /// wait for: a GPU process).
    std::vector<std::function<void()>> stop(std::chrono::milliseconds grace = kStopGrace,
                                            const std::function<void()>& overdue = {});
    static constexpr std::chrono::milliseconds kStopGrace{1000};
    static constexpr std::chrono::milliseconds kStopRetry{10};
    [[nodiscard]] unsigned size() const noexcept { return count_; }
    /// Whether the calling thread is a worker of some pool that leads progress right now (it
    /// received what it is handling, and may run it itself).
    [[nodiscard]] static bool on_leading_worker() noexcept;
    /// Jobs waiting for a worker now (a load figure: relaxed).
    [[nodiscard]] std::size_t queued() const noexcept { return queued_.load(std::memory_order_relaxed); }
    /// No job queued and none running (a drain waits for this; ask with the progress token held).
    [[nodiscard]] bool idle() const noexcept {
        return queued_.load(std::memory_order_acquire) == 0 && running_.load(std::memory_order_acquire) == 0 &&
               running_here_.load(std::memory_order_relaxed) == 0;
    }
    /// Counts a job the calling (leading) worker runs itself, outside the queue, as running.
    /// Made and ended with the engine's progress token held (the leader's), so the count is a
    /// plain load and store, no locked instruction, and idle() reads it under the token too.
    struct RunningHere {
        explicit RunningHere(WorkerPool& pool) : pool_(pool) { bump(+1); }
        ~RunningHere() { bump(-1); }
        RunningHere(const RunningHere&) = delete;
        RunningHere& operator=(const RunningHere&) = delete;

    private:
        void bump(int by) noexcept { add_held(pool_.running_here_, static_cast<unsigned>(by)); }
        WorkerPool& pool_;
    };

private:
    void run();
    unsigned count_;
    std::chrono::microseconds spin_;
    std::mutex mutex_;
    std::condition_variable cv_;
    std::deque<std::function<void()>> queue_;
    std::atomic<std::size_t> queued_{0};
    std::atomic<unsigned> running_{0};
    std::atomic<unsigned> running_here_{0}; ///< RunningHere: written with the progress token held
    std::atomic<bool> stop_flag_{false};
    unsigned alive_ = 0;                ///< workers not yet returned from run() (under mutex_)
    std::condition_variable gone_cv_;   ///< a worker returned
    std::atomic<bool> leading_{false};
    Engine* engine_ = nullptr;
    std::function<void()> thread_start_;
    unsigned sleepers_ = 0;
    bool stopping_ = false;
    std::vector<std::thread> threads_;
};

} // namespace bitship::agent
