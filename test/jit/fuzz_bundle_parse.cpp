// libFuzzer target for BundleView::parse, the first thing an agent does with bytes off the
// wire. Properties checked beyond "no crash, no sanitizer report":
//   - every slice's bitcode span lies inside the input;
//   - a parsed bundle's slices re-extract (extract_slice) to bundles that parse again, with
//     the same triple, version, hash and bytes.
// Built with BITSHIP_FUZZ=ON (clang):  ./build-fuzz/test/jit/fuzz_bundle_parse -max_total_time=60
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string>

#include <bitship/bundle.hpp>

namespace {

void check(bool ok) {
    if (!ok) std::abort(); // a broken property: libFuzzer saves the input
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const auto bytes = std::as_bytes(std::span(data, size));
    auto view = bitship::BundleView::parse(bytes);
    if (!view) return 0;

    (void)view->triples();
    (void)view->find_slice("x86_64-pc-linux-gnu");
    for (const auto& e : view->entries) check(view->has_entry(e));
    for (std::size_t i = 0; i < view->slices.size(); ++i) {
        const auto& s = view->slices[i];
        check(s.bitcode.data() >= bytes.data() && s.bitcode.data() + s.bitcode.size() <= bytes.data() + bytes.size());
        (void)bitship::normalise_triple(s.triple);

        auto one = bitship::extract_slice(*view, i);
        auto again = bitship::BundleView::parse(one);
        check(again.has_value());
        check(again->slices.size() == 1);
        const auto& t = again->slices[0];
        check(t.triple == s.triple && t.llvm == s.llvm && t.hash == s.hash && t.bitcode.size() == s.bitcode.size());
    }
    return 0;
}
