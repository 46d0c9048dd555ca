#pragma once
// The Jit's background thread: runs the tier-1 (fully optimised) compiles queued after each
// tier-0 compile, one at a time, oldest first, so callers never wait for the optimiser. Private
// to jit/.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <set>
#include <thread>

#include <bitship/bundle.hpp>

namespace bitship::jit {

class TierUp {
public:
    TierUp();
    /// Drops the jobs not started, waits for the one running.
    ~TierUp();
    TierUp(const TierUp&) = delete;
    TierUp& operator=(const TierUp&) = delete;

    /// Queues `job` for `hash`, unless a job for `hash` is already queued (not yet started).
    /// At kMaxQueued jobs the oldest is dropped (its code stays at tier 0 until compiled again):
    /// a flood of new kernels must not grow the queue without bound.
    void post(const CodeHash& hash, std::function<void()> job);

    static constexpr std::size_t kMaxQueued = 1024;

    /// Blocks until the queue is empty and no job runs.
    void drain();
    /// Jobs queued or running now.
    [[nodiscard]] std::size_t pending();
    /// Jobs finished so far (failed ones included).
    [[nodiscard]] std::uint64_t finished() const noexcept { return finished_.load(std::memory_order_relaxed); }

private:
    void run();

    std::mutex mutex_;
    std::condition_variable wake_; // a job was queued, or stop_
    std::condition_variable idle_; // the queue emptied and the running job ended
    std::deque<std::pair<CodeHash, std::function<void()>>> queue_;
    std::set<CodeHash> queued_;
    bool running_job_ = false;
    std::atomic<std::uint64_t> finished_{0};
    bool stop_ = false;
    std::thread thread_; // last: started once the members above exist
};

} // namespace bitship::jit
