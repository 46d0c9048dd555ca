// The code generation pipeline each TargetMachine keeps (jit/object_emitter.hpp): an object is
// the same byte for byte whether the pipeline that made it is new or has made others first.
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include <bitship/bundle.hpp>

#include "compile_to_object.hpp"
#include "jit.hpp"
#include "jit_fixtures.hpp"
#include "test_runtime.hpp"

namespace object_emitter_test_cpp {

using namespace bitship;
using namespace bitship::jit_test;

jit::SymbolNames allowed_names() {
    jit::SymbolNames names;
    for (const auto& e : jit::curated_exports()) names.insert(e.name);
    for (const auto& e : runtime_exports()) names.insert(e.name);
    return names;
}

std::unique_ptr<jit::InProcessCompiler> make_compiler(jit::Sandbox sandbox) {
    auto c = jit::InProcessCompiler::create(allowed_names(), 2, sandbox);
    if (!c) FAIL("InProcessCompiler::create: " << c.error().describe());
    return std::move(*c);
}

struct Kernel {
    const char* bitcode;
    std::vector<std::string> entries;
};

TEST_CASE("a kept codegen pipeline makes the same objects as a new one, module after module, at both tiers",
          "[unit]") {
    const std::vector<Kernel> kernels{
        {"add", {"add"}},
        {"math", {"roots"}},
        {"powi", {"power"}},
        {"parts", {"twice", "thrice", "lonely"}},
        {"parts_writable", {"twice", "thrice", "lonely", "count"}}, // state: compiled whole, optimised
        {"answer_1", {"answer"}},
        {"answer_2", {"answer"}},
        {"sfi", {"sfi_write", "sfi_read", "sfi_compute", "sfi_recurse", "sfi_indirect"}},
        {"add_v3", {"add"}},
    };
    for (auto sandbox : {jit::Sandbox::none, jit::Sandbox::sfi}) {
        INFO("sandbox " << jit::to_string(sandbox));
        auto kept = make_compiler(sandbox);
        // Twice through, the second time in the other order: each module follows different ones.
        for (int round = 0; round < 2; ++round) {
            for (std::size_t k = 0; k < kernels.size(); ++k) {
                const Kernel& kernel = kernels[round == 0 ? k : kernels.size() - 1 - k];
                auto bundle = kernel_bundle(kernel.bitcode, kernel.entries);
                struct Ask {
                    jit::Tier tier;
                    std::string only;
                };
                for (const auto& ask : {Ask{jit::Tier::fast, kernel.entries.front()}, Ask{jit::Tier::fast, {}},
                                        Ask{jit::Tier::optimised, {}}}) {
                    INFO(kernel.bitcode << " tier " << static_cast<int>(ask.tier) << " only '" << ask.only << "' round "
                                        << round);
                    auto reference = make_compiler(sandbox)->compile(bundle.bytes, bundle.hash, ask.tier, ask.only);
                    auto again = kept->compile(bundle.bytes, bundle.hash, ask.tier, ask.only);
                    REQUIRE(reference);
                    REQUIRE(again);
                    REQUIRE_FALSE(again->object.empty());
                    CHECK(again->object == reference->object);
                    CHECK(again->entries == reference->entries);
                }
            }
        }
        // One compile at a time: one machine (and pipeline) a tier made all of those objects.
        CHECK(kept->emitters_made() == 2);
    }
}

} // namespace object_emitter_test_cpp
