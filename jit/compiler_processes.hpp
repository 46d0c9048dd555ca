#pragma once
// The agent's side of the compiler processes: a small pool of long-lived bitship-compiler
// processes (compiler_main.cpp), each compiling one slice at a time, started at agent start and
// restarted when one dies. Private to jit/.
//
// PTX compiles (compile_ptx) go the same way, one at a time in the same processes, under the same
// limits; their reply is PTX_COMPILED instead of COMPILED.
//
// Per compile: a CPU-time limit (the process's CPU clock, read every 20 ms while the agent waits,
// relative to what it had used before the request; the process is killed past it. Not
// RLIMIT_CPU: raising it on a live process does not move the kernel's SIGXCPU, so a
// long-lived compiler died once its lifetime CPU passed the first limit), a wall-clock deadline (the process is killed past it),
// and an address-space limit (RLIMIT_AS: the process's size after start-up plus a budget). What
// stops a compiler becomes compile_failed for the one caller whose slice it was compiling,
// naming what happened ("compiler process killed by SIGSEGV while compiling slice 3fa2…"); that
// slice is not retried (it would do the same again). Other callers wait for a free process and
// never see the dead one; a process found dead while idle is replaced before it is given work.
// Everything a compiler sends is decoded with bounds checks and size caps.
//
// Pool size: one process per concurrent compile up to `processes` (default 2: a cold ship's
// tier 0 and a background tier 1 at once, without one waiting on the other); more callers queue.

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <bitship/errc.hpp>

#include "object_compiler.hpp"

namespace bitship::jit {

struct CompilerProcessOptions {
    std::filesystem::path program;     ///< the bitship-compiler executable
    unsigned processes = 2;            ///< at most this many compiles at once
    unsigned opt_level = 2;            ///< Tier::optimised's
    Sandbox sandbox = Sandbox::none;   ///< how the code is confined (sent in HELLO)
    std::vector<std::string> allowed;  ///< the allow-list's names
    /// libdevice.10.bc's bytes, sent in every process's HELLO for its PTX compiles (a confined
    /// compiler opens no file); empty: none on this host.
    std::vector<std::byte> libdevice;
    std::chrono::seconds cpu_limit{10}; ///< CPU time per compile
    std::size_t memory_bytes = 2048ull << 20; ///< address space per process beyond its start-up size
};

class CompilerProcesses final : public ObjectCompiler {
public:
    /// Starts every process and waits until each has initialised LLVM and warmed up (their
    /// start-up is paid here, not by a compile). Errors name the program and what failed.
    static Result<std::unique_ptr<CompilerProcesses>> start(CompilerProcessOptions options);
    /// Closes the sockets (each process exits at end of file) and reaps the processes.
    ~CompilerProcesses() override;
    CompilerProcesses(const CompilerProcesses&) = delete;
    CompilerProcesses& operator=(const CompilerProcesses&) = delete;

    Result<CompiledObject> compile(std::span<const std::byte> bundle, const CodeHash& expected, Tier tier,
                                   std::string_view only = {}) override;
    Result<CompiledPtx> compile_ptx(std::span<const std::byte> bundle, const CodeHash& expected, unsigned sm) override;
    void stop_compiles() override;

    struct State;

private:
    explicit CompilerProcesses(std::unique_ptr<State> state);
    std::unique_ptr<State> state_;
};

/// Where an agent finds bitship-compiler: `configured` when given, else the file of that name
/// beside this program (/proc/self/exe). io_error naming the path looked at when it is missing
/// or not executable.
Result<std::filesystem::path> find_compiler_program(const std::filesystem::path& configured);

} // namespace bitship::jit
