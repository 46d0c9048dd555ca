#include "tier_up.hpp"

#include <pthread.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <exception>

#include <spdlog/spdlog.h>

namespace bitship::jit {
namespace {
/// Below the agent's threads: a tier-1 compile takes milliseconds of CPU that the call it
/// follows (run, reply) and later calls need more. Linux nices threads one by one.
constexpr int kTierUpNice = 10;
} // namespace

TierUp::TierUp() : thread_([this] { run(); }) {
    // Named so that top, perf and gdb tell it apart from the agent's workers.
    ::pthread_setname_np(thread_.native_handle(), "bitship-tier-up");
}

TierUp::~TierUp() {
    {
        std::lock_guard lock(mutex_);
        stop_ = true;
        queue_.clear();
        queued_.clear();
    }
    wake_.notify_all();
    thread_.join();
}

void TierUp::post(const CodeHash& hash, std::function<void()> job) {
    {
        std::lock_guard lock(mutex_);
        if (stop_ || !queued_.insert(hash).second) return;
        if (queue_.size() >= kMaxQueued) {
            queued_.erase(queue_.front().first);
            queue_.pop_front();
        }
        queue_.emplace_back(hash, std::move(job));
    }
    wake_.notify_one();
}

void TierUp::drain() {
    std::unique_lock lock(mutex_);
    idle_.wait(lock, [this] { return stop_ || (queue_.empty() && !running_job_); });
}

std::size_t TierUp::pending() {
    std::lock_guard lock(mutex_);
    return queue_.size() + (running_job_ ? 1 : 0);
}

void TierUp::run() {
    // Best effort: an unprivileged thread may always lower its own priority.
    (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), kTierUpNice);
    std::unique_lock lock(mutex_);
    for (;;) {
        wake_.wait(lock, [this] { return stop_ || !queue_.empty(); });
        if (stop_) break;
        auto [hash, job] = std::move(queue_.front());
        queue_.pop_front();
        queued_.erase(hash);
        running_job_ = true;
        lock.unlock();
        try {
            job();
        } catch (const std::exception& e) { // bad_alloc, mostly: the tier-0 code keeps serving
            spdlog::warn("jit: tier-up of {}: {}", to_hex(hash, 16), e.what());
        }
        lock.lock();
        running_job_ = false;
        finished_.fetch_add(1, std::memory_order_relaxed);
        if (queue_.empty()) idle_.notify_all();
    }
    running_job_ = false;
    idle_.notify_all();
}

} // namespace bitship::jit
