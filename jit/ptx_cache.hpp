#pragma once
// The Jit's GPU side (Jit::compile_ptx): an nvptx64 slice's PTX by (hash, sm), made by the
// ObjectCompiler that makes this agent's CPU code (a confined bitship-compiler process, or this
// process), kept in memory and in the disk cache beside the slice's bundle
// (`<hex64>.sm<NN>.ptx` and `<hex64>.bundle`, code_cache.hpp). Private to jit/.
//
// A PTX file is text, its first line a PTX comment naming what it was made from and by:
//
//   // bitship-ptx 2 llvm 19.1.7 sm_90 libdevice <16 hex digits> slice <64 hex digits> digest <64 hex digits>
//   <the PTX>
//
// (libdevice: the code hash of the libdevice linked in, or "none"; digest: of the PTX after that
// line). As with an object file, a PTX file is used only when it was made by this agent's LLVM,
// for that sm and that slice, with this agent's libdevice (a CUDA toolkit upgrade changes it),
// and is whole; anything else is removed and the PTX made again from the bundle.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <shared_mutex>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include <bitship/bundle.hpp>
#include <bitship/errc.hpp>

#include "object_compiler.hpp"
#include "single_flight.hpp"

namespace bitship::jit {

class CodeCache;

class PtxCache {
public:
    using PtxResult = Result<std::shared_ptr<const std::string>>;

    /// `compiler` is shared with the Engine, which links the CPU code it makes; `disk` is the
    /// Jit's code cache and must outlive this.
    /// `libdevice`: libdevice_id() of what the compiler links into PTX.
    PtxCache(std::shared_ptr<ObjectCompiler> compiler, CodeCache& disk, std::string libdevice)
        : compiler_(std::move(compiler)), disk_(disk), libdevice_(std::move(libdevice)) {}

    /// Jit::compile_ptx: from memory, else from the disk cache's PTX file, else compiled from
    /// `bundle` (or, when it is empty, from the disk cache's bundle) and kept in both. Concurrent
    /// first calls for one (hash, sm) compile once. Thread-safe.
    PtxResult get(std::span<const std::byte> bundle, const CodeHash& expected, unsigned sm);

    /// Drops the PTX held in memory for `hash`, every sm of it (the disk copy stays); false when
    /// there was none.
    bool evict(const CodeHash& hash);

    /// PTX made by the compiler so far (neither from memory nor from a disk file).
    [[nodiscard]] std::uint64_t compiles() const { return compiles_.load(std::memory_order_relaxed); }

private:
    using Key = std::pair<CodeHash, unsigned>; // the hash, and the sm the PTX is made for
    std::shared_ptr<const std::string> held(const Key& key) const;
    std::shared_ptr<const std::string> hold(const Key& key, std::string ptx);
    std::shared_ptr<const std::string> from_disk(const Key& key);
    PtxResult make(std::span<const std::byte> bundle, const Key& key);

    std::shared_ptr<ObjectCompiler> compiler_;
    CodeCache& disk_;
    const std::string libdevice_;
    mutable std::shared_mutex mutex_; // memory_
    std::map<Key, std::shared_ptr<const std::string>> memory_;
    SingleFlight<Key, PtxResult> in_flight_;
    std::atomic<std::uint64_t> compiles_{0};
};

/// What a PTX file's header calls this libdevice: 16 hex digits of its code hash, "none" when empty.
std::string libdevice_id(std::span<const std::byte> libdevice);

/// A PTX file's bytes: the header line above, then `ptx`.
std::string encode_ptx_file(std::string_view ptx, const CodeHash& hash, unsigned sm, std::string_view libdevice);

/// The PTX of a file made by encode_ptx_file, when it names this agent's LLVM, `sm`, `libdevice`
/// and `hash` and its digest holds; malformed_bundle naming what does not hold otherwise.
Result<std::string> decode_ptx_file(std::string_view file, const CodeHash& hash, unsigned sm, std::string_view libdevice);

} // namespace bitship::jit
