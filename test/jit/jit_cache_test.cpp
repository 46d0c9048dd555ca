// The JIT's tiers and code caches: tier 0 at once and tier 1 swapped in, the disk cache across
// restarts and the objects it refuses, and the in-memory cap with eviction. Kernels as in
// jit_test.cpp.
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <latch>
#include <optional>
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

namespace jit_cache_test_cpp {

namespace fs = std::filesystem;
using namespace bitship;
using namespace bitship::jit_test; // the fixtures (jit_fixtures.hpp, test_runtime.hpp)

TEST_CASE("a restarted agent recompiles from its disk cache", "[unit]") {
    TempDir dir;
    auto bundle = kernel_bundle("add", {"add"});
    const auto file = dir.path / (to_hex(bundle.hash) + ".bundle");
    {
        auto j = make_jit(dir.path);
        CHECK_FALSE(j->on_disk(bundle.hash));
        auto code = j->compile(bundle.bytes, bundle.hash);
        REQUIRE(code);
        j->drain_tier_ups(); // the slice is written behind the first call, then its optimised object
        CHECK(j->on_disk(bundle.hash));
        CHECK(fs::is_regular_file(file));
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
        j->drain_tier_ups();
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

TEST_CASE("preload links a restarted agent's cached objects before their first calls, most recent first, as many as asked", "[unit]") {
    TempDir dir;
    auto add = kernel_bundle("add", {"add"});
    auto other = make_bundle(wrapped_bitcode(kernel_bitcode("add"), 1), {"add"}); // same kernel, another hash
    {
        auto j = make_jit(dir.path);
        REQUIRE(j->compile(add.bytes, add.hash));
        REQUIRE(j->compile(other.bytes, other.hash));
        j->drain_tier_ups(); // both optimised objects on disk
    }
    auto wait_for = [](jit::Jit& j, std::uint64_t n) {
        for (int i = 0; i < 2000 && j.preloaded() < n; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        return j.preloaded();
    };

    SECTION("all of them, linked from their objects, and the call finds them in memory") {
        auto j = make_jit(dir.path);
        CHECK(j->find(add.hash) == nullptr);
        j->preload(64);
        CHECK(wait_for(*j, 2) == 2);
        auto code = j->find(add.hash);
        REQUIRE(code);
        CHECK(code->stats().from_object);
        CHECK(code->stats().tier == 1);
        CHECK(run_add(*code, 2, 3) == 5);
        CHECK(j->find(other.hash));
    }
    SECTION("at most as many as asked, and none with 0") {
        auto j = make_jit(dir.path);
        j->preload(1);
        CHECK(wait_for(*j, 1) == 1);
        j->drain_tier_ups(); // the preload job has ended
        CHECK(j->preloaded() == 1);
        CHECK(j->cached().size() == 1);
        auto none = make_jit(dir.path);
        none->preload(0);
        none->drain_tier_ups();
        CHECK(none->preloaded() == 0);
        CHECK(none->cached().empty());
    }
    SECTION("a call racing the preload gets the same code, linked once") {
        auto j = make_jit(dir.path);
        j->preload(64);
        auto code = j->load(add.hash);
        REQUIRE(code);
        j->drain_tier_ups();
        CHECK(j->find(add.hash).get() == code->get());
        CHECK(j->preloaded() >= 1); // `other` at least (the racing load may have linked `add` itself)
        CHECK(j->cached().size() == 2);
    }
}

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

namespace {
/// Runs kernel `name` of `code` on x; nullopt when it does not answer 8 bytes.
std::optional<std::uint64_t> run_u64(const jit::CompiledCode& code, std::string_view name, std::uint64_t x) {
    auto fn = code.entry(name);
    REQUIRE(fn);
    auto ctx = call(*fn, std::as_bytes(std::span(&x, 1)));
    return reply_u64(ctx);
}

const std::vector<std::string> kParts{"twice", "thrice", "lonely"};
const std::vector<std::string> kPartsWithState{"twice", "thrice", "lonely", "count"};

/// A Jit whose compiles go through one bitship-compiler process.
std::unique_ptr<jit::Jit> jit_with_compiler_process() {
    jit::JitOptions o;
    o.exports = runtime_exports();
    o.compiler.mode = jit::CompilerMode::process;
    o.compiler.path = BITSHIP_COMPILER_PROGRAM;
    o.compiler.processes = 1;
    auto j = jit::Jit::create(o);
    REQUIRE(j);
    return std::move(*j);
}

/// parts.c -DWRITABLE on `j`: its counter keeps counting from the first call on, through
/// whatever tier-up would follow.
void state_survives(jit::Jit& j) {
    auto bundle = kernel_bundle("parts_writable", kPartsWithState);
    auto code = j.compile(bundle.bytes, bundle.hash, "count");
    REQUIRE(code);
    // Compiled once, optimised and whole: a tier swap would give `count` a fresh counter.
    CHECK((*code)->stats().tier == 1);
    CHECK_FALSE((*code)->partial());
    CHECK(run_u64(**code, "count", 0) == 1);
    CHECK(run_u64(**code, "count", 0) == 2);
    CHECK(run_u64(**code, "lonely", 0) == 7); // bumps it too
    j.drain_tier_ups();
    CHECK(j.tier_ups_finished() == 0);
    auto now = j.find(bundle.hash);
    REQUIRE(now);
    CHECK(now.get() == code->get());
    CHECK(run_u64(*now, "count", 0) == 4);
}

/// The checks of a first compile for `thrice` alone, then of a call to `twice`, on `j`.
void first_compile_holds_one_kernel(jit::Jit& j) {
    auto bundle = kernel_bundle("parts", kParts);
    auto first = j.compile(bundle.bytes, bundle.hash, "thrice");
    REQUIRE(first);
    const auto& part = **first;
    CHECK(part.stats().tier == 0);
    CHECK(part.partial());
    // What `thrice` reaches only through its constant table of function pointers came along.
    CHECK(run_u64(part, "thrice", 5) == 15);
    CHECK(part.left_out("twice"));
    CHECK(part.left_out("lonely"));
    CHECK_FALSE(part.left_out("thrice"));
    CHECK_FALSE(part.left_out("no_such_kernel"));
    auto missing = part.entry("twice");
    REQUIRE_FALSE(missing);
    CHECK(missing.error().code == Errc::entry_not_found);

    // A call to a kernel left out: the whole slice (at tier 0, or tier 1 if that came first).
    auto whole = j.compile(bundle.bytes, bundle.hash, "twice");
    REQUIRE(whole);
    CHECK_FALSE((*whole)->partial());
    CHECK(run_u64(**whole, "twice", 5) == 10);
    CHECK(run_u64(**whole, "thrice", 5) == 15);
    CHECK(run_u64(**whole, "lonely", 0) == 7);
    CHECK(j.find(bundle.hash).get() == whole->get());
    // The part stays loaded while held.
    CHECK(run_u64(part, "thrice", 2) == 6);

    j.drain_tier_ups();
    auto best = j.find(bundle.hash);
    REQUIRE(best);
    CHECK(best->stats().tier == 1);
    CHECK_FALSE(best->partial());
    CHECK(run_u64(*best, "lonely", 0) == 7);
}
} // namespace

TEST_CASE("a first compile holds only the kernel its call names, and a call to another compiles the slice whole", "[unit]") {
    auto j = make_jit();
    first_compile_holds_one_kernel(*j);
}

TEST_CASE("a first compile for one kernel goes through bitship-compiler processes too", "[integration]") {
    auto j = jit_with_compiler_process();
    first_compile_holds_one_kernel(*j);
}

TEST_CASE("a slice that holds state keeps it: compiled optimised at once, never swapped", "[unit]") {
    auto j = make_jit();
    state_survives(*j);
}

TEST_CASE("a slice that holds state is compiled optimised at once by bitship-compiler processes too", "[integration]") {
    auto j = jit_with_compiler_process();
    state_survives(*j);
}

TEST_CASE("a slice is compiled whole at first when one kernel alone cannot be", "[unit]") {
    SECTION("a writable global, which two compiles would each hold a copy of") {
        auto j = make_jit();
        auto bundle = kernel_bundle("parts_writable", kPartsWithState);
        auto code = j->compile(bundle.bytes, bundle.hash, "twice");
        REQUIRE(code);
        CHECK_FALSE((*code)->partial());
        CHECK(run_u64(**code, "lonely", 0) == 7);
    }
    SECTION("an entry the slice does not define") {
        auto j = make_jit();
        auto bundle = kernel_bundle("parts", kParts);
        auto code = j->compile(bundle.bytes, bundle.hash, "no_such_kernel");
        REQUIRE(code);
        CHECK_FALSE((*code)->partial());
        CHECK((*code)->entry("no_such_kernel").error().code == Errc::entry_not_found);
        CHECK(run_u64(**code, "twice", 4) == 8);
    }
    SECTION("one tier: every compile is the optimised, whole one") {
        auto j = make_jit({}, 2, 1);
        auto bundle = kernel_bundle("parts", kParts);
        auto code = j->compile(bundle.bytes, bundle.hash, "twice");
        REQUIRE(code);
        CHECK((*code)->stats().tier == 1);
        CHECK_FALSE((*code)->partial());
    }
}

TEST_CASE("a first compile checks the code it compiles: a kernel left out that the allow-list refuses fails its own "
          "calls only",
          "[unit]") {
    const std::vector<std::string> entries{"twice", "thrice", "lonely", "escape"};
    auto bundle = kernel_bundle("parts_escape", entries);
    SECTION("with tiers: the first call's kernel runs, the slice whole is refused by name") {
        auto j = make_jit();
        auto first = j->compile(bundle.bytes, bundle.hash, "twice");
        if (!first) FAIL(first.error().describe());
        CHECK((*first)->partial());
        CHECK((*first)->left_out("escape"));
        CHECK(run_u64(**first, "twice", 4) == 8);
        // A call to `escape` compiles the slice whole, which the allow-list refuses.
        auto whole = j->compile(bundle.bytes, bundle.hash, "escape");
        REQUIRE_FALSE(whole);
        CHECK(whole.error().code == Errc::unresolved_symbol);
        CHECK_THAT(whole.error().message, Catch::Contains("'system'"));
        // Tier 1 fails the same way in the background; tier 0 keeps serving what it holds.
        j->drain_tier_ups();
        auto held = j->find(bundle.hash);
        REQUIRE(held);
        CHECK(held->stats().tier == 0);
        CHECK(held->partial());
        CHECK(run_u64(*held, "twice", 5) == 10);
    }
    SECTION("with one tier every compile is whole, and refused") {
        auto j = make_jit({}, 2, 1);
        auto code = j->compile(bundle.bytes, bundle.hash, "twice");
        REQUIRE_FALSE(code);
        CHECK(code.error().code == Errc::unresolved_symbol);
    }
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

}  // namespace jit_cache_test_cpp
