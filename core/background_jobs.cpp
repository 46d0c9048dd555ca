#include "background_jobs.hpp"

#include <pthread.h>

namespace bitship {

BackgroundJobs::BackgroundJobs(const char* name) : thread_([this] { run(); }) {
    pthread_setname_np(thread_.native_handle(), name);
}

BackgroundJobs::~BackgroundJobs() {
    {
        std::lock_guard lock(mutex_);
        stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
}

bool BackgroundJobs::post(std::function<void()> job) {
    {
        std::lock_guard lock(mutex_);
        if (queue_.size() >= kMaxQueued) return false;
        queue_.push_back(std::move(job));
    }
    wake_.notify_one();
    return true;
}

void BackgroundJobs::flush() {
    std::unique_lock lock(mutex_);
    idle_.wait(lock, [this] { return queue_.empty() && !busy_; });
}

void BackgroundJobs::run() {
    std::unique_lock lock(mutex_);
    for (;;) {
        wake_.wait(lock, [this] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return; // stopping, and every job has run
        auto job = std::move(queue_.front());
        queue_.pop_front();
        busy_ = true;
        lock.unlock();
        job();
        lock.lock();
        busy_ = false;
        if (queue_.empty()) idle_.notify_all();
    }
}

} // namespace bitship
