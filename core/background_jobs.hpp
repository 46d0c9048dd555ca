#pragma once
// Work taken off a call's path and done in order on one thread of its own: cache files, mostly.
// A file write and rename costs 0.1-0.3 ms on this machine's ext4, and a first call must not
// wait for the copy of its code or signature that only a later restart reads.
//
//   BackgroundJobs disk;
//   disk.post([bytes = std::move(b), path] { write_file(path, bytes); });
//   ...
//   disk.flush();   // everything posted so far is done
//
// The destructor finishes every job posted before it returns (unlike the JIT's tier-up queue,
// which drops what has not started): a job here is cheap, and its result is what a restart
// reads. Jobs must not throw.

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace bitship {

class BackgroundJobs {
public:
    /// `name`: the thread's name (at most 15 characters), as tools show it.
    explicit BackgroundJobs(const char* name = "bitship-bg");
    ~BackgroundJobs();
    BackgroundJobs(const BackgroundJobs&) = delete;
    BackgroundJobs& operator=(const BackgroundJobs&) = delete;

    /// Queues `job`; false (and the job dropped) when kMaxQueued are already waiting, so a
    /// flood of new code cannot grow memory without bound. Any thread.
    bool post(std::function<void()> job);
    /// Waits until every job posted so far has run.
    void flush();

    static constexpr std::size_t kMaxQueued = 4096;

private:
    void run();

    std::mutex mutex_;
    std::condition_variable wake_;
    std::condition_variable idle_;
    std::deque<std::function<void()>> queue_;
    bool busy_ = false;
    bool stop_ = false;
    std::thread thread_; // last: started once the members above exist
};

} // namespace bitship
