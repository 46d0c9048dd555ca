#include "perftest.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#include <fmt/format.h>

extern char** environ;

namespace bitship::bench {
namespace {

constexpr auto kServerStartup = std::chrono::milliseconds(300);
constexpr int kClientTries = 5;

struct Child {
    pid_t pid = -1;
    int out = -1; ///< read end of its stdout+stderr
};

Child spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env_extra) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return {};
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
    std::vector<std::string> env_strings;
    for (char** e = environ; *e; ++e) env_strings.emplace_back(*e);
    for (const auto& e : env_extra) env_strings.push_back(e);
    std::vector<char*> envp, args;
    for (auto& e : env_strings) envp.push_back(e.data());
    envp.push_back(nullptr);
    std::vector<std::string> argv_copy = argv;
    for (auto& a : argv_copy) args.push_back(a.data());
    args.push_back(nullptr);
    Child c;
    if (posix_spawnp(&c.pid, args[0], &fa, nullptr, args.data(), envp.data()) != 0) c.pid = -1;
    posix_spawn_file_actions_destroy(&fa);
    close(fds[1]);
    c.out = fds[0];
    return c;
}

std::string read_all(int fd) {
    std::string out;
    char buf[4096];
    ssize_t n;
    while ((n = read(fd, buf, sizeof buf)) > 0) out.append(buf, static_cast<std::size_t>(n));
    close(fd);
    return out;
}

int wait_exit(pid_t pid) {
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// The final-numbers line (`-f`): iterations, 50%ile, average, overall latency (us), average and
// overall bandwidth (MB/s), average and overall message rate.
std::optional<std::vector<double>> final_numbers(const std::string& output) {
    std::istringstream in(output);
    std::string line;
    std::optional<std::vector<double>> found;
    while (std::getline(in, line)) {
        std::istringstream fields(line);
        std::vector<double> v;
        double x;
        while (fields >> x) v.push_back(x);
        if (v.size() == 8 && fields.eof()) found = v;
    }
    return found;
}

} // namespace

std::string ucx_tls_for(Transport transport) {
    switch (transport) {
    case Transport::tcp: return "tcp";
    case Transport::shm: return "sm,self,tcp";
    case Transport::any: return "all";
    }
    return "all";
}

namespace {

/// One server and client pair on `port`; nullopt (and why, on stderr) when no figures came,
/// with `missing` set when there is no ucx_perftest to run.
std::optional<PerftestResult> run_perftest_on(const std::string& port, Transport transport, const std::string& test,
                                              std::size_t size, std::size_t iterations, std::size_t warmup,
                                              bool error_handling, bool& missing) {
    std::vector<std::string> env{"UCX_TLS=" + ucx_tls_for(transport)};
    if (!std::getenv("UCX_NET_DEVICES")) env.emplace_back("UCX_NET_DEVICES=lo");
    if (error_handling && transport != Transport::tcp) env.emplace_back("UCX_MM_ERROR_HANDLING=y");

    std::vector<std::string> server_argv{"ucx_perftest", "-p", port};
    if (error_handling) server_argv.emplace_back("-e");
    auto server = spawn(server_argv, env);
    if (server.pid < 0) {
        std::fprintf(stderr, "ucx_perftest not found (install ucx-utils): no bare-UCX baseline\n");
        missing = true;
        return std::nullopt;
    }
    std::this_thread::sleep_for(kServerStartup);
    std::vector<std::string> client_argv{"ucx_perftest", "127.0.0.1", "-p", port, "-t", test, "-s", std::to_string(size),
                                         "-n", std::to_string(iterations), "-w", std::to_string(warmup), "-f"};
    if (error_handling) client_argv.emplace_back("-e");
    std::string output;
    int rc = -1;
    for (int attempt = 0; attempt < kClientTries && rc != 0; ++attempt) {
        if (attempt) std::this_thread::sleep_for(kServerStartup);
        auto client = spawn(client_argv, env);
        output = read_all(client.out);
        rc = wait_exit(client.pid);
    }
    kill(server.pid, SIGTERM);
    read_all(server.out);
    wait_exit(server.pid);
    auto numbers = final_numbers(output);
    if (rc != 0 || !numbers) {
        std::fprintf(stderr, "ucx_perftest %s failed (exit %d):\n%s\n", test.c_str(), rc, output.c_str());
        return std::nullopt;
    }
    PerftestResult r;
    r.test = test;
    r.size = size;
    r.latency_us = (*numbers)[1];
    r.bandwidth_mib_s = (*numbers)[5];
    r.message_rate = (*numbers)[7];
    std::string cmd;
    for (const auto& e : env) cmd += e + " ";
    for (const auto& a : client_argv) cmd += a + " ";
    r.command = cmd;
    return r;
}

} // namespace

std::optional<PerftestResult> run_perftest(Transport transport, const std::string& test, std::size_t size,
                                           std::size_t iterations, std::size_t warmup, bool error_handling) {
    // A port picked at random may be taken (the server then exits at once, and its client
    // finds nobody): once more on another before the row goes without its floor.
    std::mt19937 rng(std::random_device{}());
    bool missing = false;
    for (int pair = 0; pair < 2 && !missing; ++pair) {
        if (pair) std::fprintf(stderr, "ucx_perftest %s: once more, on another port\n", test.c_str());
        if (auto r = run_perftest_on(std::to_string(20000 + rng() % 20000), transport, test, size, iterations, warmup,
                                     error_handling, missing))
            return r;
    }
    return std::nullopt;
}

} // namespace bitship::bench
