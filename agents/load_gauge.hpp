#pragma once
// The load an agent reports in the header of every RESULT and ERROR it sends (core/agent_load.hpp):
// runs waiting for a worker, and workers running kernels. A kernel on a pool worker is counted
// with two relaxed atomic adds around its run; one the leading worker runs (the cached call's
// path) with two plain stores, as only the holder of the progress token writes that count.
// Stamping a reply reads three atomics.

#include "core/agent_load.hpp"
#include "core/wire.hpp"
#include "core/held_count.hpp"

#include <atomic>
#include <cstddef>

namespace bitship::agent {

class LoadGauge {
public:
    /// Counts a kernel as running for its scope (on whichever thread runs it).
    class Running {
    public:
        explicit Running(LoadGauge& g) noexcept : g_(g) {
            g_.running_.fetch_add(1, std::memory_order_relaxed);
        }
        ~Running() { g_.running_.fetch_sub(1, std::memory_order_relaxed); }
        Running(const Running&) = delete;
        Running& operator=(const Running&) = delete;

    private:
        LoadGauge& g_;
    };

    /// Counts a kernel the leading worker runs for its scope: made and ended with the engine's
    /// progress token held (around Engine::run_released).
    class RunningLeader {
    public:
        explicit RunningLeader(LoadGauge& g) noexcept : g_(g) { bump(+1); }
        ~RunningLeader() { bump(-1); }
        RunningLeader(const RunningLeader&) = delete;
        RunningLeader& operator=(const RunningLeader&) = delete;

    private:
        void bump(int by) noexcept { add_held(g_.leader_, static_cast<unsigned>(by)); }
        LoadGauge& g_;
    };

    /// Writes the load into `m`'s header when it is a RESULT or an ERROR; `queued`: jobs
    /// waiting for a worker now. The answered call's own kernel has finished by then, so it is
    /// not counted.
    void stamp(wire::Encoded& m, std::size_t queued) const noexcept {
        if (m.header.type != wire::Type::result && m.header.type != wire::Type::error) return;
        m.header.reserved = pack_agent_load(queued, running_.load(std::memory_order_relaxed) +
                                                        leader_.load(std::memory_order_relaxed));
    }

private:
    std::atomic<unsigned> running_{0};
    std::atomic<unsigned> leader_{0}; ///< RunningLeader: written with the progress token held
};

} // namespace bitship::agent
