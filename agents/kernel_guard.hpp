#pragma once
// Runs a kernel so that a fault (SIGSEGV, SIGBUS, SIGFPE, SIGILL) or an overrun of its time
// budget stops that kernel, not the agent. The worker thread jumps back out of the kernel's
// frames with siglongjmp; kernels are C code with no destructors to skip.
//
// Limits, said plainly: a kernel stopped while it held a lock inside an exported libc function
// (malloc's, say) leaves that lock held. The agent logs every stop; an operator who sees
// kernel_timeout or kernel_crashed repeatedly should restart the agent.

#include <chrono>
#include <optional>
#include <string>

#include <bitship/errc.hpp>
#include <bitship/kernel.h>

namespace bitship::agent {

/// Installs the process-wide signal handlers once (idempotent, thread-safe).
void install_kernel_guard();

/// Prepares the calling worker thread: its own alternate signal stack, so a kernel that
/// overflows its stack is still caught.
void prepare_worker_thread();

/// Runs `fn(ctx)`; returns an error if the kernel faulted or ran past `budget`.
std::optional<Error> run_guarded(bs_entry_fn fn, bs_ctx* ctx, std::chrono::milliseconds budget);

} // namespace bitship::agent
