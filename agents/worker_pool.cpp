#include "worker_pool.hpp"

#include "kernel_guard.hpp"

namespace bitship::agent {

WorkerPool::WorkerPool(unsigned threads, std::chrono::microseconds spin) : spin_(spin) {
    for (unsigned i = 0; i < std::max(1u, threads); ++i) threads_.emplace_back([this] { run(); });
}

WorkerPool::~WorkerPool() { stop(); }

bool WorkerPool::submit(std::function<void()> job) {
    bool wake = false;
    {
        std::lock_guard lock(mutex_);
        if (stopping_) return false;
        queue_.push_back(std::move(job));
        queued_.fetch_add(1, std::memory_order_release);
        wake = sleepers_ > 0;
    }
    if (wake) cv_.notify_one();
    return true;
}

std::vector<std::function<void()>> WorkerPool::stop() {
    std::vector<std::function<void()>> left;
    {
        std::lock_guard lock(mutex_);
        if (stopping_ && threads_.empty()) return left;
        stopping_ = true;
        left.assign(std::make_move_iterator(queue_.begin()), std::make_move_iterator(queue_.end()));
        queue_.clear();
        queued_.store(0);
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
    threads_.clear();
    return left;
}

void WorkerPool::run() {
    prepare_worker_thread();
    using clock = std::chrono::steady_clock;
    for (;;) {
        // Poll without the lock for a while: a job often follows within microseconds.
        auto until = clock::now() + spin_;
        while (queued_.load(std::memory_order_acquire) == 0 && clock::now() < until) {
        }
        std::function<void()> job;
        {
            std::unique_lock lock(mutex_);
            ++sleepers_;
            cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
            --sleepers_;
            if (queue_.empty()) return; // stopping, nothing left
            job = std::move(queue_.front());
            queue_.pop_front();
            queued_.fetch_sub(1, std::memory_order_relaxed);
        }
        job();
    }
}

} // namespace bitship::agent
