#pragma once
// A helper process of bitship's own (bitship-compiler, bitship-gpu), started with its end of a
// socket pair on a fixed descriptor, and ended: what the compiler pool and the GPU processes
// share.
//
//   auto child = spawn_with_socket({program, "--ordinal", "0"}, 3);  // child->fd: our end
//   ...
//   auto end = end_child(child->pid, 1s);   // waits 1 s for it to exit, then SIGKILL; reaps

#include <bitship/errc.hpp>
#include <chrono>
#include <string>
#include <sys/resource.h>
#include <sys/types.h>
#include <vector>

namespace bitship {

struct ChildProcess {
    pid_t pid = -1;
    int fd = -1; ///< our end of the socket pair
};

/// Starts `argv[0]` with `argv`, our environment, its end of a new AF_UNIX stream socket pair
/// on `child_fd`, each of `pass` on child_fd + 1, + 2, ..., stdin from /dev/null, stdout and
/// stderr shared with us, no other descriptor of ours, no signal blocked and every signal
/// disposition at its default (the agent blocks SIGINT/SIGTERM and catches faults for its
/// kernels). io_error naming the program on failure.
Result<ChildProcess> spawn_with_socket(const std::vector<std::string>& argv, int child_fd,
                                       const std::vector<int>& pass = {});

/// How a child ended.
struct ChildEnd {
    bool known = false;  ///< false: its status could not be had
    bool exited = false; ///< it exited by itself (`status` is its exit status)
    int status = 0;
    int signal = 0; ///< the signal that ended it, when !exited
    bool killed_by_us = false;
    rusage usage{};
};

/// Gives `pid` up to `grace` to exit by itself, then SIGKILLs it; reaps it either way.
ChildEnd end_child(pid_t pid, std::chrono::milliseconds grace);

/// "SIGSEGV", or "signal 77".
std::string signal_name(int sig);

} // namespace bitship
