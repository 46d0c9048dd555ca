// CompilerProcesses: the agent's pool of bitship-compiler processes (see compiler_processes.hpp).
#include "compiler_processes.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <mutex>
#include <optional>
#include <thread>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "compiler_protocol.hpp"
#include "core/child_process.hpp"

namespace bitship::jit {
namespace proto = compiler_protocol;
namespace {

using Clock = std::chrono::steady_clock;
/// LLVM's initialisation and the warm-up compiles; generous for a loaded machine or an emulator.
constexpr auto kStartTimeout = std::chrono::seconds(120);
/// The wall-clock deadline of a compile: its CPU limit times kWallPerCpu, and at least the CPU
/// limit plus kWallSlack, so that a compile on a loaded machine (a few percent of a core) still
/// meets its CPU limit first, while a stopped or blocked compiler does not hold a call forever.
constexpr int kWallPerCpu = 4;
constexpr auto kWallSlack = std::chrono::seconds(30);
constexpr const char* kProgramName = "bitship-compiler";
/// A compiler that sent a fatal FAILED exits right after: how long it gets.
constexpr auto kFatalExitGrace = std::chrono::milliseconds(1000);
/// How often a compiler's CPU time is looked at while it works.
constexpr auto kCpuPoll = std::chrono::milliseconds(20);
/// How long the caller of a tier-0 compile (a first call waits for it) polls for the reply
/// before it sleeps: a thread woken from sleep when the reply comes starts 0.1-0.15 ms later
/// here (a VM's idle core), and a cold tier-0 compile takes 1-3 ms. It yields its core while
/// it polls, so a compiler process queued on the same core runs first.
constexpr auto kFastReplySpin = std::chrono::milliseconds(5);

/// The CPU time `pid` has used so far (user + system), or nullopt.
std::optional<std::chrono::nanoseconds> cpu_used(pid_t pid) {
    clockid_t clock{};
    if (::clock_getcpuclockid(pid, &clock) != 0) return std::nullopt;
    timespec t{};
    if (::clock_gettime(clock, &t) != 0) return std::nullopt;
    return std::chrono::seconds(t.tv_sec) + std::chrono::nanoseconds(t.tv_nsec);
}

/// The virtual size of `pid`, bytes (/proc/PID/statm's first field), or nullopt.
std::optional<std::size_t> address_space(pid_t pid) {
    std::ifstream statm(fmt::format("/proc/{}/statm", pid));
    std::size_t pages = 0;
    if (!(statm >> pages)) return std::nullopt;
    return pages * static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
}

} // namespace

/// One slot of the pool: a compiler process and the agent's end of its socket. (Not in the
/// anonymous namespace: CompilerProcesses::State, declared in the header, holds them.)
struct CompilerProcess {
    pid_t pid = -1;
    int fd = -1; // the agent's end of the socket
    bool ready = false;
};

Result<std::filesystem::path> find_compiler_program(const std::filesystem::path& configured) {
    std::filesystem::path program = configured;
    if (program.empty()) {
        std::error_code ec;
        auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
        if (ec) return fail(Errc::io_error, fmt::format("cannot read /proc/self/exe to find {}: {}", kProgramName, ec.message()));
        program = self.parent_path() / kProgramName;
    }
    if (::access(program.c_str(), X_OK) != 0)
        return fail(Errc::io_error, fmt::format("no compiler program at {} ({}): give its path (xagent --compiler-path), "
                                                "or compile in the agent (--compiler=in-process)",
                                                program.string(), std::strerror(errno)));
    return program;
}

struct CompilerProcesses::State {
    CompilerProcessOptions options;
    std::vector<std::byte> hello; // the same for every process
    mutable std::mutex mutex;
    std::condition_variable freed;
    std::atomic<bool> stopping{false}; ///< stop_compiles(): no compile starts, those under way end
    std::vector<CompilerProcess> slots;
    std::vector<bool> busy;
    std::uint64_t next_id = 1;
    std::atomic<bool> warned_unconfined{false};

    ~State() {
        for (auto& p : slots) stop(p);
    }

    /// A new process in `p`, HELLO sent; READY is awaited by the first compile (await_ready).
    Result<void> spawn(CompilerProcess& p) {
        // Its end of the socket on fd 3, stdin from /dev/null, stdout and stderr shared with the
        // agent (its log), and no other descriptor of the agent's (UCX sockets, files).
        auto child = spawn_with_socket({options.program.string()}, proto::kCompilerFd);
        if (!child) return tl::make_unexpected(child.error());
        const std::string program = options.program.string();
        p = CompilerProcess{child->pid, child->fd, false};
        if (auto sent = proto::write_frame(p.fd, hello); !sent) {
            auto why = reap(p);
            return fail(Errc::io_error, fmt::format("{} did not take its start-up message ({})", program, why));
        }
        return {};
    }

    /// Waits for READY; then sets the address-space limit.
    Result<void> await_ready(CompilerProcess& p) {
        auto frame = proto::read_frame(p.fd, proto::kMaxReplyFrame, Clock::now() + kStartTimeout);
        auto failed = [&](std::string why) -> Result<void> {
            auto death = reap(p);
            return fail(Errc::compile_failed, fmt::format("the compiler process did not start: {}{}", why,
                                                          death.empty() ? "" : " (" + death + ")"));
        };
        if (!frame) return failed(frame.error().message);
        auto type = proto::type_of(*frame);
        if (type && *type == proto::Type::failed) {
            auto f = proto::decode_failed(*frame);
            return failed(f ? f->error.describe() : f.error().message);
        }
        auto ready = proto::decode_ready(*frame);
        if (!ready) return failed(ready.error().message);
        if (!ready->confined && !warned_unconfined.exchange(true)) {
            spdlog::warn("jit: the compiler process runs without its seccomp filter: {}", ready->note);
        }
        // The limit counts from its size now: libLLVM, the allocator's arenas, the warm-up.
        if (auto size = address_space(p.pid)) {
            rlimit as{*size + options.memory_bytes, *size + options.memory_bytes};
            if (::prlimit(p.pid, RLIMIT_AS, &as, nullptr) != 0)
                spdlog::warn("jit: cannot limit the compiler's address space: {}", std::strerror(errno));
        }
        p.ready = true;
        return {};
    }

    /// Kills `p` if it still runs, reaps it, and says how it ended ("" when it exited cleanly).
    /// `cpu_at_start`: its CPU time when the current compile began, to tell a CPU-limit SIGKILL.
    std::string reap(CompilerProcess& p, std::optional<std::chrono::nanoseconds> cpu_at_start = std::nullopt,
                     bool killed_by_us = false, std::chrono::milliseconds grace = std::chrono::milliseconds(0)) {
        if (p.fd >= 0) ::close(p.fd);
        p.fd = -1;
        p.ready = false;
        if (p.pid < 0) return {};
        // One that said its last word gets `grace` to exit by itself; one still running after
        // that (or that sent garbage, or overran the wall clock) is stopped.
        const ChildEnd end = end_child(p.pid, grace);
        p.pid = -1;
        if (!end.known) return "its exit status is unknown";
        if (end.exited) return end.status == 0 ? "" : fmt::format("it exited with status {}", end.status);
        if (end.signal == 0) return "it stopped";
        const rusage& usage = end.usage;
        const int sig = end.signal;
        auto used = std::chrono::seconds(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
                    std::chrono::microseconds(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
        const bool over_cpu = cpu_at_start && used - *cpu_at_start >= options.cpu_limit;
        if (sig == SIGXCPU || (sig == SIGKILL && over_cpu && !killed_by_us))
            return fmt::format("compiler exceeded its {} s CPU limit", options.cpu_limit.count());
        if (sig == SIGSYS) return "compiler killed by seccomp (it made a forbidden system call)";
        if (killed_by_us) return "";
        return fmt::format("compiler process killed by {}", signal_name(sig));
    }

    /// Waits for `p` to say something (or close its socket), or for `deadline`; false once it
    /// has used its CPU limit since `cpu_at_start`, or once `stopping` is set, looked at every
    /// kCpuPoll. Polls without sleeping for the first `spin`.
    bool await_reply(const CompilerProcess& p, std::chrono::nanoseconds cpu_at_start, Clock::time_point deadline,
                     Clock::duration spin) {
        for (const auto until = Clock::now() + spin; spin > Clock::duration::zero();) {
            pollfd ready{p.fd, POLLIN, 0};
            const int n = ::poll(&ready, 1, 0);
            if (n != 0 && !(n < 0 && errno == EINTR)) return true;
            if (Clock::now() >= until) break;
            std::this_thread::yield();
        }
        for (;;) {
            pollfd ready{p.fd, POLLIN, 0};
            const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
            if (left.count() <= 0) return true; // read_frame reports the wall clock
            const int n = ::poll(&ready, 1, static_cast<int>(std::min(left, kCpuPoll).count()));
            if (n != 0 && !(n < 0 && errno == EINTR)) return true; // readable, closed, or an error read_frame names
            if (stopping.load(std::memory_order_relaxed)) return false;
            auto used = cpu_used(p.pid);
            if (used && *used - cpu_at_start >= options.cpu_limit) return false;
        }
    }

    void stop(CompilerProcess& p) {
        if (p.pid >= 0) (void)reap(p);
    }

    /// Index of a free slot, now marked busy (waits while all are busy); nullopt once `stopping`.
    std::optional<std::size_t> acquire() {
        std::unique_lock lock(mutex);
        for (;;) {
            if (stopping.load(std::memory_order_relaxed)) return std::nullopt;
            for (std::size_t i = 0; i < slots.size(); ++i)
                if (!busy[i]) {
                    busy[i] = true;
                    return i;
                }
            freed.wait(lock);
        }
    }
    void release(std::size_t i) {
        {
            std::lock_guard lock(mutex);
            busy[i] = false;
        }
        freed.notify_one();
    }

    /// `p` alive and READY: replaced if it died while idle, started if it never was.
    Result<void> ensure_ready(CompilerProcess& p) {
        if (p.pid >= 0) {
            int status = 0;
            if (::waitpid(p.pid, &status, WNOHANG) == p.pid) {
                // Already reaped here, so reap() below only closes the socket.
                p.pid = -1;
                spdlog::warn("jit: a compiler process died while idle ({}); starting another",
                             WIFSIGNALED(status) ? signal_name(WTERMSIG(status)) : fmt::format("status {}", WEXITSTATUS(status)));
                (void)reap(p);
            }
        }
        if (p.pid < 0)
            if (auto s = spawn(p); !s) return s;
        if (!p.ready) return await_ready(p);
        return {};
    }

    /// After a failure: the slot gets a fresh process at once (its start-up overlaps whatever
    /// comes next; the next compile there waits for its READY).
    void restart(CompilerProcess& p) {
        if (auto s = spawn(p); !s) spdlog::warn("jit: restarting a compiler process: {}", s.error().describe());
    }
};

CompilerProcesses::CompilerProcesses(std::unique_ptr<State> state) : state_(std::move(state)) {}
CompilerProcesses::~CompilerProcesses() = default;

Result<std::unique_ptr<CompilerProcesses>> CompilerProcesses::start(CompilerProcessOptions options) {
    if (options.processes == 0) return fail(Errc::invalid_argument, "at least one compiler process");
    if (options.cpu_limit.count() <= 0) return fail(Errc::invalid_argument, "the compiler's CPU limit must be positive");
    auto state = std::make_unique<State>();
    proto::Hello hello;
    hello.opt_level = options.opt_level;
    hello.sandbox = options.sandbox;
    hello.allowed = options.allowed;
    hello.libdevice = std::move(options.libdevice);
    state->hello = proto::encode(hello);
    state->options = std::move(options);
    state->slots.resize(state->options.processes);
    state->busy.assign(state->options.processes, false);
    // All start at once; then each is waited for.
    for (auto& p : state->slots)
        if (auto s = state->spawn(p); !s) return tl::make_unexpected(s.error());
    for (auto& p : state->slots)
        if (auto r = state->await_ready(p); !r) return tl::make_unexpected(r.error());
    spdlog::debug("jit: {} compiler processes ({}), {} s CPU and {} MiB address space per compile",
                  state->slots.size(), state->options.program.string(), state->options.cpu_limit.count(),
                  state->options.memory_bytes >> 20);
    return std::unique_ptr<CompilerProcesses>(new CompilerProcesses(std::move(state)));
}

namespace {

/// What one reply type becomes: a decoded COMPILED or PTX_COMPILED, checked against its request.
template <class Made> struct Accepted {
    std::optional<Made> made;
    std::string why_not; ///< when `made` is empty: what was wrong with the reply
};

/// Steps 1-4 of every compile through a process: `request(id)` (the encoded COMPILE) goes to a
/// free process, and its answer of type `reply` becomes what `accept` makes of the frame; a FAILED
/// becomes its error. Whatever else the process does (dies, overruns a limit, sends garbage or
/// something `accept` refuses) is compile_failed naming it, and the process is replaced.
template <class Made, class Request, class Accept>
Result<Made> exchange(CompilerProcesses::State& st, std::span<const std::byte> bundle, const CodeHash& expected,
                      Clock::duration spin, Request request_for, proto::Type reply, Accept accept) {
    const std::string hex = to_hex(expected, kHashDigitsInMessages);
    if (bundle.size() > proto::kMaxRequestFrame - 64)
        return fail(Errc::too_large, fmt::format("slice {}: a bundle of {} bytes is more than a compiler takes", hex, bundle.size()));
    const auto acquired = st.acquire();
    if (!acquired) return fail(Errc::shutting_down, fmt::format("slice {} is not compiled: the agent is shutting down", hex));
    const std::size_t slot = *acquired;
    struct Release {
        CompilerProcesses::State& st;
        std::size_t slot;
        ~Release() { st.release(slot); }
    } release{st, slot};
    CompilerProcess& p = st.slots[slot];

    std::uint64_t id = 0;
    {
        std::lock_guard lock(st.mutex);
        id = st.next_id++;
    }
    const auto request = request_for(id);
    std::optional<std::chrono::nanoseconds> cpu_at_start;
    // 1. A live, ready process takes the request. One that turns out dead before it has read a
    //    byte of it (killed while idle) is replaced and the request sent again, once.
    for (int attempt = 0;; ++attempt) {
        if (auto ready = st.ensure_ready(p); !ready) return tl::make_unexpected(ready.error());
        // 2. Its CPU limit counts from what it has used so far (watched in 3, not by RLIMIT_CPU:
        //    raising a live process's RLIMIT_CPU with prlimit does not move the kernel's
        //    SIGXCPU, so a long-lived compiler was killed once its lifetime CPU passed the first
        //    limit set).
        cpu_at_start = cpu_used(p.pid);
        if (proto::write_frame(p.fd, request)) break;
        auto death = st.reap(p);
        if (attempt > 0)
            return fail(Errc::compile_failed, fmt::format("the compiler process would not take slice {} ({})", hex, death));
    }

    // 3. The answer, by the wall-clock deadline and within the CPU limit.
    const auto wall = std::max(st.options.cpu_limit * kWallPerCpu, st.options.cpu_limit + kWallSlack);
    const auto deadline = Clock::now() + wall;
    auto died = [&](std::string what) -> Result<Made> {
        st.restart(p);
        return fail(Errc::compile_failed, fmt::format("{} while compiling slice {} (the compiler was restarted; this slice "
                                                      "is not retried)", what, hex));
    };
    if (cpu_at_start && !st.await_reply(p, *cpu_at_start, deadline, spin)) {
        (void)st.reap(p, cpu_at_start, true);
        if (st.stopping.load(std::memory_order_relaxed)) // stop_compiles(): not the slice's doing
            return fail(Errc::shutting_down, fmt::format("the compile of slice {} was stopped: the agent is shutting down", hex));
        return died(fmt::format("compiler exceeded its {} s CPU limit", st.options.cpu_limit.count()));
    }
    auto frame = proto::read_frame(p.fd, proto::kMaxReplyFrame, deadline);
    if (!frame) {
        if (frame.error().code == Errc::timeout) {
            (void)st.reap(p, cpu_at_start, true);
            return died(fmt::format("compiler took longer than {} s (wall clock) and was killed", wall.count()));
        }
        auto death = st.reap(p, cpu_at_start);
        if (frame.error().code == Errc::too_large) death = "compiler process sent a reply over the size cap (" + frame.error().message + ")";
        return died(death.empty() ? "compiler process exited" : death);
    }
    // 4. Decoded as hostile bytes: any inconsistency kills the process.
    auto type = proto::type_of(*frame);
    if (type && *type == reply) {
        Accepted<Made> accepted = accept(*frame, id);
        if (accepted.made) return std::move(*accepted.made);
        (void)st.reap(p, cpu_at_start, true);
        return died(fmt::format("compiler process sent a malformed reply ({})", accepted.why_not));
    }
    if (type && *type == proto::Type::failed) {
        auto failure = proto::decode_failed(*frame);
        if (failure && !failure->fatal && failure->id == id) return tl::make_unexpected(failure->error);
        if (failure && failure->fatal) {
            // Its last word: it exits right after.
            auto death = st.reap(p, cpu_at_start, false, kFatalExitGrace);
            std::string what = "compiler process: " + failure->error.message;
            if (failure->error.message.starts_with("out of memory"))
                what += fmt::format(" (its limit is {} MiB of address space beyond its start-up size)", st.options.memory_bytes >> 20);
            if (!death.empty() && !death.starts_with("it exited")) what += " (" + death + ")";
            st.restart(p);
            return fail(failure->error.code, fmt::format("{} while compiling slice {} (the compiler was restarted; this "
                                                         "slice is not retried)", what, hex));
        }
    }
    (void)st.reap(p, cpu_at_start, true);
    return died("compiler process sent a malformed reply");
}

} // namespace

Result<CompiledObject> CompilerProcesses::compile(std::span<const std::byte> bundle, const CodeHash& expected, Tier tier,
                                                  std::string_view only) {
    return exchange<CompiledObject>(
        *state_, bundle, expected, tier == Tier::fast ? Clock::duration(kFastReplySpin) : Clock::duration::zero(),
        [&](std::uint64_t id) { return proto::encode(proto::CompileRequest{id, tier, expected, bundle, only}); },
        proto::Type::compiled, [&](std::span<const std::byte> frame, std::uint64_t id) -> Accepted<CompiledObject> {
            auto reply = proto::decode_compiled(frame);
            if (!reply) return {std::nullopt, reply.error().message};
            if (reply->id != id) return {std::nullopt, "another request's id"};
            if (reply->made.slice_bundle.size() > bundle.size()) return {std::nullopt, "a slice larger than the bundle"};
            return {std::move(reply->made), {}};
        });
}

Result<CompiledPtx> CompilerProcesses::compile_ptx(std::span<const std::byte> bundle, const CodeHash& expected, unsigned sm) {
    return exchange<CompiledPtx>(
        *state_, bundle, expected, Clock::duration::zero(),
        [&](std::uint64_t id) {
            proto::CompileRequest request{id, Tier::optimised, expected, bundle, {}};
            request.target = proto::Target::ptx;
            request.sm = sm;
            return proto::encode(request);
        },
        proto::Type::compiled_ptx, [&](std::span<const std::byte> frame, std::uint64_t id) -> Accepted<CompiledPtx> {
            auto reply = proto::decode_compiled_ptx(frame);
            if (!reply) return {std::nullopt, reply.error().message};
            if (reply->id != id) return {std::nullopt, "another request's id"};
            if (reply->made.slice_bundle.size() > bundle.size()) return {std::nullopt, "a slice larger than the bundle"};
            return {std::move(reply->made), {}};
        });
}

void CompilerProcesses::stop_compiles() {
    {
        std::lock_guard lock(state_->mutex); // an acquire() between its check and its wait sees it
        state_->stopping.store(true);
    }
    state_->freed.notify_all();
}

} // namespace bitship::jit
