#pragma once
// The kernel.h runtime as the agent implements it: the bs_ctx a kernel runs with, and the
// table of runtime symbols the JIT links kernels against.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <bitship/kernel.h>

#include "jit.hpp"

/// One call's context; lives on the worker's stack while the kernel runs.
struct bs_ctx {
    std::span<const std::byte> args;
    std::size_t max_result = 0;
    bool answered = false;
    bool failed = false;
    int fail_code = 0;
    std::string fail_message;
    std::vector<std::byte> reply;
};

namespace bitship::agent {

/// bs_args, bs_reply, bs_fail: what every kernel may call.
std::vector<jit::Export> runtime_exports();

} // namespace bitship::agent
