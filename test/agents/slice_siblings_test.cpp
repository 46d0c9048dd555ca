// An agent's store of bundles' other slices, for forwards to agents of another architecture.

#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include <bitship/bundle.hpp>

#include "slice_siblings.hpp"

namespace slice_siblings_test_cpp {

using namespace bitship;
using agent::SliceSiblings;

namespace {

constexpr const char* kX86 = "x86_64-unknown-linux-gnu";
constexpr const char* kArm = "aarch64-unknown-linux-gnu";

// The bytes need not be bitcode: the store only reads the container.
std::vector<std::byte> bundle_of(std::vector<std::pair<std::string, std::string>> slices) {
    std::vector<std::string> entries{"k"};
    std::vector<SliceInput> inputs;
    for (const auto& [triple, body] : slices)
        inputs.push_back({triple, "generic", "test", {19, 1, 0}, std::as_bytes(std::span(body.data(), body.size()))});
    return write_bundle(entries, inputs);
}

CodeHash hash_of(const std::vector<std::byte>& bundle, std::size_t slice) { return BundleView::parse(bundle)->slices.at(slice).hash; }

} // namespace

TEST_CASE("a two-slice bundle kept under one slice's hash gives the other triple's slice", "[unit]") {
    auto bundle = bundle_of({{kX86, "x86 code"}, {kArm, "arm code"}});
    SliceSiblings store;
    store.remember(hash_of(bundle, 0), bundle);
    auto sibling = store.for_triple(hash_of(bundle, 0), "aarch64-linux-gnu"); // vendor ignored
    REQUIRE(sibling);
    CHECK(sibling->hash == hash_of(bundle, 1));
    CHECK(*sibling->bundle == bundle);

    wire::Run run;
    run.hash = hash_of(bundle, 0);
    run.entry = "k";
    auto x86 = store.retarget(wire::encode_run(9, run), 9, kArm);
    REQUIRE(x86);
    auto decoded = wire::decode(x86->message.header, x86->message.payload);
    REQUIRE(decoded);
    CHECK(std::get<wire::Run>(decoded->body).hash == hash_of(bundle, 1));
    CHECK(std::get<wire::Run>(decoded->body).entry == "k");
}

TEST_CASE("no kept bundle, or none with the peer's triple, is no_matching_slice naming the triples", "[unit]") {
    SliceSiblings store;
    auto single = bundle_of({{kX86, "x86 code"}});
    store.remember(hash_of(single, 0), single); // one slice: nothing to keep
    CHECK(store.size() == 0);
    auto none = store.for_triple(hash_of(single, 0), kArm);
    REQUIRE_FALSE(none);
    CHECK(none.error().code == Errc::no_matching_slice);
    CHECK_THAT(none.error().message, Catch::Contains(kArm));

    auto two = bundle_of({{kX86, "x86 code"}, {"riscv64-unknown-linux-gnu", "rv code"}});
    store.remember(hash_of(two, 0), two);
    auto wrong = store.for_triple(hash_of(two, 0), kArm);
    REQUIRE_FALSE(wrong);
    CHECK(wrong.error().code == Errc::no_matching_slice);
    CHECK_THAT(wrong.error().message, Catch::Contains("riscv64") && Catch::Contains(kArm));
}

TEST_CASE("bundles that do not hold the named hash, or do not parse, are not kept", "[unit]") {
    SliceSiblings store;
    auto bundle = bundle_of({{kX86, "x86 code"}, {kArm, "arm code"}});
    auto other = bundle_of({{kX86, "other"}, {kArm, "other arm"}});
    store.remember(hash_of(other, 0), bundle);
    auto cut = std::vector<std::byte>(bundle.begin(), bundle.begin() + static_cast<long>(bundle.size() / 2));
    store.remember(hash_of(bundle, 0), cut);
    CHECK(store.size() == 0);
}

TEST_CASE("the store is bounded: the oldest bundles go first", "[unit]") {
    SliceSiblings store;
    std::vector<CodeHash> hashes;
    for (std::size_t i = 0; i < SliceSiblings::kMaxBundles + 3; ++i) {
        auto b = bundle_of({{kX86, "x86 " + std::to_string(i)}, {kArm, "arm " + std::to_string(i)}});
        hashes.push_back(hash_of(b, 0));
        store.remember(hashes.back(), b);
    }
    CHECK(store.size() == SliceSiblings::kMaxBundles);
    CHECK_FALSE(store.for_triple(hashes.front(), kArm));
    CHECK(store.for_triple(hashes.back(), kArm));
}

}  // namespace slice_siblings_test_cpp
