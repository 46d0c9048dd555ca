#include <sys/prctl.h>
#include "launcher.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string_view>
#include <thread>

#include <bitship/identity.hpp>

namespace bitship::launch {
namespace {
constexpr auto kStartTimeout = std::chrono::seconds(20);
constexpr auto kStopTimeout = std::chrono::seconds(5);
} // namespace

std::string& AgentProcess::binary() {
    static std::string path = BITSHIP_XAGENT;
    return path;
}

std::uint16_t free_port() {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
        if (fd >= 0) close(fd);
        throw std::runtime_error("cannot find a free port");
    }
    close(fd);
    return ntohs(addr.sin_port);
}

std::filesystem::path make_temp_dir(const std::string& prefix) {
    std::string templ = (std::filesystem::temp_directory_path() / (prefix + "XXXXXX")).string();
    if (!mkdtemp(templ.data())) throw std::runtime_error("mkdtemp failed");
    return templ;
}

namespace {
// Owns test_keys()'s directory for the life of the process.
struct TestKeyDir {
    TestKeys keys;
    std::filesystem::path dir;
    ~TestKeyDir() {
        std::error_code ec;
        if (!dir.empty()) std::filesystem::remove_all(dir, ec);
    }
};
} // namespace

const TestKeys& test_keys() {
    static const TestKeyDir made = [] {
        TestKeyDir d;
        d.dir = make_temp_dir("bitship-keys-");
        auto id = Identity::generate("bitship-test");
        if (!id) throw std::runtime_error("cannot make the test key: " + id.error().describe());
        d.keys.secret = d.dir / "id";
        if (auto saved = id->save(d.keys.secret); !saved)
            throw std::runtime_error("cannot save the test key: " + saved.error().describe());
        d.keys.authorized_keys = d.dir / "authorized_keys";
        std::ofstream(d.keys.authorized_keys) << "# made by the test launcher\n" << id->public_line() << "\n";
        std::filesystem::permissions(d.keys.authorized_keys, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
        d.keys.fingerprint = fingerprint(id->public_key());
        setenv("BITSHIP_IDENTITY", d.keys.secret.c_str(), 1);
        return d;
    }();
    return made.keys;
}

AgentProcess::AgentProcess(std::string transport, std::vector<std::string> extra, std::uint16_t port)
    : AgentProcess(AgentProgram{binary(), {}, kStartTimeout}, std::move(transport), std::move(extra), port) {}

AgentProcess::AgentProcess(const AgentProgram& program, std::string transport, std::vector<std::string> extra,
                           std::uint16_t port)
    : dir_(make_temp_dir("bitship-agent-")) {
    const auto& keys = test_keys(); // before the environment is copied: it sets BITSHIP_IDENTITY
    auto port_file = dir_ / "port";
    auto log_file = dir_ / "agent.log";
    // The child's environment is built before fork: after it, only async-signal-safe calls.
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e) {
        std::string_view entry(*e);
        auto name = entry.substr(0, entry.find('=') + 1);
        bool replaced = std::any_of(program.env.begin(), program.env.end(), [&](const std::string& x) {
            return x.starts_with(name) || x + "=" == name;
        });
        if (!replaced) env.emplace_back(entry);
    }
    for (const auto& x : program.env)
        if (x.find('=') != std::string::npos) env.push_back(x);
    std::vector<char*> envp;
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    std::vector<std::string> args{program.path, "--listen", program.listen_host + ":" + std::to_string(port), "--transport", transport,
                                  "--port-file", port_file.string(), "--loopback"};
    if (std::find(extra.begin(), extra.end(), "--log-level") == extra.end()) args.insert(args.end(), {"--log-level", "info"});
    if (!program.open && std::find(extra.begin(), extra.end(), "--authorized-keys") == extra.end())
        args.insert(args.end(), {"--authorized-keys", keys.authorized_keys.string()});
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t parent = getpid();
    pid_ = fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
        // A test or benchmark killed before it tears its agents down takes them with it
        // (otherwise a spinning agent outlives it and takes a core).
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent) _exit(127);
        int log = open(log_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (log >= 0) {
            dup2(log, STDOUT_FILENO);
            dup2(log, STDERR_FILENO);
        }
        execve(argv[0], argv.data(), envp.data());
        _exit(127);
    }
    auto deadline = std::chrono::steady_clock::now() + program.start_timeout;
    while (std::chrono::steady_clock::now() < deadline) {
        std::ifstream in(port_file);
        unsigned p = 0;
        if (in >> p && p > 0) {
            port_ = static_cast<std::uint16_t>(p);
            return;
        }
        int status = 0;
        if (waitpid(pid_, &status, WNOHANG) == pid_) {
            pid_ = -1;
            throw std::runtime_error("xagent exited at start:\n" + log());
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    stop(SIGKILL);
    throw std::runtime_error("xagent did not listen within the start timeout:\n" + log());
}

AgentProcess::~AgentProcess() {
    if (pid_ > 0) stop(SIGTERM);
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
}

std::string AgentProcess::log() const {
    std::ifstream in(dir_ / "agent.log");
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
}

int AgentProcess::stop(int sig) {
    if (pid_ <= 0) return -1;
    kill(pid_, sig);
    auto deadline = std::chrono::steady_clock::now() + kStopTimeout;
    int status = 0;
    while (waitpid(pid_, &status, WNOHANG) == 0) {
        if (std::chrono::steady_clock::now() > deadline) {
            kill(pid_, SIGKILL);
            waitpid(pid_, &status, 0);
            break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    pid_ = -1;
    return status;
}

double AgentProcess::cpu_ms() const {
    std::ifstream in("/proc/" + std::to_string(pid_) + "/stat");
    std::string line;
    std::getline(in, line);
    // Fields after the ")" that closes the command name; utime and stime are fields 14 and 15.
    std::istringstream rest(line.substr(line.rfind(')') + 2));
    std::string field;
    unsigned long utime = 0, stime = 0;
    for (int i = 3; i <= 15 && rest >> field; ++i) {
        if (i == 14) utime = std::stoul(field);
        if (i == 15) stime = std::stoul(field);
    }
    return (utime + stime) * 1000.0 / static_cast<double>(sysconf(_SC_CLK_TCK));
}

} // namespace bitship::launch
