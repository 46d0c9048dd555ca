// bitship-compiler: the process that reads shipped bitcode for an agent (xagent starts and
// restarts it; it is no tool for people). It speaks compiler_protocol.hpp on fd 3:
//
//   1. HELLO from the agent: the opt level, the sandbox mode, the allow-list's names and
//      libdevice's bytes (the agent reads the file: this process opens none once confined).
//   2. LLVM initialised (its native and NVPTX targets), fatal-error and out-of-memory handlers
//      installed, one throwaway compile at each tier (so every lazy first-use set-up is done),
//      then the seccomp filter (compiler_sandbox.hpp): from here on only the socket, memory,
//      clocks and exit.
//   3. READY, then COMPILE → COMPILED (object code) or PTX_COMPILED (PTX), or FAILED, one at a
//      time, until the agent closes the socket.
//
// The agent watches this process's CPU time during each COMPILE, sets its address-space limit
// after READY (prlimit), and watches the wall clock; this process ends itself when that agent
// is gone (watch_for_agent_end). Whatever stops this process (a signal, a
// limit, LLVM's fatal error) becomes an error for the one call being compiled.
//
// Test hook: with BITSHIP_COMPILER_TEST_FAULTS=1 in the environment, a bundle one of whose
// entries is named bitship_test_fault_<kind> makes this process misbehave in that way while
// compiling it: segv, abort, spin (burns CPU), burn (0.4 s of CPU, then compiles on), alloc
// (exhausts memory), syscall (a forbidden system call), fatal (LLVM's fatal error). Integration tests use it; agents never set it.
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <string_view>

#include <llvm/Support/ErrorHandling.h>

#include "compile_to_object.hpp"
#include "compiler_protocol.hpp"
#include "core/memory_reuse.hpp"
#include "compiler_sandbox.hpp"

namespace proto = bitship::jit::compiler_protocol;
using bitship::Errc;

namespace {

constexpr int kExitFatal = 70;       // EX_SOFTWARE: LLVM's fatal error
constexpr int kExitOutOfMemory = 71; // out of memory (the agent's address-space limit)
constexpr int kExitOrphaned = 72;    // its agent is gone (watch_for_agent_end)
constexpr int kExitProtocol = 76;    // EX_PROTOCOL: the agent said something we cannot use
constexpr std::size_t kMessageBytes = 900;
constexpr std::string_view kFaultPrefix = "bitship_test_fault_";

/// The request being compiled, for the handlers that report on the way out.
std::atomic<std::uint64_t> g_request{0};

/// `prefix` + `text` into `buf`, cut to fit: no allocation (the heap may be what failed).
std::string_view join(char (&buf)[kMessageBytes], std::string_view prefix, const char* text) {
    std::size_t n = std::min(prefix.size(), sizeof buf);
    std::memcpy(buf, prefix.data(), n);
    if (text != nullptr) {
        std::size_t t = std::min(std::strlen(text), sizeof buf - n);
        std::memcpy(buf + n, text, t);
        n += t;
    }
    return {buf, n};
}

[[noreturn]] void report_and_exit(Errc code, std::string_view prefix, const char* reason, int status) {
    char buf[kMessageBytes];
    proto::write_fatal_frame(proto::kCompilerFd, g_request.load(), code, join(buf, prefix, reason));
    ::_exit(status);
}

void on_llvm_fatal_error(void*, const char* reason, bool) {
    report_and_exit(Errc::compile_failed, "LLVM fatal error: ", reason, kExitFatal);
}

void on_llvm_bad_alloc(void*, const char* reason, bool) {
    report_and_exit(Errc::compile_failed, "out of memory: ", reason, kExitOutOfMemory);
}

void on_new_failure() { report_and_exit(Errc::compile_failed, "out of memory", nullptr, kExitOutOfMemory); }

/// The test hook's fault for `bundle`, if the hook is on and the bundle asks for one.
std::string fault_asked(std::span<const std::byte> bundle) {
    static const bool enabled = [] {
        const char* v = std::getenv("BITSHIP_COMPILER_TEST_FAULTS");
        return v != nullptr && std::string_view(v) == "1";
    }();
    if (!enabled) return {};
    auto view = bitship::BundleView::parse(bundle);
    if (!view) return {};
    for (const auto& e : view->entries)
        if (std::string_view(e).starts_with(kFaultPrefix)) return std::string(std::string_view(e).substr(kFaultPrefix.size()));
    return {};
}

void misbehave(const std::string& kind) {
    if (kind == "segv") {
        volatile int* nowhere = nullptr;
        *nowhere = 1;
    } else if (kind == "abort") {
        std::abort();
    } else if (kind == "spin") {
        std::atomic<std::uint64_t> turns{0};
        for (;;) turns.fetch_add(1, std::memory_order_relaxed);
    } else if (kind == "burn") {
        // 400 ms of CPU, then the compile goes on: below a 1 s limit each time, past it in all.
        auto cpu_ns = [] {
            timespec t{};
            ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
            return t.tv_sec * 1'000'000'000LL + t.tv_nsec;
        };
        const auto until = cpu_ns() + 400'000'000LL;
        std::atomic<std::uint64_t> turns{0};
        while (cpu_ns() < until) turns.fetch_add(1, std::memory_order_relaxed);
    } else if (kind == "alloc") {
        // As LLVM's own allocations do (safe_malloc): a failed malloc is a bad-alloc error.
        constexpr std::size_t kChunk = 64u << 20;
        for (;;) {
            void* p = std::malloc(kChunk);
            if (p == nullptr) llvm::report_bad_alloc_error("the test hook exhausted the address space");
            std::memset(p, 1, kChunk);
        }
    } else if (kind == "syscall") {
        (void)::socket(AF_INET, SOCK_STREAM, 0);
    } else if (kind == "fatal") {
        llvm::report_fatal_error("the test hook asked for a fatal error");
    }
}

bool send(const std::vector<std::byte>& payload) { return proto::write_frame(proto::kCompilerFd, payload).has_value(); }

pid_t g_agent = 0; ///< the agent that started this process

void on_cpu_second(int) {
    if (::getppid() != g_agent) ::_exit(kExitOrphaned);
}

/// An idle compiler learns of its agent's end from its socket (end of file). A busy one (LLVM
/// spinning on hostile bitcode) reads nothing, and the agent that enforced its limits is gone:
/// without this it would burn a core for ever. After each second of this process's user CPU
/// (ITIMER_VIRTUAL: an idle process gets no signal, so no wake-up), SIGVTALRM checks that the
/// parent is still the agent; a process whose parent died is given to another.
void watch_for_agent_end() {
    g_agent = ::getppid();
    struct sigaction on_second {};
    on_second.sa_handler = on_cpu_second;
    on_second.sa_flags = SA_RESTART;
    sigemptyset(&on_second.sa_mask);
    const itimerval every_second{{1, 0}, {1, 0}};
    if (::sigaction(SIGVTALRM, &on_second, nullptr) != 0 || ::setitimer(ITIMER_VIRTUAL, &every_second, nullptr) != 0)
        std::fprintf(stderr, "bitship-compiler: cannot watch for its agent's end: %s\n", std::strerror(errno));
}

} // namespace

/// In sanitizer builds: a fault in LLVM ends this process by its signal (as in a plain build, so
/// the agent names it), allocations fail by returning null (LLVM reports them), and there is no
/// leak check at exit (the seccomp filter forbids what it needs).
extern "C" const char* __asan_default_options() {
    return "handle_segv=0:handle_sigbus=0:handle_sigfpe=0:handle_sigill=0:allocator_may_return_null=1:detect_leaks=0";
}

int main(int argc, char** argv) {
    if (argc > 1) {
        std::fprintf(stderr, "bitship-compiler: started by xagent, which speaks to it on fd %d; it takes no options (%s)\n",
                     proto::kCompilerFd, argv[1]);
        return 2;
    }
    watch_for_agent_end();
    // A crash leaves no core file behind: the agent reports it.
    rlimit no_core{0, 0};
    (void)::setrlimit(RLIMIT_CORE, &no_core);

    // 1. HELLO.
    auto hello_frame = proto::read_frame(proto::kCompilerFd, proto::kMaxRequestFrame);
    if (!hello_frame) return kExitProtocol;
    auto hello = proto::decode_hello(*hello_frame);
    if (!hello) {
        (void)send(proto::encode(proto::CompileFailure{0, hello.error(), true}));
        return kExitProtocol;
    }

    // 2. LLVM, its handlers, a warm-up, the filter. What a compile frees stays in the heap for
    //    the next one: glibc would otherwise give it back, and each compile would fault its
    //    memory in again, page by page (memory_reuse.hpp).
    bitship::keep_freed_memory(std::size_t{32} << 20);
    llvm::install_fatal_error_handler(on_llvm_fatal_error, nullptr);
    llvm::install_bad_alloc_error_handler(on_llvm_bad_alloc, nullptr);
    std::set_new_handler(on_new_failure);
    bitship::jit::SymbolNames allowed(hello->allowed.begin(), hello->allowed.end());
    auto compiler = bitship::jit::InProcessCompiler::create(std::move(allowed), hello->opt_level, hello->sandbox,
                                                            std::move(hello->libdevice));
    if (!compiler) {
        (void)send(proto::encode(proto::CompileFailure{0, compiler.error(), true}));
        return kExitFatal;
    }
    auto warm = bitship::jit::warm_up_bundle();
    for (auto tier : {bitship::jit::Tier::fast, bitship::jit::Tier::optimised}) {
        if (auto made = (*compiler)->compile(warm.bundle, warm.hash, tier); !made) {
            (void)send(proto::encode(proto::CompileFailure{0, made.error(), true}));
            return kExitFatal;
        }
    }
    proto::Ready ready;
    if (auto confined = bitship::jit::confine_compiler(proto::kCompilerFd); confined) {
        ready.confined = true;
    } else {
        ready.note = confined.error().message;
    }
    if (!send(proto::encode(ready))) return kExitProtocol;

    // 3. One compile at a time, until the agent closes the socket.
    for (;;) {
        auto frame = proto::read_frame(proto::kCompilerFd, proto::kMaxRequestFrame);
        // _exit: nothing is left to flush, and no exit-time work may need a forbidden call.
        if (!frame) ::_exit(frame.error().code == Errc::disconnected ? 0 : kExitProtocol);
        auto request = proto::decode_compile(*frame);
        if (!request) {
            (void)send(proto::encode(proto::CompileFailure{0, request.error(), true}));
            return kExitProtocol;
        }
        g_request.store(request->id);
        if (auto fault = fault_asked(request->bundle); !fault.empty()) misbehave(fault);
        std::vector<std::byte> reply;
        try {
            if (request->target == proto::Target::ptx) {
                auto made = (*compiler)->compile_ptx(request->bundle, request->expected, request->sm);
                reply = made ? proto::encode(proto::PtxReply{request->id, std::move(*made)})
                             : proto::encode(proto::CompileFailure{request->id, made.error(), false});
            } else {
                auto made = (*compiler)->compile(request->bundle, request->expected, request->tier, request->only);
                reply = made ? proto::encode(proto::CompileReply{request->id, std::move(*made)})
                             : proto::encode(proto::CompileFailure{request->id, made.error(), false});
            }
        } catch (const std::bad_alloc&) {
            on_new_failure();
        }
        if (!send(reply)) return kExitProtocol;
    }
}
