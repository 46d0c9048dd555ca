#pragma once
// Two threads that poll for each other on one core while another core idles. A progress
// thread that finds nothing to do yields its core (Engine::iterate), so that a peer queued
// behind it on a host with few cores runs at once. But when that peer is the thread it waits
// for (a client's caller and an agent's leader on one machine), the pair then stays on one
// core, handing it back and forth at every yield: 8–11 µs a round trip over shared memory
// on the 2-core test VM instead of 0.55, while the other core idles. A woken thread is put on
// its waker's core, and neither the wake-up path (its idle-CPU scan is cut short on a busy
// cache domain) nor the load balancer (it leaves cache-hot threads where they are) separates
// two threads that never sleep. So the thread that notices moves itself:
//
//   CoreSharing sharing;   // per polling loop (Engine::yield_core)
//   auto before = steady_clock::now();
//   sched_yield();
//   auto back = steady_clock::now();
//   if (sharing.yielded(back - before, back)) ++moves;

#include <chrono>

namespace bitship {

class CoreSharing {
public:
    /// A yield that kept the thread off its core this long ran another thread there (a yield
    /// with nothing else runnable returns in about 0.4 µs on the test VM).
    static constexpr auto kSharedYield = std::chrono::microseconds(2);
    /// This many shared yields in a row, and the thread moves to another core it may run on.
    static constexpr unsigned kSharedYields = 8;
    /// It moves at most this often: where every core is busy, moving only shuffles.
    static constexpr auto kMoveEvery = std::chrono::milliseconds(2);

    /// Notes a yield that took `off_core` at clock time `now`; after kSharedYields shared ones
    /// in a row (and not within kMoveEvery of the last move), moves the calling thread to
    /// another core of its affinity mask (which it keeps). Returns whether it moved.
    bool yielded(std::chrono::steady_clock::duration off_core, std::chrono::steady_clock::time_point now);

private:
    unsigned shared_ = 0;
    std::chrono::steady_clock::time_point last_move_{};
};

/// Moves the calling thread off the core it runs on, to another one its affinity mask allows;
/// the mask is then put back as it was (which leaves the thread where it went). Returns the
/// core it moved to, or -1 when the mask allows one core only or the kernel refused.
int move_to_another_core();

} // namespace bitship
