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

    /// After the thread woke from a sleep, this many shared yields in a row move it (not
    /// kSharedYields, and whenever the last move was). A woken thread is put on its waker's
    /// core, and the waker is most often the peer it is about to poll for: a burst of calls
    /// after an idle spell then ran at the shared-core 9 µs a call over shared memory (25 over
    /// TCP) until kSharedYields round trips had passed, which a short burst never gives. At 1
    /// the second call pays the move (35-55 µs on the 2-core test VM, where the other core's
    /// vCPU has to be woken) and the calls after it run at 1-2 µs (bench/after_idle; 2 or 3
    /// only delay the move by as many calls).
    static constexpr unsigned kSharedYieldsAfterWake = 1;
    /// The same for a client's waiting caller (ClientOptions feeds EngineOptions): more than an
    /// agent's, so that of a pair woken beside each other one moves. After an idle spell both
    /// sleep (the first call outlasts the spin window), both are woken by the other, and with
    /// one shared yield each both saw theirs before either had gone and both moved, to the
    /// same other core where there are two: they then shared that one at 11 µs a round trip
    /// over shared memory (42 over TCP) until kMoveEvery had passed, the whole of a short
    /// burst (bench/after_idle after 100 ms idle: calls 6-12 at 11.5 µs; after 20 ms, when the
    /// first call does not outlast the spin and only the agent has slept, 1.5). The agent's
    /// leader yields in the pair's every round trip too: it moves at its first, and the
    /// caller's next yield is alone. A coin for either to move again after such a collision
    /// thrashed instead: every move costs 50-500 µs here (the other vCPU wakes), which made
    /// calls outlast the spin window, sleep, wake and move again.
    static constexpr unsigned kSharedYieldsAfterWakeCaller = 3;

    explicit CoreSharing(unsigned shared_yields_after_wake = kSharedYieldsAfterWake) noexcept
        : after_wake_(shared_yields_after_wake < 1 ? 1 : shared_yields_after_wake) {}

    /// The polling thread woke from a sleep (Engine::sleep_until_event).
    void woke() noexcept {
        woke_ = true;
        shared_ = 0;
    }

private:
    unsigned after_wake_;
    unsigned shared_ = 0;
    bool woke_ = false;
    std::chrono::steady_clock::time_point last_move_{};
};

/// Moves the calling thread off the core it runs on, to another one its affinity mask allows;
/// the mask is then put back as it was (which leaves the thread where it went). Returns the
/// core it moved to, or -1 when the mask allows one core only or the kernel refused.
int move_to_another_core();

} // namespace bitship
