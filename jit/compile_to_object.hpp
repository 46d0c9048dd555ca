#pragma once
// The LLVM work that turns a bundle slice into a relocatable object, on the calling thread:
// bundle checks, bitcode parse, IR verifier, code policy, allow-list check, host retargeting,
// the pass pipeline (tier 1) and code generation. The agent runs it in bitship-compiler
// processes (compiler_main.cpp), or in its own process with --compiler=in-process. Private to
// jit/.

#include <cstddef>
#include <functional>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <vector>

#include <bitship/bundle.hpp>
#include <bitship/errc.hpp>

#include "object_compiler.hpp"

namespace bitship::jit {

/// The symbol names shipped code may reference (the allow-list's names; no addresses needed).
using SymbolNames = std::set<std::string, std::less<>>;

/// Compiles in this process. Thread-safe: independent compiles run in parallel, each with a
/// TargetMachine of its own borrowed from a pool.
class InProcessCompiler final : public ObjectCompiler {
public:
    /// `opt_level` (0..3) is Tier::optimised's. With Sandbox::sfi every compile, at either
    /// tier, runs confine_memory (sfi_pass.hpp) just before code generation. `libdevice`: the
    /// bytes of libdevice.10.bc that compile_ptx links (read_libdevice(); empty: none, and a GPU
    /// kernel that calls it is no_device). Initialises LLVM's native and NVPTX targets (once).
    static Result<std::unique_ptr<InProcessCompiler>> create(SymbolNames allowed, unsigned opt_level,
                                                             Sandbox sandbox = Sandbox::none,
                                                             std::vector<std::byte> libdevice = {});
    ~InProcessCompiler() override;
    InProcessCompiler(const InProcessCompiler&) = delete;
    InProcessCompiler& operator=(const InProcessCompiler&) = delete;

    Result<CompiledObject> compile(std::span<const std::byte> bundle, const CodeHash& expected, Tier tier,
                                   std::string_view only = {}) override;
    Result<CompiledPtx> compile_ptx(std::span<const std::byte> bundle, const CodeHash& expected, unsigned sm) override;

    /// TargetMachines made so far, each with the code generation pipeline it keeps for every
    /// object after (object_emitter.hpp): one a tier while compiles come one at a time.
    [[nodiscard]] std::size_t emitters_made() const;

    struct State;

private:
    explicit InProcessCompiler(std::unique_ptr<State> state);
    std::unique_ptr<State> state_;
};

/// Registers this host's LLVM target and code generator (once per process).
void init_native_target();

/// A kernel as clang writes one (a loop, loads and stores with TBAA, intrinsics, calls to the
/// bs_* runtime, a string constant, attribute groups and module metadata), for this host:
/// compiling and linking it at each tier pays LLVM's first-use costs before the first shipped
/// kernel does. Its one entry is kWarmUpEntry.
struct WarmUpBundle {
    std::vector<std::byte> bundle;
    CodeHash hash{};
};
WarmUpBundle warm_up_bundle();
inline constexpr const char* kWarmUpEntry = "bitship_warm_up";

} // namespace bitship::jit
