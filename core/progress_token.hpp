#pragma once
// The engine's progress token (Engine::token_): a mutex whose holder may touch the UCX worker
// and the engine's queues. Code that relies on holding it (the agent's counts written with a
// load and a store, agents/held_count.hpp) asks held_here() in an assertion: in builds with
// assertions each thread counts the tokens it holds; without them the count is not kept and
// held_here() is not meant to be called. Private to bitship (core, agents).

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

#ifndef NDEBUG
    /// Whether the calling thread holds a progress token (any engine's).
    [[nodiscard]] static bool held_here() noexcept {
        return held_ > 0;
    }

private:
    static void note(int by) noexcept {
        held_ += by;
    }
    static inline thread_local int held_ = 0;
#else
private:
    static void note(int) noexcept {}
#endif
    std::mutex mutex_;
};

} // namespace bitship
