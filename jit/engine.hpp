#pragma once
// The linking side of the JIT: one ORC LLJIT, a "bitship.runtime" JITDylib of absolute symbols
// (the allow-list), and one JITDylib per compiled slice. Gets a slice's object code from an
// ObjectCompiler (in this process, or a confined compiler process) and links it to resolved
// entry points; knows nothing of caching. Private to jit/.
//
// engine.cpp subclasses LLVM types, so it is built with -fno-rtti like libLLVM; the classes
// behind the public interfaces (jit.cpp) keep RTTI, so UBSan's vptr check works on them.

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <bitship/bundle.hpp>
#include <bitship/errc.hpp>
#include <bitship/kernel.h>

#include "allow_list.hpp"
#include "jit.hpp"
#include "object_compiler.hpp"

namespace llvm {
class MemoryBuffer;
}
namespace llvm::orc {
class JITDylib;
}

namespace bitship::jit {

/// What one successful compile made.
struct CompiledParts {
    llvm::orc::JITDylib* dylib = nullptr; ///< holds the code; give it back with Engine::unload
    std::map<std::string, bs_entry_fn, std::less<>> entries; ///< the bundle's entries it defines
    std::vector<std::string> left_out; ///< the slice's entries a compile for one entry left out
    CompileStats stats;
    std::vector<std::byte> bundle; ///< the single-slice bundle it was compiled from
    std::vector<std::byte> object; ///< the object code linked, when asked to keep it
    std::size_t code_bytes = 0;    ///< the linked segments' size, page-rounded
};

class Engine {
public:
    /// Starts the LLJIT; `compiler` makes the object code compile() links (shared with the Jit's
    /// PtxCache, which has it make PTX). With Sandbox::sfi the linker places code and data in
    /// `zones` (arena_memory.hpp). A unique_ptr: the caller makes it shared, so the shared_ptr's
    /// control block comes from a file with RTTI (see above).
    static Result<std::unique_ptr<Engine>> start(AllowList allow, std::shared_ptr<ObjectCompiler> compiler,
                                                 Sandbox sandbox = Sandbox::none, CodeZones zones = {});
    ~Engine();
    Engine(const Engine&) = delete;
    Engine& operator=(const Engine&) = delete;

    /// Has the ObjectCompiler check, retarget, optimise (at `tier`) and generate the slice of
    /// `bundle` whose hash is `expected` (the steps and errors of Jit::compile), and links the
    /// object; at Tier::fast with `only`, just that entry where it can (ObjectCompiler::compile).
    /// Keeps the object code in the result when `keep_object`. Thread-safe. On failure nothing
    /// of the slice stays loaded.
    Result<CompiledParts> compile(std::span<const std::byte> bundle, const CodeHash& expected, Tier tier,
                                  bool keep_object = false, std::string_view only = {});

    /// Links `object` (made by compile() at Tier::optimised on this host, see object_file.hpp)
    /// and resolves `entries`. `bundle` is the slice it came from, kept for forwarding.
    /// compile_failed when the linker refuses it. Thread-safe.
    Result<CompiledParts> link_object(std::span<const std::byte> object, const std::vector<std::string>& entries,
                                      std::vector<std::byte> bundle, const CodeHash& hash);

    /// Compiles (at each tier), links and unloads a small module made here, through the same
    /// path as compile(), so LLVM's one-time set-up (target, pass pipeline, code generator,
    /// linker) is paid now, not by the first call that ships code.
    Result<void> warm_up();

    /// Frees the code in `dylib` (from a CompiledParts). Thread-safe.
    void unload(llvm::orc::JITDylib& dylib) noexcept;

    struct State;

private:
    explicit Engine(std::unique_ptr<State> state);
    Result<void> link(std::unique_ptr<llvm::MemoryBuffer> object, const std::vector<std::string>& entries,
                      const std::string& hex, CompiledParts& parts);
    std::unique_ptr<State> state_;
};

} // namespace bitship::jit
