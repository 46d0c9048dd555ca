// Helper processes of bitship's own (see child_process.hpp).
#include "child_process.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

extern char** environ;

namespace bitship {
namespace {
constexpr auto kExitPoll = std::chrono::milliseconds(1);
}

Result<ChildProcess> spawn_with_socket(const std::vector<std::string>& argv, int child_fd,
                                       const std::vector<int>& pass) {
    if (argv.empty()) return fail(Errc::invalid_argument, "no program to start");
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
        return fail(Errc::io_error,
                    fmt::format("socketpair for {}: {}", argv[0], std::strerror(errno)));
    // Each descriptor the child gets, first moved above every target: a dup2 onto itself would
    // leave its close-on-exec flag set (and one onto another's target would close that one).
    const int first_free = child_fd + 1 + static_cast<int>(pass.size());
    std::vector<int> moved;
    auto above = [&](int fd) {
        int copy = ::fcntl(fd, F_DUPFD_CLOEXEC, first_free);
        if (copy >= 0) moved.push_back(copy);
        return copy;
    };
    auto close_all = [&] {
        for (int fd : moved)
            ::close(fd);
        ::close(sv[1]);
    };
    std::vector<int> sources = {above(sv[1])};
    for (int fd : pass)
        sources.push_back(above(fd));
    if (std::find(sources.begin(), sources.end(), -1) != sources.end()) {
        const int e = errno;
        close_all();
        ::close(sv[0]);
        return fail(Errc::io_error,
                    fmt::format("descriptors for {}: {}", argv[0], std::strerror(e)));
    }
    posix_spawn_file_actions_t files;
    posix_spawnattr_t attrs;
    ::posix_spawn_file_actions_init(&files);
    ::posix_spawnattr_init(&attrs);
    for (std::size_t i = 0; i < sources.size(); ++i)
        ::posix_spawn_file_actions_adddup2(&files, sources[i], child_fd + static_cast<int>(i));
    ::posix_spawn_file_actions_addopen(&files, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
    ::posix_spawn_file_actions_addclosefrom_np(&files, first_free);
    sigset_t none, all;
    sigemptyset(&none);
    sigfillset(&all);
    ::posix_spawnattr_setsigmask(&attrs, &none);
    ::posix_spawnattr_setsigdefault(&attrs, &all);
    ::posix_spawnattr_setflags(&attrs, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    std::vector<char*> args;
    args.reserve(argv.size() + 1);
    for (const auto& a : argv)
        args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    pid_t pid = -1;
    int rc = ::posix_spawn(&pid, argv[0].c_str(), &files, &attrs, args.data(), environ);
    ::posix_spawn_file_actions_destroy(&files);
    ::posix_spawnattr_destroy(&attrs);
    close_all();
    if (rc != 0) {
        ::close(sv[0]);
        return fail(Errc::io_error, fmt::format("cannot start {}: {}", argv[0], std::strerror(rc)));
    }
    return ChildProcess{pid, sv[0]};
}

ChildEnd end_child(pid_t pid, std::chrono::milliseconds grace) {
    ChildEnd end;
    int status = 0;
    pid_t got = ::wait4(pid, &status, WNOHANG, &end.usage);
    for (auto until = std::chrono::steady_clock::now() + grace;
         got == 0 && std::chrono::steady_clock::now() < until;) {
        std::this_thread::sleep_for(kExitPoll);
        got = ::wait4(pid, &status, WNOHANG, &end.usage);
    }
    if (got == 0) {
        ::kill(pid, SIGKILL);
        end.killed_by_us = true;
        while ((got = ::wait4(pid, &status, 0, &end.usage)) < 0 && errno == EINTR) {
        }
    }
    if (got <= 0) return end;
    end.known = true;
    end.exited = WIFEXITED(status);
    if (end.exited)
        end.status = WEXITSTATUS(status);
    else if (WIFSIGNALED(status))
        end.signal = WTERMSIG(status);
    return end;
}

std::string signal_name(int sig) {
    const char* abbrev = ::sigabbrev_np(sig);
    return abbrev != nullptr ? fmt::format("SIG{}", abbrev) : fmt::format("signal {}", sig);
}

} // namespace bitship
