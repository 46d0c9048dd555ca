#pragma once
// The operator's control plane, answered by the agent's progress thread: INFO, KERNEL_STATS,
// CACHE_LIST, CACHE_EVICT, DRAIN (what `xctl` sends).

#include <chrono>
#include <functional>
#include <string>

#include "core/wire.hpp"
#include "jit.hpp"
#include "kernel_stats.hpp"
#include "topology.hpp"

namespace bitship::agent {

/// What the control plane reads and may act on; owned by the agent, set once at its start.
struct ControlContext {
    std::string address;
    std::uint64_t instance = 0;
    Topology topology;
    unsigned workers = 0;
    std::chrono::steady_clock::time_point started;
    jit::Jit* jit = nullptr;
    const KernelStats* stats = nullptr;
    /// Starts draining: RUNs are refused from now on, the agent exits once those in flight are
    /// answered. False when it was draining already.
    std::function<bool()> begin_drain;
    /// How clients are admitted and which code runs (INFO's "trust"); changed on SIGHUP.
    std::string trust;
    /// The CUDA driver and its GPUs, or why there is none (INFO's "cuda"; cuda_driver.hpp).
    std::string cuda;
    /// How shipped kernels are confined (INFO's "sandbox"; kernel_sandbox.hpp).
    std::function<std::string()> sandbox;
};

/// Whether `type` is one of the control requests handle_control() answers.
bool is_control_request(wire::Type type) noexcept;

/// The reply (or ERROR) to control request `msg`, whose request id is `id`.
wire::Encoded handle_control(const ControlContext& ctx, std::uint64_t id, const wire::Message& msg);

/// INFO's fields: name → value, "n/a" where this agent cannot tell.
wire::Fields info_fields(const ControlContext& ctx, std::vector<std::string>& storage);

} // namespace bitship::agent
