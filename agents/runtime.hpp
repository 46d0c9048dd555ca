#pragma once
// The kernel.h runtime as the agent implements it: the bs_ctx a kernel runs with, and the
// table of runtime symbols the JIT links kernels against.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <functional>
#include <optional>

#include <bitship/errc.hpp>
#include <bitship/kernel.h>

#include "jit.hpp"
#include "core/wire.hpp"

namespace bitship::agent {
class RegionTable;
struct Region;

/// What a kernel asked for with bs_forward / bs_ship; carried out after it returns.
struct ForwardRequest {
    std::uint32_t peer = 0;
    std::string entry;
    std::vector<std::byte> args;
};
} // namespace bitship::agent

/// One call's context; lives on the worker's stack while the kernel runs.
struct bs_ctx {
    std::span<const std::byte> args;
    /// The arguments lie in a landing slot in the sandbox arena (args_landing.hpp): a sandboxed
    /// call reads them there, without copying them into its call buffer.
    bool args_landed = false;
    std::size_t max_result = 0;
    std::size_t max_args = 0;
    const bitship::wire::Run* run = nullptr;           ///< the call: peers, hop budget
    const bitship::agent::RegionTable* regions = nullptr;
    /// Makes a region on the progress thread (UCX registration lives there); may be empty.
    std::function<const bitship::agent::Region*(const char* name, std::size_t size)> create_region;

    bool answered = false;
    bool failed = false;
    int fail_code = 0;
    std::string fail_message;
    std::optional<bitship::Error> runtime_error; ///< a failure the runtime raised (hop budget)
    std::optional<bitship::agent::ForwardRequest> forward;
    std::vector<std::byte> reply;
    /// The call's slot of its session's bulk window, when it offered one: a reply of at least
    /// kWindowResultMin bytes (core/bulk_window.hpp) that fits is written there by bs_reply
    /// (`in_slot` then says how many), one copy where the message would take two.
    std::span<std::byte> slot;
    std::size_t in_slot = 0;
};

namespace bitship::agent {

/// bs_args, bs_reply, bs_fail, bs_region, bs_forward, ...: what every kernel may call.
std::vector<jit::Export> runtime_exports();

} // namespace bitship::agent
