#pragma once
// The agent's sandbox for shipped kernels (xagent --sandbox): in sfi mode the arena
// (sandbox_arena.hpp), the checked runtime the JIT links sfi code against
// (sandbox_runtime.hpp), and the binding of each shipped call to its thread's area; in none
// mode nothing (today's behaviour, for operators who trust their code).
//
// Native kernels (the operator's own, AgentConfig::native_kernels) are not shipped code and
// run outside the sandbox in either mode.

#include <cstddef>
#include <memory>
#include <string>

#include <bitship/capabilities.hpp>
#include <bitship/errc.hpp>
#include <bitship/kernel.h>

#include "jit.hpp"

namespace bitship::agent {

class SandboxArena;

struct SandboxConfig {
    SandboxMode mode = SandboxMode::sfi;
    std::size_t kernel_heap_mib = 64; ///< each call's kernel heap quota
    unsigned arena_log2 = 36;         ///< the arena's size, 2^N bytes of address space
    std::size_t max_args = 1u << 20;  ///< the call buffer each thread needs
    unsigned threads = 64;            ///< most threads that run kernels
    /// A page of known bytes outside the arena, whose address and state INFO reports: proof
    /// for tests that no kernel wrote outside the arena (xagent --sandbox-canary).
    bool canary = false;
};

class KernelSandbox {
public:
    static Result<std::unique_ptr<KernelSandbox>> create(const SandboxConfig& config);
    ~KernelSandbox();

    [[nodiscard]] SandboxMode mode() const noexcept { return config_.mode; }
    /// Where regions go (nullptr in none mode).
    [[nodiscard]] SandboxArena* arena() const noexcept { return arena_.get(); }
    /// Sets the JIT's sandbox mode, code zones and (sfi) the checked runtime exports in place
    /// of the plain ones.
    void configure(jit::JitOptions& options) const;
    /// Binds a shipped call to the calling thread's area (sfi); no-op in none mode.
    Result<void> enter(bs_ctx& ctx) const;
    /// Ends the call entered on this thread (reclaims its heap).
    void leave() const noexcept;
    /// Readies the calling thread for its first call now (sfi; no-op in none mode): claims its
    /// area of the arena (three mappings) and faults in the pages every call writes, the call
    /// buffer's first and the stack's top one. A worker does this as it starts, so that an
    /// agent's first kernel does not pay it (about 30 us of a cold ship here). Where it cannot
    /// (the areas are all claimed), the thread's first call fails as it would have.
    void prepare_thread() const noexcept;
    /// INFO's "sandbox": "sfi (arena 64 GiB at 0x...; kernel heap 64 MiB per call)" or "none",
    /// plus the canary's address and state when there is one.
    [[nodiscard]] std::string summary() const;

private:
    explicit KernelSandbox(SandboxConfig config);
    SandboxConfig config_;
    std::unique_ptr<SandboxArena> arena_;
    std::byte* canary_ = nullptr;
};

} // namespace bitship::agent
