#pragma once
// Runs a kernel so that a fault (SIGSEGV, SIGBUS, SIGFPE, SIGILL) or an overrun of its time
// budget stops that kernel, not the agent. The worker thread jumps back out of the kernel's
// frames with siglongjmp; kernels are C code with no destructors to skip.
//
// Budgets cost no system call per call: a worker publishes which kernel it runs and since
// when (atomic stores), and check_kernel_budgets(), called every few milliseconds by the
// engine's thread, signals a worker whose kernel overran. A generation number makes sure a
// late signal never stops the kernel that came after.
//
// Limits, said plainly: a kernel stopped while it held a lock inside an exported libc function
// (malloc's, say) leaves that lock held. The agent logs every stop; an operator who sees
// kernel_timeout or kernel_crashed repeatedly should restart the agent.

#include <atomic>
#include <chrono>
#include <optional>
#include <string>

#include <bitship/errc.hpp>
#include <bitship/kernel.h>

namespace bitship::agent {

/// Installs the process-wide signal handlers once (idempotent, thread-safe).
void install_kernel_guard();

/// Prepares the calling worker thread: its own alternate signal stack, so a kernel that
/// overflows its stack is still caught, and its slot in the watchdog's table. `stopping`, when
/// given, is its pool's flag: once it is set, no kernel starts on this thread, and
/// stop_kernels(stopping) stops the one running.
void prepare_worker_thread(const std::atomic<bool>* stopping = nullptr);

/// Runs `fn(ctx)`; returns an error if the kernel faulted or ran past `budget` (0: no budget).
/// `started`, when given, is called once the kernel is published to the watchdog and before
/// it runs (the agent wakes a sleeping watchdog there).
std::optional<Error> run_guarded(bs_entry_fn fn, bs_ctx* ctx, std::chrono::milliseconds budget,
                                 void (*started)(void*) = nullptr, void* started_arg = nullptr);

/// Stops the kernel running on this thread: run_guarded returns `error`. For runtime functions
/// a kernel calls (its frames are C, with nothing to unwind); the caller's own frames are left
/// without running destructors, so it holds nothing that needs one (move the message in).
/// Outside a kernel it prints the error and traps.
[[noreturn]] void stop_kernel(Error error);

/// What shipped code calls in place of a forged indirect call (jit::kForgedCallSymbol): stops
/// the running kernel with policy_violation (rule no-forged-call). Outside a kernel it traps.
[[noreturn]] void stop_forged_call();

/// Whether any worker runs a kernel with a budget right now (the watchdog has work). Any thread.
bool kernels_running();

/// Signals every worker whose kernel has run past its budget. Any thread; cheap when none has.
void check_kernel_budgets();

/// Stops the kernels running on the workers prepared with `stopping` (which the caller has set):
/// each run_guarded there returns shutting_down. A kernel about to start when this runs may
/// miss it and start (its thread had not yet read the flag): call again until the workers are
/// gone. Any thread.
void stop_kernels(const std::atomic<bool>* stopping);

} // namespace bitship::agent
