#include "kernel_guard.hpp"

#include <pthread.h>
#include <csetjmp>
#include <csignal>
#include <cstring>
#include <ctime>
#include <mutex>
#include <vector>

#include <fmt/format.h>

namespace bitship::agent {
namespace {

// The signal a watchdog timer sends to a worker whose kernel overran its budget.
const int kTimeoutSignal = SIGRTMIN + 2;
constexpr std::size_t kAltStackSize = 256 * 1024;

struct GuardState {
    sigjmp_buf jump;
    volatile sig_atomic_t active = 0;
    volatile sig_atomic_t signal = 0;
    void* volatile address = nullptr;
};
thread_local GuardState* t_guard = nullptr;

struct sigaction g_previous[65];

void on_signal(int sig, siginfo_t* info, void* uctx) {
    GuardState* g = t_guard;
    if (g && g->active) {
        g->active = 0;
        g->signal = sig;
        g->address = info ? info->si_addr : nullptr;
        siglongjmp(g->jump, 1);
    }
    if (sig == kTimeoutSignal) return; // a timer that fired just after the kernel returned
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

void prepare_worker_thread() {
    static thread_local std::vector<char> alt_stack(kAltStackSize);
    stack_t ss{};
    ss.ss_sp = alt_stack.data();
    ss.ss_size = alt_stack.size();
    sigaltstack(&ss, nullptr);
}

std::optional<Error> run_guarded(bs_entry_fn fn, bs_ctx* ctx, std::chrono::milliseconds budget) {
    static thread_local GuardState guard;
    t_guard = &guard;

    // A per-call POSIX timer that signals this very thread when the budget runs out.
    // volatile: both are read after siglongjmp returns to sigsetjmp.
    timer_t volatile timer{};
    volatile bool armed = false;
    if (budget.count() > 0) {
        sigevent ev{};
        ev.sigev_notify = SIGEV_THREAD_ID;
        ev.sigev_signo = kTimeoutSignal;
        ev._sigev_un._tid = gettid();
        timer_t created{};
        if (timer_create(CLOCK_MONOTONIC, &ev, &created) == 0) {
            timer = created;
            itimerspec when{};
            when.it_value.tv_sec = budget.count() / 1000;
            when.it_value.tv_nsec = (budget.count() % 1000) * 1000000;
            armed = timer_settime(created, 0, &when, nullptr) == 0;
            if (!armed) timer_delete(created);
        }
    }
    std::optional<Error> outcome;
    if (sigsetjmp(guard.jump, 1) == 0) {
        guard.active = 1;
        fn(ctx);
        guard.active = 0;
    } else {
        int sig = guard.signal;
        if (sig == kTimeoutSignal)
            outcome = Error{Errc::kernel_timeout, fmt::format("kernel ran past its {} ms budget and was stopped", budget.count())};
        else
            outcome = Error{Errc::kernel_crashed, fmt::format("kernel crashed with {} ({}) at address {}", sigabbrev_np(sig)
                                                                  ? fmt::format("SIG{}", sigabbrev_np(sig)) : std::to_string(sig),
                                                              strsignal(sig), guard.address)};
    }
    if (armed) timer_delete(timer);
    return outcome;
}

} // namespace bitship::agent
