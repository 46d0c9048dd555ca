// The compiler's seccomp filter (see compiler_sandbox.hpp), with libseccomp.
#include "compiler_sandbox.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <csignal>
#include <cstring>

#include <fmt/format.h>

#if BITSHIP_HAVE_SECCOMP
#include <seccomp.h>
#endif

namespace bitship::jit {

#if BITSHIP_HAVE_SECCOMP

bool can_confine() { return true; }

Result<void> confine_compiler(int fd) {
    scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_KILL_PROCESS);
    if (ctx == nullptr) return fail(Errc::io_error, "seccomp_init failed (this kernel, or an emulator such as qemu-user, offers no seccomp)");
    struct Release {
        scmp_filter_ctx ctx;
        ~Release() { seccomp_release(ctx); }
    } release{ctx};
    const auto socket_fd = static_cast<scmp_datum_t>(fd);
    const auto self = static_cast<scmp_datum_t>(::getpid());
    int rc = 0;
    auto allow = [&](int syscall, auto... conditions) {
        if (rc == 0) rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, syscall, sizeof...(conditions), conditions...);
    };
    allow(SCMP_SYS(read), SCMP_A0(SCMP_CMP_EQ, socket_fd));
    allow(SCMP_SYS(write), SCMP_A0(SCMP_CMP_EQ, socket_fd));
    allow(SCMP_SYS(write), SCMP_A0(SCMP_CMP_EQ, STDERR_FILENO));
    // write_frame's sendmsg (header and payload at once, MSG_NOSIGNAL); send is sendto.
    allow(SCMP_SYS(sendmsg), SCMP_A0(SCMP_CMP_EQ, socket_fd));
    allow(SCMP_SYS(sendto), SCMP_A0(SCMP_CMP_EQ, socket_fd));
    allow(SCMP_SYS(recvfrom), SCMP_A0(SCMP_CMP_EQ, socket_fd));
    allow(SCMP_SYS(mmap), SCMP_A2(SCMP_CMP_MASKED_EQ, PROT_EXEC, 0));
    allow(SCMP_SYS(mprotect), SCMP_A2(SCMP_CMP_MASKED_EQ, PROT_EXEC, 0));
    for (int call : {SCMP_SYS(munmap), SCMP_SYS(mremap), SCMP_SYS(brk), SCMP_SYS(madvise), SCMP_SYS(futex),
                     SCMP_SYS(clock_gettime), SCMP_SYS(clock_getres), SCMP_SYS(gettimeofday), SCMP_SYS(exit),
                     SCMP_SYS(exit_group), SCMP_SYS(rt_sigreturn), SCMP_SYS(rt_sigprocmask), SCMP_SYS(getpid),
                     SCMP_SYS(gettid), SCMP_SYS(getppid), SCMP_SYS(restart_syscall)})
        allow(call);
    allow(SCMP_SYS(tgkill), SCMP_A0(SCMP_CMP_EQ, self));
    // glibc's qsort asks sysinfo for the machine's physical memory the first time it sorts
    // more than 1 KiB (LLVM's array_pod_sort is qsort), so whether a compile needs it depends
    // on the kernel shipped. It tells memory totals, load and uptime: nothing to confine.
    allow(SCMP_SYS(sysinfo));
    // Asking for the signal stack (never setting one): what the sanitizers' runtimes do on
    // their way through a fault or an abort.
    allow(SCMP_SYS(sigaltstack), SCMP_A0(SCMP_CMP_EQ, 0));
    if (rc != 0) return fail(Errc::io_error, fmt::format("building the seccomp filter: {}", std::strerror(-rc)));
    // No new privileges, ever (seccomp requires it of an unprivileged process anyway).
    if (seccomp_attr_set(ctx, SCMP_FLTATR_CTL_NNP, 1) != 0)
        return fail(Errc::io_error, "seccomp: cannot set no-new-privileges");
    if (int load = seccomp_load(ctx); load != 0)
        return fail(Errc::io_error, fmt::format("loading the seccomp filter: {}", std::strerror(-load)));
    return {};
}

#else

bool can_confine() { return false; }

Result<void> confine_compiler(int) {
    return fail(Errc::io_error, "this build has no libseccomp (install libseccomp-dev and reconfigure)");
}

#endif

} // namespace bitship::jit
