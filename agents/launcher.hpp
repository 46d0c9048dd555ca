#pragma once
// Starts real xagent processes on loopback for integration tests and benchmarks: on a free
// port, stopped (or killed) when the caller says or when the object dies. Throws
// std::runtime_error when an agent does not come up: its callers are tests and benchmarks,
// for which that is a failure with the agent's log attached.

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace bitship::launch {

/// Which xagent to start, and what to add to its environment: another build of it (the
/// aarch64 one, run through qemu-user by binfmt) and, say, QEMU_CPU for the emulator.
struct AgentProgram {
    std::string path;
    /// Changes to the parent's environment: "NAME=VALUE" sets, "NAME" removes.
    std::vector<std::string> env;
    /// How long it may take to listen: an emulated agent starts several times slower.
    std::chrono::seconds start_timeout{20};
    /// Start it without authorized keys (open access: loopback, anyone). By default agents
    /// authorize test_keys() and clients of this process authenticate with it.
    bool open = false;
    /// The address it listens on (clients still dial 127.0.0.1): "0.0.0.0" for every interface.
    std::string listen_host = "127.0.0.1";
};

/// The key pair tests and benchmarks use: made once per process (in a temp dir removed at
/// exit), with an authorized keys file holding its public key. The first call also points
/// BITSHIP_IDENTITY at the secret key, so this process's clients, the xctl it runs and the
/// agents it starts (their --identity, for forwards) all present it.
struct TestKeys {
    std::filesystem::path secret;          ///< the secret key file (mode 0600)
    std::filesystem::path authorized_keys; ///< its public key line
    std::string fingerprint;               ///< "SHA256:..."
};
const TestKeys& test_keys();

class AgentProcess {
public:
    /// Starts xagent with `--transport transport --listen 127.0.0.1:port --authorized-keys
    /// test_keys()` plus `extra` (which may name its own --authorized-keys), and waits for it to listen. Throws (failing the test) if it does not within kStartTimeout.
    AgentProcess(std::string transport, std::vector<std::string> extra = {}, std::uint16_t port = 0);
    /// The same with `program` instead of binary().
    AgentProcess(const AgentProgram& program, std::string transport, std::vector<std::string> extra = {},
                 std::uint16_t port = 0);

    /// The xagent binary started; BITSHIP_XAGENT (set at build time) unless overridden.
    static std::string& binary();
    ~AgentProcess();
    AgentProcess(const AgentProcess&) = delete;
    AgentProcess& operator=(const AgentProcess&) = delete;

    [[nodiscard]] std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
    [[nodiscard]] std::uint16_t port() const { return port_; }
    [[nodiscard]] pid_t pid() const { return pid_; }
    /// The agent's log so far (for failure messages).
    [[nodiscard]] std::string log() const;
    /// Sends `sig` and waits for the process to end; returns its exit status as waitpid gives it.
    int stop(int sig);
    /// CPU time (user + system) the process has used, in milliseconds.
    [[nodiscard]] double cpu_ms() const;

private:
    std::filesystem::path dir_;
    pid_t pid_ = -1;
    std::uint16_t port_ = 0;
};

/// A loopback TCP port that was free a moment ago (for agents that must know their peers'
/// ports before they start).
std::uint16_t free_port();

/// A fresh empty directory under the system temp dir.
std::filesystem::path make_temp_dir(const std::string& prefix);

} // namespace bitship::launch
