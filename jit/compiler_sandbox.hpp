#pragma once
// The seccomp filter a bitship-compiler process puts on itself once LLVM is initialised and
// warmed up. Private to jit/.
//
// Allowed afterwards, and nothing else (SCMP_ACT_KILL_PROCESS: the agent sees SIGSYS):
//   read            only on the socket to the agent
//   write           only on that socket and on stderr (LLVM's warnings)
//   mmap, mprotect  never with PROT_EXEC; munmap, mremap, brk, madvise: the allocator
//   futex           libstdc++'s one-time initialisers (the process has one thread)
//   clock_gettime, clock_getres, gettimeofday: stage timings (usually the vDSO, no call at all)
//   exit, exit_group, rt_sigreturn, restart_syscall
//   getppid         each second of CPU, whether the agent is still there (compiler_main.cpp:
//                   watch_for_agent_end)
//   rt_sigprocmask, getpid, gettid, tgkill (this process only): what abort() does, so an LLVM
//                   abort is reported as SIGABRT rather than as a seccomp kill; sigaltstack
//                   only to ask (the sanitizers' runtimes ask on their way out)
// No open, no socket, no fork or clone, no exec, no ptrace: a bug in LLVM's bitcode reader
// gains an attacker a process that can only answer the agent, within its CPU and memory limits.

#include <bitship/errc.hpp>

namespace bitship::jit {

/// Whether this build can confine the compiler at all (libseccomp found at configure time).
bool can_confine();

/// Installs the filter above for socket `fd`. io_error naming what failed (no seccomp in this
/// kernel or under this emulator, ...); then nothing is installed.
Result<void> confine_compiler(int fd);

} // namespace bitship::jit
