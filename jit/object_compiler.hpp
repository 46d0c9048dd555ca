#pragma once
// What turns a bundle slice into object code: parse, verify, code policy, allow-list check,
// host retargeting, optimisation and code generation; and a GPU slice into PTX. Two
// implementations: in this process (compile_to_object.hpp), or in separate, confined compiler
// processes (compiler_processes.hpp) so that no input can take the agent down. The Engine links
// the objects either returns; the Jit keeps the PTX (ptx_cache.hpp). No LLVM type here. Private
// to jit/.

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <bitship/bundle.hpp>
#include <bitship/errc.hpp>

#include "jit.hpp"

namespace bitship::jit {

/// 0: the fast first compile (no IR passes, FastISel at CodeGenOptLevel::None); 1: host
/// retargeting, the full pass pipeline and codegen at the configured opt level.
enum class Tier : unsigned { fast = 0, optimised = 1 };

/// A slice compiled to a relocatable object, not yet linked.
struct CompiledObject {
    std::vector<std::byte> object;    ///< ELF relocatable object code for this host
    std::vector<std::string> entries; ///< the bundle's entries the module defines (and exports)
    /// The bundle's entries the slice defines that this object leaves out (a compile for one
    /// entry, entry_closure.hpp); empty when it holds the whole slice.
    std::vector<std::string> left_out;
    /// The single-slice bundle the object was made from; empty when the request's bundle was
    /// that already (the caller then keeps its own bytes).
    std::vector<std::byte> slice_bundle;
    CompileStats stats; ///< verify, parse, optimise and codegen times; link_ms is the linker's
};

/// An nvptx64 slice compiled to PTX.
struct CompiledPtx {
    std::string ptx; ///< PTX text (no trailing NUL)
    /// The single-slice bundle the PTX was made from; empty when the request's bundle was that
    /// already (as CompiledObject::slice_bundle).
    std::vector<std::byte> slice_bundle;
    /// verify_ms: the bundle checks; codegen_ms: the rest (parse, libdevice, O3, PTX emission).
    CompileStats stats;
};

class ObjectCompiler {
public:
    virtual ~ObjectCompiler() = default;
    /// The slice of `bundle` hashing to `expected`, compiled at `tier`, or at Tier::optimised
    /// when it holds state (entry_closure.hpp: stats.tier says which). With `only` at
    /// Tier::fast, just that entry and what it reaches where the slice allows it
    /// (keep_only_entry): only that part is read, checked and compiled (the module-level code
    /// policy rules see the whole slice); the rest is checked when a compile of the whole slice
    /// (tier 1, or a call to a kernel left out) reads it. Errors: those of Jit::compile, plus compile_failed naming what stopped a compiler process (a signal, a
    /// limit). Thread-safe.
    virtual Result<CompiledObject> compile(std::span<const std::byte> bundle, const CodeHash& expected, Tier tier,
                                           std::string_view only = {}) = 0;

    /// The nvptx64 slice of `bundle` hashing to `expected` as PTX for sm_<sm> (kMinPtxSm..
    /// kMaxPtxSm: the caller caps a newer GPU's), linked with the libdevice this compiler was
    /// made with: the checks of compile() for an NVIDIA GPU's triple (check_slice), then
    /// compile_to_ptx. Errors: those of compile() and of compile_to_ptx (no_device when
    /// libdevice is needed and this compiler has none), plus compile_failed naming what stopped
    /// a compiler process. Thread-safe.
    virtual Result<CompiledPtx> compile_ptx(std::span<const std::byte> bundle, const CodeHash& expected, unsigned sm) = 0;

    /// For an owner that stops: compiles under way end within a moment with shutting_down (their
    /// compiler processes are killed), and later ones fail so at once. A compile in this process
    /// (InProcessCompiler) cannot be cut short: it runs to its end, and this does nothing.
    /// Thread-safe; for good.
    virtual void stop_compiles() {}
};

} // namespace bitship::jit
