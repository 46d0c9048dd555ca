// check_slice (see slice_check.hpp): what InProcessCompiler checks of a bundle, CPU or GPU slice.
#include "slice_check.hpp"

#include <utility>

#include <fmt/format.h>

#include "jit.hpp"

namespace bitship::jit {

Result<CheckedSlice> check_slice(std::span<const std::byte> bundle, const CodeHash& expected, SliceTarget target) {
    const HostInfo& me = host();
    const std::string hex = to_hex(expected, kHashDigitsInMessages);

    // 1. The container: lengths, offsets, and every slice against its hash.
    auto view = BundleView::parse(bundle);
    if (!view) return tl::make_unexpected(view.error());

    // 2. The slice asked for, by content.
    CheckedSlice out{std::move(*view), 0};
    bool found = false;
    for (std::size_t i = 0; i < out.view.slices.size(); ++i)
        if (out.view.slices[i].hash == expected) {
            out.index = i;
            found = true;
        }
    if (!found) return fail(Errc::malformed_bundle, "no slice hashes to " + hex);
    const SliceView& slice = out.slice();

    // 3. Made for where it is to run: this architecture and OS, or an NVIDIA GPU.
    const bool for_gpu = normalise_triple(slice.triple) == normalise_triple(kGpuTriple);
    if (target == SliceTarget::gpu && !for_gpu)
        return fail(Errc::no_matching_slice,
                    fmt::format("slice {} is for {}, not for an NVIDIA GPU ({}); bundle has slices for [{}]", hex,
                                slice.triple, kGpuTriple, out.view.triples()));
    if (target == SliceTarget::host && for_gpu)
        return fail(Errc::no_matching_slice,
                    fmt::format("slice {} is for an NVIDIA GPU ({}); this agent runs {} and no GPU kernels (bundle has "
                                "slices for [{}])",
                                hex, slice.triple, me.triple, out.view.triples()));
    if (target == SliceTarget::host && normalise_triple(slice.triple) != normalise_triple(me.triple))
        return fail(Errc::no_matching_slice,
                    fmt::format("bundle has slices for [{}]; this agent runs {}", out.view.triples(), me.triple));

    // 4. Not made by a newer LLVM than ours. Bitcode is stable within a major.minor release
    //    line, so the patch level does not count.
    if (std::pair(slice.llvm.major, slice.llvm.minor) > std::pair(me.llvm.major, me.llvm.minor))
        return fail(Errc::producer_too_new, fmt::format("slice {} was made by LLVM {}; this agent links LLVM {}", hex,
                                                        to_string(slice.llvm), to_string(me.llvm)));
    return out;
}

} // namespace bitship::jit
