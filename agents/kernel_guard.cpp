#include "kernel_guard.hpp"

#include "core/coarse_clock.hpp"

#include <pthread.h>
#include <atomic>
#include <csetjmp>
#include <csignal>
#include <cstring>
#include <mutex>
#include <vector>

#include <fmt/format.h>

namespace bitship::agent {
namespace {

// The signal the watchdog sends to a worker whose kernel overran its budget.
const int kTimeoutSignal = SIGRTMIN + 2;
constexpr std::size_t kAltStackSize = 256 * 1024;

// The coarse monotonic clock (coarse_clock.hpp): its resolution (a few ms) is finer than the
// watchdog's own granularity. Read on every call.
std::int64_t now_ns() { return coarse_now_ns(); }

// One per worker thread, never freed (workers are few and live as long as the agent).
struct Slot {
    pthread_t thread{};
    sigjmp_buf jump;
    volatile sig_atomic_t active = 0;  // inside the kernel
    volatile sig_atomic_t signal = 0;
    void* volatile address = nullptr;
    std::atomic<std::uint64_t> generation{0}; // which call runs
    std::atomic<std::int64_t> started_ns{0};  // 0: none
    std::atomic<std::int64_t> budget_ns{0};
    std::atomic<std::uint64_t> stop_generation{0}; // the call the watchdog wants stopped
    Error stop_error;                              // why stop_kernel() stopped it
    const std::atomic<bool>* stopping = nullptr;   // the worker's pool is stopping (stop_kernels)
    std::atomic<bool> in_kernel{false};            // `active`, for other threads (stop_kernels)
};

bool pool_stopping(const Slot* s) { return s->stopping != nullptr && s->stopping->load(std::memory_order_relaxed); }

std::mutex g_slots_mutex;
std::vector<Slot*> g_slots;
thread_local Slot* t_slot = nullptr;

Slot& my_slot() {
    if (!t_slot) {
        t_slot = new Slot;
        t_slot->thread = pthread_self();
        std::lock_guard lock(g_slots_mutex);
        g_slots.push_back(t_slot);
    }
    return *t_slot;
}

struct sigaction g_previous[65];

// Slot::signal when the kernel was stopped by stop_kernel(), not by a signal.
constexpr int kStopped = -1;
// Slot::signal when stop_kernels() stopped it: its pool is stopping.
constexpr int kShutDown = -2;

Error shut_down_error() { return Error{Errc::shutting_down, "the agent is shutting down: the kernel was stopped"}; }

void on_signal(int sig, siginfo_t* info, void* uctx) {
    Slot* s = t_slot;
    if (sig == kTimeoutSignal) {
        // Only the call the watchdog meant: a signal that arrives after it returned is dropped.
        // Any call, once its pool stops.
        if (s && s->active && pool_stopping(s)) {
            s->active = 0;
            s->signal = kShutDown;
            siglongjmp(s->jump, 1);
        }
        if (s && s->active && s->stop_generation.load() == s->generation.load()) {
            s->active = 0;
            s->signal = sig;
            siglongjmp(s->jump, 1);
        }
        return;
    }
    if (s && s->active) {
        s->active = 0;
        s->signal = sig;
        s->address = info ? info->si_addr : nullptr;
        siglongjmp(s->jump, 1);
    }
    // Not inside a kernel: the agent itself faulted. Let the previous disposition act.
    auto& prev = g_previous[sig];
    if (prev.sa_flags & SA_SIGINFO && prev.sa_sigaction) {
        prev.sa_sigaction(sig, info, uctx);
        return;
    }
    if (prev.sa_handler != SIG_IGN && prev.sa_handler != SIG_DFL && prev.sa_handler) {
        prev.sa_handler(sig);
        return;
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

} // namespace

void install_kernel_guard() {
    static std::once_flag once;
    std::call_once(once, [] {
        struct sigaction sa{};
        sa.sa_sigaction = &on_signal;
        sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
        sigemptyset(&sa.sa_mask);
        for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, kTimeoutSignal}) sigaction(sig, &sa, &g_previous[sig]);
    });
}

void prepare_worker_thread(const std::atomic<bool>* stopping) {
    // The stack is switched off again before its memory goes, at thread exit: otherwise the
    // exiting thread still names freed memory as its signal stack (and ASan, which unmaps
    // whatever stack a thread ends with, dies on it: xagent exited 1 under ASan).
    // The thread's watchdog slot goes with it too.
    struct AltStack {
        std::vector<char> bytes = std::vector<char>(kAltStackSize);
        ~AltStack() {
            stack_t off{};
            off.ss_flags = SS_DISABLE;
            sigaltstack(&off, nullptr);
            if (t_slot) {
                std::lock_guard lock(g_slots_mutex);
                std::erase(g_slots, t_slot);
                delete t_slot;
                t_slot = nullptr;
            }
        }
    };
    static thread_local AltStack alt_stack;
    stack_t ss{};
    ss.ss_sp = alt_stack.bytes.data();
    ss.ss_size = alt_stack.bytes.size();
    sigaltstack(&ss, nullptr);
    Slot& slot = my_slot();
    std::lock_guard lock(g_slots_mutex); // stop_kernels reads it from other threads
    slot.stopping = stopping;
}

void stop_kernel(Error error) {
    Slot* s = t_slot;
    if (s && s->active) {
        s->active = 0;
        s->stop_error = std::move(error);
        s->signal = kStopped;
        siglongjmp(s->jump, 1);
    }
    fmt::print(stderr, "bitship: {} (outside a kernel)\n", error.describe());
    __builtin_trap();
}

void stop_forged_call() {
    stop_kernel(Error{Errc::policy_violation,
                      "kernel code policy, rule no-forged-call: the kernel made an indirect call to an address that is "
                      "no function it defines; it was stopped before the call"});
}

// UBSan's function check (clang's -fsanitize=function) reads the 8 bytes before a function
// called through a pointer; under --sandbox sfi the first kernel sits at the start of the code
// zone, after PROT_NONE pages. Kernels are not C++ functions with type signatures to check.
#if defined(__clang__)
__attribute__((no_sanitize("function")))
#endif
std::optional<Error> run_guarded(bs_entry_fn fn, bs_ctx* ctx, std::chrono::milliseconds budget, void (*started)(void*),
                                 void* started_arg) {
    Slot& s = my_slot();
    if (pool_stopping(&s)) return shut_down_error(); // stop_kernels() may have looked before this call began
    // Only this thread writes its slot's generation: a plain increment, no locked instruction.
    s.generation.store(s.generation.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    s.budget_ns.store(std::chrono::duration_cast<std::chrono::nanoseconds>(budget).count(), std::memory_order_relaxed);
    // Sequentially consistent where `started` (Engine::wake_watch) reads the engine's deep-wait
    // flag after it; with no `started`, nothing here pairs with it, and the watchdog sees the
    // kernel at its next look (within Engine::kDeepWait).
    s.started_ns.store(budget.count() > 0 ? now_ns() : 0, started ? std::memory_order_seq_cst : std::memory_order_release);
    if (started && budget.count() > 0) started(started_arg);

    std::optional<Error> outcome;
    // No signal mask saved (a system call per call): the handler runs with SA_NODEFER and an
    // empty sa_mask, so jumping out of it leaves no signal blocked.
    if (sigsetjmp(s.jump, 0) == 0) {
        s.in_kernel.store(true, std::memory_order_relaxed);
        s.active = 1;
        fn(ctx);
        s.active = 0;
    } else {
        int sig = s.signal;
        if (sig == kStopped)
            outcome = std::move(s.stop_error);
        else if (sig == kShutDown)
            outcome = shut_down_error();
        else if (sig == kTimeoutSignal)
            outcome = Error{Errc::kernel_timeout, fmt::format("kernel ran past its {} ms budget and was stopped", budget.count())};
        else
            outcome = Error{Errc::kernel_crashed,
                            fmt::format("kernel crashed with {} ({}) at address {}",
                                        sigabbrev_np(sig) ? fmt::format("SIG{}", sigabbrev_np(sig)) : std::to_string(sig),
                                        strsignal(sig), s.address)};
    }
    s.in_kernel.store(false, std::memory_order_relaxed);
    s.started_ns.store(0, std::memory_order_release);
    return outcome;
}

bool kernels_running() {
    std::lock_guard lock(g_slots_mutex);
    for (Slot* s : g_slots)
        if (s->started_ns.load(std::memory_order_seq_cst) != 0) return true;
    return false;
}

void check_kernel_budgets() {
    auto now = now_ns();
    std::lock_guard lock(g_slots_mutex);
    for (Slot* s : g_slots) {
        auto started = s->started_ns.load(std::memory_order_acquire);
        if (started == 0) continue;
        auto generation = s->generation.load(std::memory_order_relaxed);
        if (now - started <= s->budget_ns.load(std::memory_order_relaxed)) continue;
        if (s->stop_generation.load() == generation) continue; // already told
        s->stop_generation.store(generation);
        pthread_kill(s->thread, kTimeoutSignal);
    }
}

void stop_kernels(const std::atomic<bool>* stopping) {
    std::lock_guard lock(g_slots_mutex);
    for (Slot* s : g_slots)
        if (s->stopping == stopping && s->in_kernel.load(std::memory_order_relaxed)) pthread_kill(s->thread, kTimeoutSignal);
}

} // namespace bitship::agent
