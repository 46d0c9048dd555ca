#pragma once
// What every compile checks of a bundle before a byte of its bitcode is read: the container, the
// slice asked for (by its hash), where that slice's code runs, and the LLVM that made it. The same
// checks for a CPU slice (InProcessCompiler::compile) and a GPU one (InProcessCompiler::compile_ptx).
// No LLVM here. Private to jit/.

#include <cstddef>
#include <span>

#include <bitship/bundle.hpp>
#include <bitship/errc.hpp>

namespace bitship::jit {

/// Where the code of the slice asked for is to run.
enum class SliceTarget {
    host, ///< this host's CPU (host().triple)
    gpu,  ///< an NVIDIA GPU (kGpuTriple)
};

/// A bundle that passed check_slice, and the slice asked for.
struct CheckedSlice {
    BundleView view;       ///< its spans point into the bundle checked
    std::size_t index = 0; ///< the slice asked for, in view.slices
    [[nodiscard]] const SliceView& slice() const { return view.slices[index]; }
};

/// Steps 1-4 of a compile: the container (lengths, offsets, every slice against its hash), a slice
/// hashing to `expected`, made for `target`, by an LLVM whose major.minor is not newer than this
/// agent's. Errors: malformed_bundle (also: no slice hashes to `expected`), no_matching_slice
/// (naming the slice's triple, the bundle's triples and what was wanted), producer_too_new
/// (naming both versions).
Result<CheckedSlice> check_slice(std::span<const std::byte> bundle, const CodeHash& expected, SliceTarget target);

} // namespace bitship::jit
