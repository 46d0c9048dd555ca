#include "worker_pool.hpp"

#include "kernel_guard.hpp"

namespace bitship::agent {

namespace {
// The pool whose worker this thread is, while it progresses the engine; else null.
thread_local const WorkerPool* t_leading = nullptr;
} // namespace

bool WorkerPool::on_leading_worker() noexcept { return t_leading != nullptr; }

WorkerPool::WorkerPool(unsigned threads, std::chrono::microseconds spin, Engine* engine)
    : count_(std::max(1u, threads)), spin_(spin), engine_(engine) {}

void WorkerPool::start() {
    {
        std::lock_guard lock(mutex_);
        alive_ = count_;
    }
    for (unsigned i = 0; i < count_; ++i)
        threads_.emplace_back([this] {
            run();
            std::lock_guard lock(mutex_);
            --alive_;
            gone_cv_.notify_all();
        });
}

WorkerPool::~WorkerPool() { stop(); }

bool WorkerPool::submit(std::function<void()> job) {
    bool wake = false;
    {
        std::lock_guard lock(mutex_);
        if (stopping_) return false;
        queue_.push_back(std::move(job));
        queued_.fetch_add(1, std::memory_order_release);
        // A leading worker of this pool queued this itself and will run it: wake nobody for it
        // (a job for another pool, a compile the leader queues, wakes one of that pool).
        wake = sleepers_ > 0 && !(t_leading == this && queue_.size() == 1);
    }
    if (wake) cv_.notify_one();
    return true;
}

std::vector<std::function<void()>> WorkerPool::stop(std::chrono::milliseconds grace, const std::function<void()>& overdue) {
    std::vector<std::function<void()>> left;
    {
        std::lock_guard lock(mutex_);
        if (stopping_ && threads_.empty()) return left;
        stopping_ = true;
        stop_flag_.store(true);
        left.assign(std::make_move_iterator(queue_.begin()), std::make_move_iterator(queue_.end()));
        queue_.clear();
        queued_.store(0);
    }
    cv_.notify_all();
    if (engine_) engine_->wake(); // a leading worker may sleep on the event fd
    // A kernel that never returns (no kernel timeout) would hold the join for ever: past the
    // grace, the kernels still running are stopped, again and again until every worker is out.
    {
        std::unique_lock lock(mutex_);
        auto next = std::chrono::steady_clock::now() + grace;
        while (!gone_cv_.wait_until(lock, next, [this] { return alive_ == 0; })) {
            lock.unlock();
            stop_kernels(&stop_flag_);
            if (overdue) overdue();
            lock.lock();
            next = std::chrono::steady_clock::now() + kStopRetry;
        }
    }
    for (auto& t : threads_) t.join();
    threads_.clear();
    return left;
}

void WorkerPool::run() {
    prepare_worker_thread(&stop_flag_);
    if (thread_start_) thread_start_();
    using clock = std::chrono::steady_clock;
    for (;;) {
        std::function<void()> job;
        {
            std::unique_lock lock(mutex_);
            if (queue_.empty() && stopping_) return;
            if (!queue_.empty()) {
                job = std::move(queue_.front());
                queue_.pop_front();
                running_.fetch_add(1, std::memory_order_relaxed); // before queued_ drops: idle() never sees a gap
                queued_.fetch_sub(1, std::memory_order_relaxed);
            }
        }
        if (job) {
            job();
            running_.fetch_sub(1, std::memory_order_release);
            continue;
        }
        // Idle: lead progress if nobody does, until a job shows up (most likely one we queued).
        if (engine_ && !leading_.exchange(true)) {
            t_leading = this;
            engine_->lead_until([this] {
                return queued_.load(std::memory_order_acquire) > 0 || stop_flag_.load(std::memory_order_relaxed);
            });
            t_leading = nullptr;
            leading_.store(false);
            continue;
        }
        // Poll without the lock for a while: a job often follows within microseconds.
        auto until = clock::now() + spin_;
        while (queued_.load(std::memory_order_acquire) == 0 && clock::now() < until) {
        }
        std::unique_lock lock(mutex_);
        ++sleepers_;
        cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        --sleepers_;
    }
}

} // namespace bitship::agent
