// The JIT's unit tests: compile, run, refuse, cache. Kernels are real C compiled to bitcode at
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
#include "test_runtime.hpp"

namespace fs = std::filesystem;
using namespace bitship;
using bitship::jit_test::Bundle;
using bitship::jit_test::call;
using bitship::jit_test::kernel_bitcode;
using bitship::jit_test::make_bundle;
using bitship::jit_test::reply_u64;

namespace {

std::unique_ptr<jit::Jit> make_jit(fs::path cache_dir = {}, unsigned opt_level = 2, unsigned tiers = 2,
                                   std::size_t cache_mib = 0, std::size_t cache_disk_mib = 0) {
    jit::JitOptions options;
    options.exports = jit_test::runtime_exports();
    options.opt_level = opt_level;
    options.cache_dir = std::move(cache_dir);
    options.tiers = tiers;
    options.cache_mib = cache_mib;
    options.cache_disk_mib = cache_disk_mib;
    auto j = jit::Jit::create(std::move(options));
    if (!j) FAIL("Jit::create: " << j.error().describe());
    return std::move(*j);
}

Bundle kernel_bundle(const std::string& name, std::vector<std::string> entries) {
    return make_bundle(kernel_bitcode(name), std::move(entries));
}

template <class T> std::vector<std::byte> as_bytes_of(const T& value) {
    std::vector<std::byte> out(sizeof value);
    std::memcpy(out.data(), &value, sizeof value);
    return out;
}

std::uint64_t run_add(const jit::CompiledCode& code, std::uint64_t a, std::uint64_t b) {
    auto add = code.entry("add");
    REQUIRE(add);
    const std::array<std::uint64_t, 2> args{a, b};
    auto ctx = call(*add, std::as_bytes(std::span(args)));
    auto sum = reply_u64(ctx);
    REQUIRE(sum);
    return *sum;
}

/// A fresh directory under the system temp dir, removed with everything in it.
struct TempDir {
    fs::path path;
    TempDir() {
        static std::atomic<int> counter{0};
        path = fs::temp_directory_path() / ("bitship-jit-test-" + std::to_string(::getpid()) + "-" +
                                            std::to_string(counter++));
        fs::remove_all(path);
    }
    ~TempDir() {
        std::error_code ec;
        fs::remove_all(path, ec);
    }
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;
};

} // namespace

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
    auto j = make_jit();
    const auto good = kernel_bitcode("add");

    SECTION("random bytes") {
        std::mt19937 rng(12345);
        std::vector<std::byte> junk(good.size());
        for (auto& b : junk) b = static_cast<std::byte>(rng());
        auto bundle = make_bundle(junk, {"add"});
        auto code = j->compile(bundle.bytes, bundle.hash);
        REQUIRE_FALSE(code);
        CHECK(code.error().code == Errc::invalid_bitcode);
    }
    SECTION("truncated") {
        for (std::size_t keep : {good.size() / 2, good.size() - 1, std::size_t{8}, std::size_t{1}}) {
            INFO("kept " << keep << " of " << good.size() << " bytes");
            std::vector<std::byte> cut(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(keep));
            auto bundle = make_bundle(cut, {"add"});
            auto code = j->compile(bundle.bytes, bundle.hash);
            REQUIRE_FALSE(code);
            CHECK(code.error().code == Errc::invalid_bitcode);
        }
    }
    SECTION("the magic number damaged") {
        auto bad = good;
        bad[1] ^= std::byte{0xff};
        auto bundle = make_bundle(bad, {"add"});
        auto code = j->compile(bundle.bytes, bundle.hash);
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
            auto code = j->compile(bundle.bytes, bundle.hash);
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
    auto j = make_jit();
    const std::pair<int, const char*> cases[] = {{1, "no-inline-asm"},          {2, "no-module-asm"},
                                                 {3, "no-appending-global"},    {4, "no-thread-local"},
                                                 {5, "no-alias"},               {6, "listed-intrinsics-only"},
                                                 {7, "no-forged-call"},         {8, "no-forged-call"},
                                                 {9, "listed-intrinsics-only"}, {10, "no-indirect-branch"},
                                                 {11, "no-section"}};
    for (auto [n, rule] : cases) {
        INFO("case " << n << ", rule " << rule);
        auto bundle = kernel_bundle("policy_" + std::to_string(n), {"bad"});
        auto code = j->compile(bundle.bytes, bundle.hash);
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

TEST_CASE("a restarted agent recompiles from its disk cache", "[unit]") {
    TempDir dir;
    auto bundle = kernel_bundle("add", {"add"});
    const auto file = dir.path / (to_hex(bundle.hash) + ".bundle");
    {
        auto j = make_jit(dir.path);
        CHECK_FALSE(j->on_disk(bundle.hash));
        auto code = j->compile(bundle.bytes, bundle.hash);
        REQUIRE(code);
        CHECK(j->on_disk(bundle.hash));
        CHECK(fs::is_regular_file(file));
        j->drain_tier_ups(); // and the optimised object beside it
    }
    auto j = make_jit(dir.path);
    CHECK(j->find(bundle.hash) == nullptr);
    CHECK(j->on_disk(bundle.hash));

    SECTION("load() links its optimised object, marked from_disk") {
        auto code = j->load(bundle.hash);
        REQUIRE(code);
        CHECK((*code)->stats().from_disk);
        CHECK((*code)->stats().from_object);
        CHECK((*code)->stats().tier == 1);
        CHECK((*code)->bundle() == bundle.bytes); // kept for forwarding
        CHECK(run_add(**code, 7, 8) == 15);
        CHECK(j->find(bundle.hash).get() == code->get());
        // Only this slice and its object were kept, with no temporary files left behind.
        CHECK(std::distance(fs::directory_iterator(dir.path), fs::directory_iterator{}) == 2);
        CHECK(fs::is_regular_file(dir.path / (to_hex(bundle.hash) + ".obj")));
    }
    SECTION("a corrupt file is code_missing, and removed") {
        {
            std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
            f.seekp(static_cast<std::streamoff>(fs::file_size(file) - 10));
            f.write("garbage!!!", 10);
        }
        auto code = j->load(bundle.hash);
        REQUIRE_FALSE(code);
        CHECK(code.error().code == Errc::code_missing);
        CHECK_FALSE(fs::exists(file));
        CHECK_FALSE(j->on_disk(bundle.hash));
        // The client resends the bundle: that works, and is kept on disk again.
        REQUIRE(j->compile(bundle.bytes, bundle.hash));
        CHECK(j->on_disk(bundle.hash));
    }
    SECTION("a hash never stored is code_missing") {
        CodeHash other{};
        CHECK_FALSE(j->on_disk(other));
        auto code = j->load(other);
        REQUIRE_FALSE(code);
        CHECK(code.error().code == Errc::code_missing);
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

namespace {

/// `bitcode` inside LLVM's bitcode wrapper header, whose CPU-type field is `variant`: the
/// parser reads the same module, but the bytes (so the hash) differ. Many distinct kernels
/// without many clang runs.
std::vector<std::byte> wrapped_bitcode(std::span<const std::byte> bitcode, std::uint32_t variant) {
    const std::array<std::uint32_t, 5> header{0x0B17C0DE, 0, 20, static_cast<std::uint32_t>(bitcode.size()), variant};
    std::vector<std::byte> out(sizeof header);
    std::memcpy(out.data(), header.data(), sizeof header);
    out.insert(out.end(), bitcode.begin(), bitcode.end());
    return out;
}

std::size_t dir_bytes(const fs::path& dir) {
    std::size_t total = 0;
    for (const auto& e : fs::directory_iterator(dir)) total += static_cast<std::size_t>(e.file_size());
    return total;
}

} // namespace

TEST_CASE("a new hash runs at tier 0 at once, and tier 1 is swapped in for later calls", "[unit]") {
    auto j = make_jit();
    auto bundle = kernel_bundle("add", {"add"});
    auto first = j->compile(bundle.bytes, bundle.hash);
    REQUIRE(first);
    CHECK((*first)->stats().tier == 0);
    CHECK(run_add(**first, 2, 3) == 5);

    j->drain_tier_ups();
    auto best = j->find(bundle.hash);
    REQUIRE(best);
    CHECK(best->stats().tier == 1);
    CHECK(best.get() != first->get());
    CHECK(run_add(*best, 20, 22) == 42);
    // The old tier stays loaded while a caller holds it.
    CHECK(run_add(**first, 1, 1) == 2);
    // Compiling it again gives the best tier, without compiling.
    auto again = j->compile(bundle.bytes, bundle.hash);
    REQUIRE(again);
    CHECK(again->get() == best.get());

    auto listed = j->cached();
    REQUIRE(listed.size() == 1);
    CHECK(listed[0].hash == bundle.hash);
    CHECK(listed[0].tier == 1);
    CHECK(listed[0].code_bytes > 0);
    CHECK(listed[0].code_bytes == best->code_bytes());
    CHECK(listed[0].in_use); // `best` holds it
}

TEST_CASE("with one tier every compile is the optimised one", "[unit]") {
    auto j = make_jit({}, 2, 1);
    auto bundle = kernel_bundle("add", {"add"});
    auto code = j->compile(bundle.bytes, bundle.hash);
    REQUIRE(code);
    CHECK((*code)->stats().tier == 1);
    CHECK(run_add(**code, 2, 3) == 5);
}

TEST_CASE("tier swap under concurrent calls never runs half-built code", "[unit]") {
    auto j = make_jit();
    constexpr int kKernels = 8;
    constexpr int kCallers = 4;
    std::vector<Bundle> bundles;
    for (int n = 1; n <= kKernels; ++n) bundles.push_back(kernel_bundle("add_v" + std::to_string(n), {"add"}));

    // Callers look each kernel up per call, as the agent does per RUN, and compile it when it
    // is not there; meanwhile the tier-up thread swaps every one of them.
    std::atomic<bool> stop{false};
    std::atomic<int> wrong{0}, failed{0};
    std::array<std::atomic<int>, 2> calls_by_tier{};
    std::latch start(kCallers);
    std::vector<std::thread> callers;
    for (int t = 0; t < kCallers; ++t) {
        callers.emplace_back([&, t] {
            std::mt19937 rng(static_cast<unsigned>(t));
            start.arrive_and_wait();
            while (!stop.load()) {
                const auto k = static_cast<std::size_t>(rng() % kKernels);
                auto code = j->find(bundles[k].hash);
                if (!code) {
                    auto compiled = j->compile(bundles[k].bytes, bundles[k].hash);
                    if (!compiled) {
                        failed.fetch_add(1);
                        continue;
                    }
                    code = *compiled;
                }
                auto add = code->entry("add");
                if (!add) {
                    failed.fetch_add(1);
                    continue;
                }
                const std::array<std::uint64_t, 2> args{rng(), 1000};
                auto ctx = call(*add, std::as_bytes(std::span(args)));
                auto sum = reply_u64(ctx);
                if (!sum || *sum != args[0] + args[1] + k + 1) wrong.fetch_add(1); // add_vN adds N
                calls_by_tier[code->stats().tier == 0 ? 0 : 1].fetch_add(1);
            }
        });
    }
    // Until every kernel is at tier 1 and has been called there a while (a guard against a
    // hang, not a timing: the checks below say what went wrong).
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::minutes(2);
    while (std::chrono::steady_clock::now() < give_up) {
        j->drain_tier_ups();
        auto listed = j->cached();
        if (listed.size() == kKernels &&
            std::all_of(listed.begin(), listed.end(), [](const auto& c) { return c.tier == 1; }) &&
            calls_by_tier[1].load() > 10'000)
            break;
        std::this_thread::yield();
    }
    stop = true;
    for (auto& t : callers) t.join();
    auto listed = j->cached();
    CHECK(listed.size() == kKernels);
    CHECK(std::all_of(listed.begin(), listed.end(), [](const auto& c) { return c.tier == 1; }));
    CHECK(wrong.load() == 0);
    CHECK(failed.load() == 0);
    CHECK(calls_by_tier[0].load() > 0);
    CHECK(calls_by_tier[1].load() > 0);
}

TEST_CASE("concurrent first compiles of one hash compile once, with tiers too", "[unit]") {
    auto j = make_jit();
    constexpr int kThreads = 6;
    auto bundle = kernel_bundle("add_v3", {"add"});
    std::latch start(kThreads);
    std::vector<std::shared_ptr<const jit::CompiledCode>> got(kThreads);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
        threads.emplace_back([&, t] {
            start.arrive_and_wait();
            auto code = j->compile(bundle.bytes, bundle.hash);
            if (code) got[static_cast<std::size_t>(t)] = *code;
        });
    }
    for (auto& t : threads) t.join();
    // Every thread got code; those that got tier 0 (the swap may have come before the last
    // asked) all got the one tier-0 compile.
    const jit::CompiledCode* tier0 = nullptr;
    for (const auto& code : got) {
        REQUIRE(code);
        CHECK(run_add(*code, 1, 2) == 6);
        if (code->stats().tier != 0) continue;
        if (tier0 == nullptr) tier0 = code.get();
        CHECK(code.get() == tier0);
    }
    j->drain_tier_ups();
    CHECK(j->cached().size() == 1);
}

TEST_CASE("a disk-cache object from another LLVM version or CPU is refused and recompiled", "[unit]") {
    TempDir dir;
    auto bundle = kernel_bundle("add", {"add"});
    const auto object_path = dir.path / (to_hex(bundle.hash) + ".obj");
    {
        auto j = make_jit(dir.path);
        REQUIRE(j->compile(bundle.bytes, bundle.hash));
        j->drain_tier_ups();
    }
    REQUIRE(fs::is_regular_file(object_path));
    auto read_object = [&] {
        std::ifstream in(object_path, std::ios::binary);
        std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        std::vector<std::byte> bytes(chars.size());
        std::memcpy(bytes.data(), chars.data(), chars.size());
        return bytes;
    };
    auto written = jit::decode_object_file(read_object());
    REQUIRE(written);
    CHECK(written->key == jit::ObjectKey::of_this_host(2));
    CHECK(written->hash == bundle.hash);
    CHECK(written->entries == std::vector<std::string>{"add"});

    auto rewrite = [&](const jit::ObjectFile& file) {
        auto bytes = jit::encode_object_file(file);
        std::ofstream out(object_path, std::ios::binary | std::ios::trunc);
        out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    };
    auto foreign = *written;
    SECTION("another LLVM version") { foreign.key.llvm = "18.1.8"; }
    SECTION("another CPU") { foreign.key.cpu = "pentium4"; }
    SECTION("other CPU features") { foreign.key.features = "-sse2"; }
    SECTION("another opt level") { foreign.key.opt_level = 3; }
    rewrite(foreign);

    auto j = make_jit(dir.path);
    auto code = j->load(bundle.hash);
    REQUIRE(code);
    CHECK((*code)->stats().from_disk);
    CHECK_FALSE((*code)->stats().from_object); // compiled from the bundle again
    CHECK(run_add(**code, 4, 5) == 9);
    // The refused file is replaced by one made here.
    j->drain_tier_ups();
    auto replaced = jit::decode_object_file(read_object());
    REQUIRE(replaced);
    CHECK(replaced->key == jit::ObjectKey::of_this_host(2));
}

TEST_CASE("a torn or altered object file is refused, never linked", "[unit]") {
    TempDir dir;
    auto bundle = kernel_bundle("add", {"add"});
    const auto object_path = dir.path / (to_hex(bundle.hash) + ".obj");
    {
        auto j = make_jit(dir.path, 2, 1);
        REQUIRE(j->compile(bundle.bytes, bundle.hash));
    }
    REQUIRE(fs::is_regular_file(object_path));
    const auto size = fs::file_size(object_path);
    SECTION("truncated") { fs::resize_file(object_path, size / 2); }
    SECTION("a byte of code flipped") {
        std::fstream f(object_path, std::ios::in | std::ios::out | std::ios::binary);
        f.seekg(static_cast<std::streamoff>(size - 100));
        char c = 0;
        f.read(&c, 1);
        f.seekp(static_cast<std::streamoff>(size - 100));
        c = static_cast<char>(c ^ 0x40);
        f.write(&c, 1);
    }
    auto j = make_jit(dir.path, 2, 1);
    auto code = j->load(bundle.hash);
    REQUIRE(code);
    CHECK_FALSE((*code)->stats().from_object);
    CHECK(run_add(**code, 4, 5) == 9);
    auto decoded = [&] {
        std::ifstream in(object_path, std::ios::binary);
        std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        std::vector<std::byte> bytes(chars.size());
        std::memcpy(bytes.data(), chars.data(), chars.size());
        return jit::decode_object_file(bytes);
    }();
    CHECK(decoded); // replaced by a whole one
}

TEST_CASE("object files that are not whole are malformed, naming what is wrong", "[unit]") {
    jit::ObjectFile file;
    file.key = jit::ObjectKey::of_this_host(2);
    file.entries = {"add", "sub"};
    file.object = std::vector<std::byte>(64, std::byte{0x5a});
    auto bytes = jit::encode_object_file(file);
    auto back = jit::decode_object_file(bytes);
    REQUIRE(back);
    CHECK(back->key == file.key);
    CHECK(back->entries == file.entries);
    CHECK(back->object == file.object);
    for (std::size_t cut : {std::size_t{0}, std::size_t{7}, std::size_t{40}, bytes.size() - 1}) {
        auto r = jit::decode_object_file(std::span(bytes).first(cut));
        REQUIRE_FALSE(r);
        CHECK(r.error().code == Errc::malformed_bundle);
    }
    bytes[0] = std::byte{'X'};
    auto r = jit::decode_object_file(bytes);
    REQUIRE_FALSE(r);
    CHECK(r.error().code == Errc::malformed_bundle);
}

TEST_CASE("many distinct kernels under a small cap keep resident code bounded, every call correct", "[unit]") {
    TempDir dir;
    constexpr std::size_t kCapMib = 1, kDiskCapMib = 1;
    constexpr std::uint32_t kKernels = 300;
    // One tier: every compile is a real tier-1 compile, written to disk at once.
    auto j = make_jit(dir.path, 2, 1, kCapMib, kDiskCapMib);
    const auto bitcode = kernel_bitcode("add");
    std::vector<std::weak_ptr<const jit::CompiledCode>> made;
    std::size_t smallest = SIZE_MAX;
    for (std::uint32_t n = 0; n < kKernels; ++n) {
        auto bundle = make_bundle(wrapped_bitcode(bitcode, n), {"add"});
        auto code = j->compile(bundle.bytes, bundle.hash);
        REQUIRE(code);
        REQUIRE(run_add(**code, n, 1) == n + 1);
        smallest = std::min(smallest, (*code)->code_bytes());
        made.push_back(*code);
        std::size_t resident = 0;
        for (const auto& c : j->cached()) resident += c.code_bytes;
        REQUIRE(resident <= kCapMib << 20);
    }
    REQUIRE(smallest > 0);
    // Evicted code was unloaded: only what the cache holds is alive.
    const auto alive = std::count_if(made.begin(), made.end(), [](const auto& w) { return !w.expired(); });
    CHECK(static_cast<std::size_t>(alive) == j->cached().size());
    CHECK(static_cast<std::size_t>(alive) <= (kCapMib << 20) / smallest);
    CHECK(static_cast<std::size_t>(alive) < kKernels);
    CHECK(dir_bytes(dir.path) <= kDiskCapMib << 20);
    // The most recent kernel is still there, the first is not.
    CHECK(j->find(hash_code(wrapped_bitcode(bitcode, kKernels - 1))));
    CHECK_FALSE(j->find(hash_code(wrapped_bitcode(bitcode, 0))));
}

TEST_CASE("eviction respects running calls", "[unit]") {
    constexpr std::size_t kCapMib = 1;
    auto j = make_jit({}, 2, 1, kCapMib);
    const auto bitcode = kernel_bitcode("add");
    auto held_bundle = make_bundle(wrapped_bitcode(bitcode, 1'000'000), {"add"});
    auto held = j->compile(held_bundle.bytes, held_bundle.hash);
    REQUIRE(held);
    std::weak_ptr<const jit::CompiledCode> watch = *held;
    auto fill = [&](std::uint32_t from) {
        for (std::uint32_t n = from; n < from + 200; ++n) {
            auto b = make_bundle(wrapped_bitcode(bitcode, n), {"add"});
            REQUIRE(j->compile(b.bytes, b.hash));
        }
    };

    SECTION("the cap never evicts code a call holds") {
        fill(0); // far over the cap: everything else goes round
        CHECK(j->find(held_bundle.hash).get() == held->get());
        CHECK(run_add(**held, 3, 4) == 7);
        // Once the call ends it is the oldest, and goes.
        held->reset();
        fill(1000);
        CHECK_FALSE(j->find(held_bundle.hash));
        CHECK(watch.expired());
    }
    SECTION("an operator's evict drops the cache's reference; the holder keeps working") {
        CHECK(j->evict(held_bundle.hash));
        CHECK_FALSE(j->evict(held_bundle.hash));
        CHECK_FALSE(j->find(held_bundle.hash));
        CHECK(run_add(**held, 3, 4) == 7);
        CHECK_FALSE(watch.expired());
        held->reset(); // the last holder: the code is unloaded now
        CHECK(watch.expired());
    }
}

TEST_CASE("bad tier and cache options are refused at create()", "[unit]") {
    for (unsigned tiers : {0u, 3u}) {
        jit::JitOptions options;
        options.exports = jit_test::runtime_exports();
        options.tiers = tiers;
        auto j = jit::Jit::create(std::move(options));
        REQUIRE_FALSE(j);
        CHECK(j.error().code == Errc::invalid_argument);
    }
}
