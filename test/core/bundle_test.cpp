#include <catch2/catch.hpp>

#include <cstring>
#include <fstream>
#include <iterator>

#include <bitship/bundle.hpp>

namespace bundle_test_cpp {

using namespace bitship;

namespace {

std::vector<std::byte> bytes_of(std::string_view s) {
    auto b = std::as_bytes(std::span(s.data(), s.size()));
    return {b.begin(), b.end()};
}

std::vector<std::byte> two_slice_bundle() {
    static const auto x86 = bytes_of("x86 bitcode bytes");
    static const auto arm = bytes_of("aarch64 bitcode bytes, longer");
    std::vector<std::string> entries{"add", "scale"};
    std::vector<SliceInput> slices{{"x86_64-unknown-linux-gnu", "x86-64", "clang 19.1.7", {19, 1, 7}, x86},
                                   {"aarch64-unknown-linux-gnu", "generic", "clang 19.1.7", {19, 1, 7}, arm}};
    return write_bundle(entries, slices);
}

} // namespace

TEST_CASE("a bundle with two slices parses back with entries, triples and hashes", "[unit]") {
    auto b = two_slice_bundle();
    auto v = BundleView::parse(b);
    REQUIRE(v);
    CHECK(v->entries == std::vector<std::string>{"add", "scale"});
    REQUIRE(v->slices.size() == 2);
    CHECK(v->slices[1].triple == "aarch64-unknown-linux-gnu");
    CHECK(v->slices[1].llvm == LlvmVersion{19, 1, 7});
    CHECK(v->slices[0].hash == hash_code(bytes_of("x86 bitcode bytes")));
    CHECK(v->has_entry("scale"));
    CHECK_FALSE(v->has_entry("nope"));
}

TEST_CASE("slice choice matches architecture and OS, ignoring vendor and environment", "[unit]") {
    auto b = two_slice_bundle();
    auto v = BundleView::parse(b);
    REQUIRE(v);
    CHECK(v->find_slice("x86_64-pc-linux-gnu") == 0u);
    CHECK(v->find_slice("aarch64-linux-gnu") == 1u);
    CHECK(v->find_slice("arm64-unknown-linux") == 1u);
    CHECK_FALSE(v->find_slice("riscv64-unknown-linux-gnu"));
    CHECK_FALSE(v->find_slice("x86_64-apple-darwin"));
}

TEST_CASE("normalise_triple keeps architecture and OS only", "[unit]") {
    CHECK(normalise_triple("x86_64-pc-linux-gnu") == "x86_64-linux");
    CHECK(normalise_triple("x86_64-unknown-linux-gnu") == "x86_64-linux");
    CHECK(normalise_triple("amd64-linux-gnu") == "x86_64-linux");
    CHECK(normalise_triple("aarch64-apple-macosx14.0") == "aarch64-darwin");
    CHECK(normalise_triple("nvptx64-nvidia-cuda") == "nvptx64-cuda");
}

TEST_CASE("extract_slice makes a one-slice bundle with the same hash", "[unit]") {
    auto b = two_slice_bundle();
    auto v = BundleView::parse(b);
    REQUIRE(v);
    auto one = extract_slice(*v, 1);
    auto w = BundleView::parse(one);
    REQUIRE(w);
    REQUIRE(w->slices.size() == 1);
    CHECK(w->slices[0].hash == v->slices[1].hash);
    CHECK(w->entries == v->entries);
}

TEST_CASE("a bundle with a flipped slice byte fails its hash check", "[unit]") {
    auto b = two_slice_bundle();
    b[b.size() - 3] ^= std::byte{0x40};
    auto v = BundleView::parse(b);
    REQUIRE_FALSE(v);
    CHECK(v.error().code == Errc::malformed_bundle);
    CHECK_THAT(v.error().message, Catch::Contains("hash"));
}

TEST_CASE("every truncation of a bundle is refused, never read past", "[unit]") {
    auto b = two_slice_bundle();
    for (std::size_t n = 0; n < b.size(); ++n) {
        auto v = BundleView::parse(std::span(b).first(n));
        REQUIRE_FALSE(v);
        CHECK(v.error().code == Errc::malformed_bundle);
    }
}

TEST_CASE("a slice offset pointing outside the bundle is refused", "[unit]") {
    auto b = two_slice_bundle();
    // The first slice's offset field sits right after its hash; find it by its value.
    auto v = BundleView::parse(b);
    REQUIRE(v);
    std::uint64_t offset = static_cast<std::uint64_t>(v->slices[0].bitcode.data() - b.data());
    auto it = std::search(b.begin(), b.end(), reinterpret_cast<const std::byte*>(&offset),
                          reinterpret_cast<const std::byte*>(&offset) + 8);
    REQUIRE(it != b.end());
    std::uint64_t evil = ~0ull - 4;
    std::memcpy(&*it, &evil, 8);
    auto bad = BundleView::parse(b);
    REQUIRE_FALSE(bad);
    CHECK(bad.error().code == Errc::malformed_bundle);
}

TEST_CASE("a bundle of another format version is refused as unsupported", "[unit]") {
    auto b = two_slice_bundle();
    std::uint32_t v2 = 2;
    std::memcpy(b.data() + 8, &v2, 4);
    auto v = BundleView::parse(b);
    REQUIRE_FALSE(v);
    CHECK(v.error().code == Errc::unsupported_version);
}

TEST_CASE("a slice header whose strings run short is refused (fuzzer find)", "[unit]") {
    // libFuzzer found this: a failed string read consumed its length, later fields read from
    // the wrong place and succeeded, and the parser used the missing string.
    std::ifstream in(BITSHIP_FUZZ_CORPUS "/crash_slice_header_disengaged_optional", std::ios::binary);
    std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    REQUIRE_FALSE(chars.empty());
    auto v = BundleView::parse(std::as_bytes(std::span(chars)));
    REQUIRE_FALSE(v);
    CHECK(v.error().code == Errc::malformed_bundle);
}

}  // namespace bundle_test_cpp
