#pragma once
// The engine's progress token (Engine::token_): a mutex whose holder may touch the UCX worker
// and the engine's queues. Each thread counts the tokens it holds (a thread-local add, next to
// the lock's own atomic): held_here() lets code that relies on holding one (the agent's counts
// written with a load and a store, core/held_count.hpp) assert it, and a poller that may be
// called from inside a hook (Future::ready, Engine::poll_once) see that it already progresses.
// Private to bitship (core, agents).

#include <mutex>

namespace bitship {

class ProgressToken {
public:
    void lock() {
        mutex_.lock();
        note(+1);
    }
    [[nodiscard]] bool try_lock() {
        if (!mutex_.try_lock()) return false;
        note(+1);
        return true;
    }
    void unlock() {
        note(-1);
        mutex_.unlock();
    }

    /// Whether the calling thread holds a progress token (any engine's).
    [[nodiscard]] static bool held_here() noexcept { return held_ > 0; }

private:
    static void note(int by) noexcept { held_ += by; }
    static inline thread_local int held_ = 0;
    std::mutex mutex_;
};

} // namespace bitship
