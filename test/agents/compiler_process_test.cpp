// The compiler process: whatever happens to a bitship-compiler while it reads a slice (a crash,
// an abort, LLVM's fatal error, a CPU or memory overrun, a forbidden system call, a SIGKILL from
// outside) is an error for that one call, naming what happened; the agent restarts the compiler
// and keeps serving, other callers' compiles included. Real xagent and compiler processes.
//
// The misbehaviour comes from the compiler's test hook (compiler_main.cpp): with
// BITSHIP_COMPILER_TEST_FAULTS=1 in its environment, a bundle listing an entry named
// bitship_test_fault_<kind> makes the compiler misbehave that way.

#include <catch2/catch.hpp>

#include <signal.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <iterator>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include <bitship/client.hpp>
#include <behaviour_kernels.hpp>

#include "launcher.hpp"

namespace compiler_process_test_cpp {

using namespace bitship;
using bitship::launch::AgentProcess;
using bitship::launch::AgentProgram;
using namespace std::chrono_literals;

namespace {

Client make_client(Transport transport = Transport::tcp) {
    ClientOptions o;
    o.transport = transport;
    o.loopback_only = true;
    // Past the compiler's wall-clock deadline (its CPU limit + 30 s), so a loaded machine shows
    // the compiler's own error rather than the client's timeout.
    o.call_timeout = 90s;
    auto c = Client::create(o);
    REQUIRE(c);
    return std::move(*c);
}

AgentProgram with_test_faults() {
    return AgentProgram{AgentProcess::binary(), {"BITSHIP_COMPILER_TEST_FAULTS=1"}};
}

/// Test kernel variant `n` (distinct bitcode, so a distinct hash: compiles of different
/// variants are never folded into one).
std::vector<std::byte> variant_bitcode(int n) {
    std::ifstream in(std::string(BITSHIP_JIT_TEST_KERNEL_DIR) + "/add_v" + std::to_string(n) + ".bc", std::ios::binary);
    std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    REQUIRE(!chars.empty());
    std::vector<std::byte> out(chars.size());
    std::memcpy(out.data(), chars.data(), chars.size());
    return out;
}

/// A file of test/agents/crafted: byte-flipped copies of test/jit's add.bc that LLVM 19's
/// bitcode reader crashes on or runs out of memory with (found by flipping bytes).
std::vector<std::byte> crafted(const std::string& name) {
    std::ifstream in(std::string(BITSHIP_CRAFTED_DIR) + "/" + name, std::ios::binary);
    std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    REQUIRE(!chars.empty());
    std::vector<std::byte> out(chars.size());
    std::memcpy(out.data(), chars.data(), chars.size());
    return out;
}

/// A one-slice bundle of `bitcode` whose one entry is `entry`.
std::vector<std::byte> bundle_of(const Target& target, std::span<const std::byte> bitcode, const std::string& entry) {
    std::vector<std::string> entries{entry};
    SliceInput slice{target.info().triple, "x86-64", "clang", target.info().llvm, bitcode};
    return write_bundle(entries, std::span(&slice, 1));
}

std::string fault_entry(const std::string& kind) { return "bitship_test_fault_" + kind; }

/// Ships variant `variant` asking the compiler for fault `kind`.
Future ship_fault(Client& client, const Target& target, const std::string& kind, int variant) {
    auto bundle = bundle_of(target, variant_bitcode(variant), fault_entry(kind));
    return client.ship_slice(bundle, 0, fault_entry(kind), target, {});
}

/// A benign call, answered correctly.
void agent_still_serves(const AgentProcess& agent) {
    auto client = make_client();
    auto t = client.connect(agent.address());
    REQUIRE(t);
    auto r = client.ship(behaviour_kernels::add, *t, std::uint64_t{3}, std::uint64_t{4}).get_as<std::uint64_t>();
    INFO(agent.log());
    REQUIRE(r);
    CHECK(*r == 7);
}

/// The agent's child processes: its compilers.
std::vector<pid_t> children_of(pid_t parent) {
    std::vector<pid_t> out;
    std::error_code ec;
    for (const auto& task : std::filesystem::directory_iterator(fmt::format("/proc/{}/task", parent), ec)) {
        std::ifstream in(task.path() / "children");
        pid_t pid = 0;
        while (in >> pid) out.push_back(pid);
    }
    return out;
}

/// /proc/PID/stat's fields after the process's name, from its state on; "" when it is gone.
std::string stat_fields(pid_t pid) {
    std::ifstream in(fmt::format("/proc/{}/stat", pid));
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    auto close = text.rfind(')');
    return close == std::string::npos || close + 2 > text.size() ? std::string() : text.substr(close + 2);
}

/// User + system CPU time of `pid`, clock ticks (0 when it is gone).
long cpu_ticks(pid_t pid) {
    const auto text = stat_fields(pid);
    if (text.empty()) return 0;
    std::istringstream fields(text);
    std::string skip;
    for (int i = 0; i < 11; ++i) fields >> skip; // state .. cmajflt
    long utime = 0, stime = 0;
    fields >> utime >> stime;
    return utime + stime;
}

/// A compile under way for as long as a test needs: fault "spin" of variant `variant`, shipped
/// to an agent with one compiler process, once that process is seen spinning (0.2 s of CPU).
struct SpinningCompile {
    pid_t compiler;
    Future call;
};
SpinningCompile spin_the_compiler(const AgentProcess& agent, Client& client, const Target& target, int variant) {
    const auto compilers = children_of(agent.pid());
    REQUIRE(compilers.size() == 1);
    auto call = ship_fault(client, target, "spin", variant);
    for (int i = 0; i < 1000 && cpu_ticks(compilers[0]) < 20; ++i) std::this_thread::sleep_for(10ms);
    REQUIRE(cpu_ticks(compilers[0]) >= 20);
    return {compilers[0], std::move(call)};
}

} // namespace

TEST_CASE("a compiler that crashes, aborts or hits LLVM's fatal error fails only that call, naming what happened",
          "[integration]") {
    AgentProcess agent(with_test_faults(), "tcp");
    auto client = make_client();
    auto target = client.connect(agent.address());
    REQUIRE(target);
    struct Case {
        std::string kind;
        std::string says;
    };
    int variant = 1;
    for (const auto& c : {Case{"segv", "compiler process killed by SIGSEGV"}, Case{"abort", "compiler process killed by SIGABRT"},
                          Case{"fatal", "LLVM fatal error: the test hook asked for a fatal error"}}) {
        auto r = ship_fault(client, *target, c.kind, variant++).get();
        INFO(c.kind << "\n" << agent.log());
        REQUIRE_FALSE(r);
        CHECK(r.error().code == Errc::compile_failed);
        CHECK_THAT(r.error().message, Catch::Contains(c.says) && Catch::Contains("while compiling slice") &&
                                          Catch::Contains("restarted"));
        agent_still_serves(agent);
    }
}

TEST_CASE("crafted bitcode that crashes LLVM's reader, or makes it run out of memory, fails that call only",
          "[integration]") {
    // No test hook: real inputs, with valid hashes. In the agent's own process either would end it.
    // One tier, so that the reader reads the whole slice at once: a first call's tier-0 compile
    // reads the module's globals first and refuses reader_segv.bc on them (a declaration with
    // an explicit section: the code policy's no-section), before the function body that crashes
    // the reader is read.
    AgentProcess agent("tcp", {"--compiler-memory-mib", "512", "--jit-tiers", "1"});
    auto client = make_client();
    auto target = client.connect(agent.address());
    REQUIRE(target);
    struct Case {
        std::string file;
        std::string says;
    };
    for (const auto& c : {Case{"reader_segv.bc", "compiler process killed by SIGSEGV while compiling slice"},
                          Case{"reader_out_of_memory.bc", "out of memory"}}) {
        auto bundle = bundle_of(*target, crafted(c.file), "add");
        std::uint64_t args[2] = {1, 2};
        auto bytes = std::as_bytes(std::span(args));
        auto r = client.ship_slice(bundle, 0, "add", *target, Bytes(bytes.begin(), bytes.end())).get();
        INFO(c.file << "\n" << agent.log());
        REQUIRE_FALSE(r);
        CHECK(r.error().code == Errc::compile_failed);
        CHECK_THAT(r.error().message, Catch::Contains(c.says) && Catch::Contains("restarted"));
        agent_still_serves(agent);
    }
}

TEST_CASE("a compile that overruns its CPU limit fails with compile_failed naming the limit", "[integration]") {
    AgentProcess agent(with_test_faults(), "tcp", {"--compiler-cpu-s", "1"});
    auto client = make_client();
    auto target = client.connect(agent.address());
    REQUIRE(target);
    auto r = ship_fault(client, *target, "spin", 4).get();
    INFO(agent.log());
    REQUIRE_FALSE(r);
    CHECK(r.error().code == Errc::compile_failed);
    CHECK_THAT(r.error().message, Catch::Contains("compiler exceeded its 1 s CPU limit while compiling slice"));
    agent_still_serves(agent);
}

TEST_CASE("the CPU limit is per compile: a compiler whose lifetime CPU passes it many times over keeps compiling",
          "[integration]") {
    // Each compile burns 0.4 s of CPU in the one compiler, under the 1 s limit; together 3.2 s.
    AgentProcess agent(with_test_faults(), "tcp", {"--compiler-processes", "1", "--compiler-cpu-s", "1", "--jit-tiers", "1"});
    auto client = make_client();
    auto target = client.connect(agent.address());
    REQUIRE(target);
    const auto compilers = children_of(agent.pid());
    REQUIRE(compilers.size() == 1);
    for (int v = 12; v <= 19; ++v) {
        auto r = ship_fault(client, *target, "burn", v).get();
        INFO("variant " << v << ": " << (r ? std::string("ok") : r.error().describe()) << "\n" << agent.log());
        // The entry the hook asks for is not in the module: an ordinary failure of this slice.
        REQUIRE_FALSE(r);
        CHECK_THAT(r.error().message, !Catch::Contains("CPU limit") && !Catch::Contains("restarted"));
    }
    CHECK(children_of(agent.pid()) == compilers);
    agent_still_serves(agent);
}

TEST_CASE("a compile that exhausts its address space fails with compile_failed naming the limit", "[integration]") {
    AgentProcess agent(with_test_faults(), "tcp", {"--compiler-memory-mib", "256"});
    auto client = make_client();
    auto target = client.connect(agent.address());
    REQUIRE(target);
    auto r = ship_fault(client, *target, "alloc", 5).get();
    INFO(agent.log());
    REQUIRE_FALSE(r);
    CHECK(r.error().code == Errc::compile_failed);
    CHECK_THAT(r.error().message, Catch::Contains("out of memory") && Catch::Contains("256 MiB"));
    agent_still_serves(agent);
}

TEST_CASE("a forbidden system call in the compiler is stopped by seccomp and reported as such", "[integration]") {
    AgentProcess agent(with_test_faults(), "tcp");
    auto client = make_client();
    auto target = client.connect(agent.address());
    REQUIRE(target);
    auto r = ship_fault(client, *target, "syscall", 6).get();
    INFO(agent.log());
    REQUIRE_FALSE(r);
    CHECK(r.error().code == Errc::compile_failed);
    CHECK_THAT(r.error().message, Catch::Contains("compiler killed by seccomp"));
    agent_still_serves(agent);
}

TEST_CASE("a compiler killed from outside mid-compile fails that call only, and the next call gets a fresh compiler",
          "[integration]") {
    AgentProcess agent(with_test_faults(), "tcp", {"--compiler-processes", "1", "--compiler-cpu-s", "60"});
    auto client = make_client();
    auto target = client.connect(agent.address());
    REQUIRE(target);
    // Killed once it is seen spinning, i.e. mid-compile.
    auto [before, pending] = spin_the_compiler(agent, client, *target, 7);
    REQUIRE(::kill(before, SIGKILL) == 0);
    auto r = pending.get();
    INFO(agent.log());
    REQUIRE_FALSE(r);
    CHECK(r.error().code == Errc::compile_failed);
    CHECK_THAT(r.error().message, Catch::Contains("compiler process killed by SIGKILL while compiling slice"));
    agent_still_serves(agent);
    auto after = children_of(agent.pid());
    REQUIRE(after.size() == 1);
    CHECK(after[0] != before);
}

TEST_CASE("while a compile is under way the agent answers other clients even with one worker", "[integration]") {
    // Compiles run on threads of their own (Agent::Impl::compile_pool): the worker that received
    // the first call goes on leading progress and running kernels. Over either transport,
    // another client's pings and a cached call are answered while the compile is under way,
    // with one worker as with two (before, one worker waited out the compile, cached calls too).
    auto transport = GENERATE(as<std::string>{}, "tcp", "shm");
    auto workers = GENERATE(as<std::string>{}, "1", "2");
    INFO(transport << ", " << workers << " worker(s)");
    AgentProcess agent(with_test_faults(), transport,
                       {"--workers", workers, "--compiler-processes", "1", "--compiler-cpu-s", "2", "--jit-tiers", "1"});
    auto client = make_client(*parse_transport(transport));
    auto bystander = make_client(*parse_transport(transport));
    auto target = client.connect(agent.address());
    auto other = bystander.connect(agent.address());
    REQUIRE(target);
    REQUIRE(other);
    REQUIRE(bystander.ship(behaviour_kernels::add, *other, std::uint64_t{3}, std::uint64_t{4}).get_as<std::uint64_t>() ==
            std::uint64_t{7});
    auto [compiler, compiling] = spin_the_compiler(agent, client, *target, 20); // 0.2 s of its 2 s limit
    for (int i = 0; i < 5; ++i) {
        auto pong = bystander.ping(*other).get();
        INFO(agent.log());
        REQUIRE(pong);
    }
    auto cached = bystander.ship(behaviour_kernels::add, *other, std::uint64_t{5}, std::uint64_t{6}).get_as<std::uint64_t>();
    REQUIRE(cached);
    CHECK(*cached == 11);
    // All of it answered before the compile ended: its compiler is still there and under its
    // limit (once over it, the agent kills it, and a process gone reads 0).
    const long spun = cpu_ticks(compiler);
    INFO("the compiler's CPU time as the cached call was answered: " << spun << " ticks of " << 2 * sysconf(_SC_CLK_TCK));
    CHECK(spun >= 20);
    CHECK(spun < 2 * sysconf(_SC_CLK_TCK));
    CHECK_FALSE(compiling.ready());
    // The spinning compile is not waited out (its CPU limit: "a compile that overruns its CPU
    // limit..."): the agent's stop ends it, and answers it shutting_down.
    CHECK(agent.stop(SIGTERM) == 0);
    auto r = compiling.get();
    REQUIRE_FALSE(r);
    CHECK(r.error().code == Errc::shutting_down);
}

TEST_CASE("compiles queued behind a compiler that dies run on its replacement and succeed", "[integration]") {
    AgentProcess agent(with_test_faults(), "tcp", {"--compiler-processes", "1", "--compiler-cpu-s", "1", "--jit-tiers", "1"});
    auto client = make_client();
    auto target = client.connect(agent.address());
    REQUIRE(target);
    auto doomed = ship_fault(client, *target, "spin", 8);
    // Other callers' kernels, shipped while the only compiler spins: they wait for it.
    std::vector<Future> others;
    for (int v = 9; v <= 11; ++v) {
        auto bundle = bundle_of(*target, variant_bitcode(v), "add");
        std::uint64_t args[2] = {std::uint64_t(v), 100};
        auto bytes = std::as_bytes(std::span(args));
        others.push_back(client.ship_slice(bundle, 0, "add", *target, Bytes(bytes.begin(), bytes.end())));
    }
    auto r = doomed.get();
    INFO(agent.log());
    REQUIRE_FALSE(r);
    CHECK_THAT(r.error().message, Catch::Contains("CPU limit"));
    for (int v = 9; v <= 11; ++v) {
        auto got = others[static_cast<std::size_t>(v - 9)].get_as<std::uint64_t>();
        INFO("variant " << v);
        REQUIRE(got);
        CHECK(*got == 2 * std::uint64_t(v) + 100); // add_vN adds N to the sum
    }
    agent_still_serves(agent);
}

TEST_CASE("an agent compiling in its own process (--compiler=in-process) ships as before and starts no compiler",
          "[integration]") {
    AgentProcess agent("tcp", {"--compiler", "in-process"});
    agent_still_serves(agent);
    CHECK(children_of(agent.pid()).empty());
}

TEST_CASE("an agent stopped during a compile exits at once and answers the call shutting_down", "[integration]") {
    // A hostile slice may spin for its whole CPU limit (10 s by default): SIGTERM does not wait
    // for it. (The launcher kills an agent still there 5 s after the signal: status SIGKILL.)
    AgentProcess agent(with_test_faults(), "tcp", {"--compiler-processes", "1", "--jit-tiers", "1"});
    auto client = make_client();
    auto target = client.connect(agent.address());
    REQUIRE(target);
    auto compiling = spin_the_compiler(agent, client, *target, 18).call;
    const int status = agent.stop(SIGTERM);
    INFO(agent.log());
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
    auto r = compiling.get();
    REQUIRE_FALSE(r);
    CHECK(r.error().code == Errc::shutting_down);
    CHECK_THAT(r.error().message, Catch::Contains("shutting down"));
}

TEST_CASE("a compiler whose agent is killed mid-compile ends itself instead of burning a core", "[integration]") {
    // The agent that watched the compile's CPU limit is gone (SIGKILL: no stop_compiles, and
    // the compiler, spinning, never reads the end of its socket).
    AgentProcess agent(with_test_faults(), "tcp", {"--compiler-processes", "1", "--jit-tiers", "1"});
    auto client = make_client();
    auto target = client.connect(agent.address());
    REQUIRE(target);
    auto [compiler, compiling] = spin_the_compiler(agent, client, *target, 17);
    agent.stop(SIGKILL);
    // Gone, or a zombie whose new parent has not reaped it: either way it runs no more. Within
    // a second of its CPU; 30 s of waiting only bounds a failing run.
    auto ended = [pid = compiler] {
        const auto fields = stat_fields(pid);
        return fields.empty() || fields.starts_with('Z');
    };
    for (int i = 0; i < 3000 && !ended(); ++i) std::this_thread::sleep_for(10ms);
    const bool gone = ended();
    if (!gone) ::kill(compiler, SIGKILL); // not left spinning after a failed run
    CHECK(gone);
    CHECK_FALSE(compiling.get()); // the call fails (the agent is gone), and does not hang
}

}  // namespace compiler_process_test_cpp
