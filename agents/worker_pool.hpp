#pragma once
// The threads kernels (and compiles) run on: never the progress thread, never a UCX callback.
// An idle worker polls its queue briefly, then sleeps on a condition variable.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace bitship::agent {

class WorkerPool {
public:
    WorkerPool(unsigned threads, std::chrono::microseconds spin);
    ~WorkerPool();
    WorkerPool(const WorkerPool&) = delete;
    WorkerPool& operator=(const WorkerPool&) = delete;

    /// Queues a job; false once stop() has begun (the caller answers it itself).
    bool submit(std::function<void()> job);
    /// Finishes the running jobs, returns the ones never started, joins the threads.
    std::vector<std::function<void()>> stop();
    [[nodiscard]] unsigned size() const noexcept { return static_cast<unsigned>(threads_.size()); }

private:
    void run();
    std::chrono::microseconds spin_;
    std::mutex mutex_;
    std::condition_variable cv_;
    std::deque<std::function<void()>> queue_;
    std::atomic<std::size_t> queued_{0};
    unsigned sleepers_ = 0;
    bool stopping_ = false;
    std::vector<std::thread> threads_;
};

} // namespace bitship::agent
