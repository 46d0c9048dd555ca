// The JIT's unit tests: compile, run, refuse (tiers and caches: jit_cache_test.cpp). Kernels are real C compiled to bitcode at
// build time (test/jit/kernels), bundled here, and called through the test runtime.
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <latch>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include <catch2/catch.hpp>

#include <bitship/bundle.hpp>

#include "jit.hpp"
#include "object_file.hpp"
#include "jit_fixtures.hpp"
#include "test_runtime.hpp"

namespace jit_test_cpp {

namespace fs = std::filesystem;
using namespace bitship;
using namespace bitship::jit_test; // the fixtures (jit_fixtures.hpp, test_runtime.hpp)

TEST_CASE("host() describes this machine as LLVM sees it", "[unit]") {
    const auto& h = jit::host();
    CHECK(normalise_triple(h.triple) == normalise_triple(LLVM_HOST_TRIPLE_FOR_TEST));
    CHECK_FALSE(h.cpu.empty());
    CHECK(h.features.find('+') != std::string::npos);
    CHECK(h.llvm.major >= 19);
    CHECK(&jit::host() == &h); // detected once
}

TEST_CASE("the curated exports hold libc/libm helpers and nothing that escapes", "[unit]") {
    auto exports = jit::curated_exports();
    auto has = [&](std::string_view name) {
        return std::any_of(exports.begin(), exports.end(), [&](const jit::Export& e) { return e.name == name; });
    };
    for (auto name : {"memcpy", "memset", "strlen", "malloc", "free", "sqrt", "sinf", "fma", "__udivti3"}) {
        INFO(name);
        CHECK(has(name));
    }
    for (auto name : {"system", "fork", "execve", "dlopen", "open", "mmap", "syscall", "popen"}) {
        INFO(name);
        CHECK_FALSE(has(name));
    }
    for (const auto& e : exports) CHECK(e.address != nullptr);
}

TEST_CASE("a kernel adding two u64 arguments returns their sum", "[unit]") {
    auto j = make_jit();
    auto bundle = kernel_bundle("add", {"add"});
    auto code = j->compile(bundle.bytes, bundle.hash);
    REQUIRE(code);
    CHECK((*code)->hash() == bundle.hash);
    CHECK(run_add(**code, 40, 2) == 42);
    CHECK(run_add(**code, ~0ull, 2) == 1); // wraps, as C does

    const auto& stats = (*code)->stats();
    CHECK(stats.total_ms() > 0);
    CHECK(stats.codegen_ms > 0);
    CHECK(stats.optimise_ms > 0);
    CHECK_FALSE(stats.from_disk);

    SECTION("and answers bs_fail when the arguments are wrong") {
        auto add = (*code)->entry("add");
        REQUIRE(add);
        const std::array<std::byte, 3> short_args{};
        auto ctx = call(*add, short_args);
        CHECK_FALSE(ctx.reply);
        REQUIRE(ctx.fail_code);
        CHECK(*ctx.fail_code == 1);
        CHECK(ctx.fail_message == "add: expected 16 bytes of arguments");
    }
}

TEST_CASE("a kernel that calls system() is refused before codegen, and the JIT goes on", "[unit]") {
    auto j = make_jit();
    auto bad = kernel_bundle("calls_system", {"escape"});
    auto code = j->compile(bad.bytes, bad.hash);
    REQUIRE_FALSE(code);
    CHECK(code.error().code == Errc::unresolved_symbol);
    CHECK(code.error().message == "kernel references 'system', which this agent does not export");
    CHECK(j->find(bad.hash) == nullptr);

    auto good = kernel_bundle("add", {"add"});
    auto add = j->compile(good.bytes, good.hash);
    REQUIRE(add);
    CHECK(run_add(**add, 1, 2) == 3);
}

TEST_CASE("a kernel using allow-listed sqrt and memcpy links and runs", "[unit]") {
    auto j = make_jit();
    auto bundle = kernel_bundle("math", {"roots"});
    auto code = j->compile(bundle.bytes, bundle.hash);
    REQUIRE(code);
    auto roots = (*code)->entry("roots");
    REQUIRE(roots);
    const std::array<double, 3> in{4.0, 81.0, 2.0};
    auto ctx = call(*roots, std::as_bytes(std::span(in)));
    REQUIRE(ctx.reply);
    REQUIRE(ctx.reply->size() == sizeof in);
    std::array<double, 3> out{};
    std::memcpy(out.data(), ctx.reply->data(), sizeof out);
    CHECK(out[0] == 2.0);
    CHECK(out[1] == 9.0);
    CHECK(out[2] == Approx(std::sqrt(2.0)));
}

TEST_CASE("a libcall the backend introduces but nobody exports fails the link, naming it", "[unit]") {
    auto j = make_jit();
    auto bundle = kernel_bundle("powi", {"power"});
    auto code = j->compile(bundle.bytes, bundle.hash);
    REQUIRE_FALSE(code);
    CHECK(code.error().code == Errc::unresolved_symbol);
    CHECK_THAT(code.error().message, Catch::Contains("'__powidf2'"));
    CHECK(j->find(bundle.hash) == nullptr);

    // Nothing half-linked stayed: the same hash fails the same way again (not "duplicate
    // definition"), and other code still compiles.
    auto again = j->compile(bundle.bytes, bundle.hash);
    REQUIRE_FALSE(again);
    CHECK(again.error().code == Errc::unresolved_symbol);
    auto good = kernel_bundle("add", {"add"});
    auto add = j->compile(good.bytes, good.hash);
    REQUIRE(add);
    CHECK(run_add(**add, 5, 6) == 11);
}

TEST_CASE("a slice for another architecture is refused, naming both triples", "[unit]") {
    auto j = make_jit();
    auto bundle = make_bundle(kernel_bitcode("add_aarch64"), {"add"}, "aarch64-unknown-linux-gnu");
    auto code = j->compile(bundle.bytes, bundle.hash);
    REQUIRE_FALSE(code);
    CHECK(code.error().code == Errc::no_matching_slice);
    CHECK(code.error().message ==
          "bundle has slices for [aarch64-unknown-linux-gnu]; this agent runs " + jit::host().triple);
}

TEST_CASE("a slice from a newer LLVM is refused, naming both versions", "[unit]") {
    auto j = make_jit();
    auto bundle = make_bundle(kernel_bitcode("add"), {"add"}, jit::host().triple, LlvmVersion{99, 0, 0});
    auto code = j->compile(bundle.bytes, bundle.hash);
    REQUIRE_FALSE(code);
    CHECK(code.error().code == Errc::producer_too_new);
    CHECK_THAT(code.error().message, Catch::Contains("99.0.0") && Catch::Contains(to_string(jit::host().llvm)));

    SECTION("but a newer patch level of our own release is fine") {
        auto h = jit::host().llvm;
        auto patch = make_bundle(kernel_bitcode("add"), {"add"}, jit::host().triple,
                                 LlvmVersion{h.major, h.minor, static_cast<std::uint16_t>(h.patch + 1)});
        CHECK(j->compile(patch.bytes, patch.hash));
    }
}

TEST_CASE("corrupt bitcode is invalid_bitcode, never a crash", "[unit]") {
    // Compiled whole, and as a first call's tier 0, which reads the bitcode lazily: the
    // kernel it names and what that reaches (jit/entry_closure.hpp).
    const std::string entry = GENERATE(std::string{}, std::string{"add"});
    INFO("entry named: '" << entry << "'");
    auto j = make_jit();
    const auto good = kernel_bitcode("add");

    SECTION("random bytes") {
        std::mt19937 rng(12345);
        std::vector<std::byte> junk(good.size());
        for (auto& b : junk) b = static_cast<std::byte>(rng());
        auto bundle = make_bundle(junk, {"add"});
        auto code = j->compile(bundle.bytes, bundle.hash, entry);
        REQUIRE_FALSE(code);
        CHECK(code.error().code == Errc::invalid_bitcode);
    }
    SECTION("truncated") {
        for (std::size_t keep : {good.size() / 2, good.size() - 1, std::size_t{8}, std::size_t{1}}) {
            INFO("kept " << keep << " of " << good.size() << " bytes");
            std::vector<std::byte> cut(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(keep));
            auto bundle = make_bundle(cut, {"add"});
            auto code = j->compile(bundle.bytes, bundle.hash, entry);
            REQUIRE_FALSE(code);
            CHECK(code.error().code == Errc::invalid_bitcode);
        }
    }
    SECTION("the magic number damaged") {
        auto bad = good;
        bad[1] ^= std::byte{0xff};
        auto bundle = make_bundle(bad, {"add"});
        auto code = j->compile(bundle.bytes, bundle.hash, entry);
        REQUIRE_FALSE(code);
        CHECK(code.error().code == Errc::invalid_bitcode);
    }
    SECTION("bytes flipped in the middle") {
        // A flip may land where LLVM cannot tell (a constant, a name): then the code compiles,
        // or names a symbol nobody exports. Each outcome must be an answer, not a crash, and
        // most flips must be caught as invalid bitcode.
        int invalid = 0;
        constexpr int kFlips = 40;
        for (int i = 0; i < kFlips; ++i) {
            auto bad = good;
            auto at = good.size() / 4 + static_cast<std::size_t>(i) * (good.size() / 2) / kFlips;
            bad[at] ^= std::byte{0x5a};
            auto bundle = make_bundle(bad, {"add"});
            auto code = j->compile(bundle.bytes, bundle.hash, entry);
            if (!code) {
                INFO("flip at " << at << ": " << code.error().describe());
                CHECK((code.error().code == Errc::invalid_bitcode || code.error().code == Errc::unresolved_symbol ||
                       code.error().code == Errc::policy_violation));
                invalid += code.error().code == Errc::invalid_bitcode;
            }
        }
        CHECK(invalid > 0);
    }
}

TEST_CASE("the code policy refuses asm, constructors, thread-locals, aliases, unlisted intrinsics and forged calls "
          "before code generation, naming the rule",
          "[unit]") {
    // Whole, and as a first call's tier 0 for the kernel `bad` (read lazily: the module-level
    // rules see the whole slice, the others the kernel's own code).
    const std::string entry = GENERATE(std::string{}, std::string{"bad"});
    auto j = make_jit();
    const std::pair<int, const char*> cases[] = {{1, "no-inline-asm"},          {2, "no-module-asm"},
                                                 {3, "no-appending-global"},    {4, "no-thread-local"},
                                                 {5, "no-alias"},               {6, "listed-intrinsics-only"},
                                                 {7, "no-forged-call"},         {8, "no-forged-call"},
                                                 {9, "listed-intrinsics-only"}, {10, "no-indirect-branch"},
                                                 {11, "no-section"}};
    for (auto [n, rule] : cases) {
        INFO("case " << n << ", rule " << rule << ", entry named: '" << entry << "'");
        auto bundle = kernel_bundle("policy_" + std::to_string(n), {"bad"});
        auto code = j->compile(bundle.bytes, bundle.hash, entry);
        REQUIRE_FALSE(code);
        CHECK(code.error().code == Errc::policy_violation);
        CHECK_THAT(code.error().message, Catch::Contains(rule));
    }
    // And the JIT goes on compiling good code.
    auto good = kernel_bundle("add", {"add"});
    REQUIRE(j->compile(good.bytes, good.hash));
}

TEST_CASE("a bundle without the slice asked for is malformed_bundle", "[unit]") {
    auto j = make_jit();
    auto bundle = kernel_bundle("add", {"add"});
    CodeHash other = bundle.hash;
    other[0] ^= 1;
    auto code = j->compile(bundle.bytes, other);
    REQUIRE_FALSE(code);
    CHECK(code.error().code == Errc::malformed_bundle);
    CHECK(code.error().message == "no slice hashes to " + to_hex(other, 16));

    auto truncated = bundle.bytes;
    truncated.resize(truncated.size() - 1);
    auto cut = j->compile(truncated, bundle.hash);
    REQUIRE_FALSE(cut);
    CHECK(cut.error().code == Errc::malformed_bundle);
}

TEST_CASE("the same hash compiled twice is the same code", "[unit]") {
    auto j = make_jit({}, 2, 1); // one tier: no swap between the two calls
    auto bundle = kernel_bundle("add", {"add"});
    CHECK(j->find(bundle.hash) == nullptr);
    auto first = j->compile(bundle.bytes, bundle.hash);
    auto second = j->compile(bundle.bytes, bundle.hash);
    REQUIRE(first);
    REQUIRE(second);
    CHECK(first->get() == second->get());
    CHECK(j->find(bundle.hash).get() == first->get());
}

TEST_CASE("two bundles defining the same entry name each run their own code", "[unit]") {
    auto j = make_jit();
    auto one = kernel_bundle("answer_1", {"answer"});
    auto two = kernel_bundle("answer_2", {"answer"});
    REQUIRE(one.hash != two.hash);
    auto code1 = j->compile(one.bytes, one.hash);
    auto code2 = j->compile(two.bytes, two.hash);
    REQUIRE(code1);
    REQUIRE(code2);
    auto e1 = (*code1)->entry("answer");
    auto e2 = (*code2)->entry("answer");
    REQUIRE(e1);
    REQUIRE(e2);
    CHECK(*e1 != *e2);
    CHECK(reply_u64(call(*e1, {})) == 1u);
    CHECK(reply_u64(call(*e2, {})) == 2u);
}

TEST_CASE("an entry the code does not have is entry_not_found", "[unit]") {
    auto j = make_jit();
    // "ghost" is listed by the bundle but not defined by the module: also entry_not_found.
    auto bundle = kernel_bundle("add", {"add", "ghost"});
    auto code = j->compile(bundle.bytes, bundle.hash);
    REQUIRE(code);
    for (auto name : {"nope", "ghost"}) {
        auto e = (*code)->entry(name);
        REQUIRE_FALSE(e);
        CHECK(e.error().code == Errc::entry_not_found);
        CHECK_THAT(e.error().message, Catch::Contains(std::string("'") + name + "'"));
    }
    CHECK((*code)->entry("add"));
}

TEST_CASE("opt_level 0 compiles without the pass pipeline", "[unit]") {
    auto j = make_jit({}, 0);
    auto bundle = kernel_bundle("add", {"add"});
    auto code = j->compile(bundle.bytes, bundle.hash);
    REQUIRE(code);
    CHECK(run_add(**code, 20, 22) == 42);
}

TEST_CASE("bad options are refused at create()", "[unit]") {
    SECTION("an export with a null address") {
        jit::JitOptions options;
        options.exports = {{"bs_args", nullptr}};
        auto j = jit::Jit::create(options);
        REQUIRE_FALSE(j);
        CHECK(j.error().code == Errc::invalid_argument);
    }
    SECTION("an opt_level over 3") {
        jit::JitOptions options;
        options.opt_level = 7;
        auto j = jit::Jit::create(options);
        REQUIRE_FALSE(j);
        CHECK(j.error().code == Errc::invalid_argument);
    }
    SECTION("a cache directory that cannot be created") {
        TempDir dir;
        fs::create_directories(dir.path);
        std::ofstream(dir.path / "a-file") << "not a directory";
        jit::JitOptions options;
        options.cache_dir = dir.path / "a-file" / "cache";
        auto j = jit::Jit::create(options);
        REQUIRE_FALSE(j);
        CHECK(j.error().code == Errc::io_error);
    }
}

TEST_CASE("threads compiling at once, the same bundle and different ones, all succeed", "[unit]") {
    auto j = make_jit({}, 2, 1); // one tier: every thread must get the very same code
    constexpr int kThreads = 4;
    auto shared = kernel_bundle("add", {"add"});
    std::vector<Bundle> own;
    for (int i = 1; i <= kThreads; ++i) own.push_back(kernel_bundle("add_v" + std::to_string(i), {"add"}));

    std::latch start(kThreads);
    std::vector<std::shared_ptr<const jit::CompiledCode>> shared_code(kThreads), own_code(kThreads);
    std::vector<std::string> errors(kThreads);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
        threads.emplace_back([&, t] {
            start.arrive_and_wait();
            auto s = j->compile(shared.bytes, shared.hash);
            auto o = j->compile(own[static_cast<std::size_t>(t)].bytes, own[static_cast<std::size_t>(t)].hash);
            if (!s) errors[static_cast<std::size_t>(t)] += s.error().describe();
            if (!o) errors[static_cast<std::size_t>(t)] += o.error().describe();
            if (s) shared_code[static_cast<std::size_t>(t)] = *s;
            if (o) own_code[static_cast<std::size_t>(t)] = *o;
        });
    }
    for (auto& t : threads) t.join();
    for (std::size_t t = 0; t < kThreads; ++t) {
        INFO("thread " << t << ": " << errors[t]);
        REQUIRE(shared_code[t]);
        REQUIRE(own_code[t]);
        CHECK(shared_code[t] == shared_code[0]);
        CHECK(run_add(*own_code[t], 100, 0) == 100 + t + 1); // add_vN adds N
        CHECK(run_add(*shared_code[t], 100, 0) == 100);
    }
}

TEST_CASE("no JIT page is ever writable and executable", "[unit]") {
    auto j = make_jit();
    std::vector<std::shared_ptr<const jit::CompiledCode>> held;
    for (auto name : {"add", "math", "answer_1", "answer_2"}) {
        auto bundle = kernel_bundle(name, {"add", "roots", "answer"});
        auto code = j->compile(bundle.bytes, bundle.hash);
        REQUIRE(code);
        held.push_back(*code);
    }
    std::ifstream maps("/proc/self/maps");
    REQUIRE(maps);
    std::string line;
    while (std::getline(maps, line)) {
        auto perms = line.substr(line.find(' ') + 1, 4);
        INFO(line);
        CHECK_FALSE((perms[1] == 'w' && perms[2] == 'x'));
    }
}

TEST_CASE("warm-up compiles through the real path and leaves the JIT working", "[unit]") {
    auto j = make_jit();
    REQUIRE(j->warm_up());
    REQUIRE(j->warm_up()); // twice: nothing of the first stays in the way
    auto bundle = kernel_bundle("add", {"add"});
    auto code = j->compile(bundle.bytes, bundle.hash);
    REQUIRE(code);
    CHECK(run_add(**code, 40, 2) == 42);
}

// ---- tiers, the object cache, the bounded cache ----

}  // namespace jit_test_cpp
