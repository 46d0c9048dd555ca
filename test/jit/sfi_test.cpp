// Software fault isolation (jit::Sandbox::sfi), in this process: a test arena (2^32 bytes aligned
// to 2^32, PROT_NONE but for the pages a test maps), its symbols exported as absolute addresses,
// the JIT's code and data placed in its zones. Kernels (test/jit/kernels/sfi.c) write and read
// through forged pointers, use stack data of every kind, recurse, and call forged targets.
#include <sys/mman.h>
#include <unistd.h>

#include <csetjmp>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include <llvm/Bitcode/BitcodeReader.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>
#include <llvm/IR/Verifier.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/raw_ostream.h>

#include "jit.hpp"
#include "sfi_pass.hpp"
#include "test_runtime.hpp"

namespace sfi_test_cpp {

using namespace bitship;
using bitship::jit_test::kernel_bitcode;
using bitship::jit_test::make_bundle;

namespace {

constexpr unsigned kArenaLog2 = 32;
constexpr std::uint64_t kArenaSize = std::uint64_t{1} << kArenaLog2;
constexpr std::size_t kMiB = std::size_t{1} << 20;
// Offsets from the arena's base.
constexpr std::size_t kArgsAt = 2 * kMiB;   // the call's argument bytes
constexpr std::size_t kStackAt = 4 * kMiB;  // the unsafe stack: 256 KiB
constexpr std::size_t kStackBytes = 256 * 1024;
constexpr std::size_t kDataBytes = 32 * kMiB; // the JIT's data zone, at the top (as the agent's)
constexpr std::size_t kDataAt = kArenaSize - 64 * 1024 - kDataBytes;
constexpr std::size_t kCodeBytes = 64 * kMiB; // the code zone, 1 MiB after the arena's end: within 2 GiB
// Outside the arena, in the test's own reservation: the canary page. Its address's low 32 bits
// are kLandingAt, where a confined access to it lands.
constexpr std::uint64_t kLandingAt = 0x40000000;
constexpr std::uint64_t kCanaryValue = 0x5ec2e75ec2e75ec2;

/// Where a kernel was stopped from outside (the test's __bs_stack_overflow and forged-call
/// handlers jump back to the call).
enum class Stop { none = 0, overflow = 1, forged_call = 2 };
thread_local sigjmp_buf t_stop;
thread_local jit::UnsafeStack t_stack;
int g_evil_calls = 0;

extern "C" jit::UnsafeStack* test_unsafe_stack() { return &t_stack; }
extern "C" [[noreturn]] void test_stack_overflow() { siglongjmp(t_stop, static_cast<int>(Stop::overflow)); }
extern "C" [[noreturn]] void test_forged_call() { siglongjmp(t_stop, static_cast<int>(Stop::forged_call)); }
extern "C" std::uint64_t test_evil(std::uint64_t) { return static_cast<std::uint64_t>(++g_evil_calls); }

/// The arena, its zones, and a canary page outside it.
struct TestArena {
    std::byte* reservation = nullptr;
    std::size_t reservation_bytes = 0;
    std::byte* base = nullptr;
    std::uint64_t* canary = nullptr; // outside the arena
    std::uint64_t* landing = nullptr; // base + (canary & mask)

    TestArena() {
        // Room to align, the arena, the code zone after it, and the canary's page beyond.
        reservation_bytes = 4 * kArenaSize;
        void* r = ::mmap(nullptr, reservation_bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        REQUIRE(r != MAP_FAILED);
        reservation = static_cast<std::byte*>(r);
        auto aligned = (reinterpret_cast<std::uintptr_t>(r) + kArenaSize - 1) & ~(kArenaSize - 1);
        base = reinterpret_cast<std::byte*>(aligned);
        map(base + kArgsAt, 64 * 1024);
        map(base + kStackAt, kStackBytes);
        canary = reinterpret_cast<std::uint64_t*>(map(base + 2 * kArenaSize + kLandingAt, 4096));
        *canary = kCanaryValue;
        landing = reinterpret_cast<std::uint64_t*>(map(base + kLandingAt, 4096));
    }
    ~TestArena() { ::munmap(reservation, reservation_bytes); }
    TestArena(const TestArena&) = delete;
    TestArena& operator=(const TestArena&) = delete;

    static std::byte* map(std::byte* at, std::size_t bytes) {
        REQUIRE(::mmap(at, bytes, PROT_READ | PROT_WRITE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) == at);
        return at;
    }

    [[nodiscard]] jit::CodeZones zones() const {
        return {base + kDataAt, kDataBytes, base + kArenaSize + kMiB, kCodeBytes};
    }
    [[nodiscard]] bool contains(const void* p) const {
        auto a = reinterpret_cast<std::uintptr_t>(p);
        auto b = reinterpret_cast<std::uintptr_t>(base);
        return a >= b && a - b < kArenaSize;
    }
};

TestArena& arena() {
    static TestArena a;
    return a;
}

struct Where {
    std::filesystem::path cache_dir;
    jit::CompilerMode compiler = jit::CompilerMode::in_process;
};

std::unique_ptr<jit::Jit> make_jit(jit::Sandbox sandbox, unsigned tiers = 1, const Where& where = {}) {
    jit::JitOptions options;
    options.exports = jit_test::runtime_exports();
    options.tiers = tiers;
    options.cache_dir = where.cache_dir;
    options.compiler.mode = where.compiler;
    if (where.compiler == jit::CompilerMode::process) {
        options.compiler.path = BITSHIP_COMPILER_PROGRAM;
        options.compiler.processes = 1;
    }
    options.sandbox = sandbox;
    options.exports.push_back({jit::kForgedCallSymbol, reinterpret_cast<void*>(&test_forged_call)});
    if (sandbox == jit::Sandbox::sfi) {
        options.zones = arena().zones();
        options.exports.push_back({jit::kArenaBaseSymbol, arena().base});
        options.exports.push_back({jit::kArenaMaskSymbol, reinterpret_cast<void*>(kArenaSize - 1)});
        options.exports.push_back({jit::kUnsafeStackSymbol, reinterpret_cast<void*>(&test_unsafe_stack)});
        options.exports.push_back({jit::kStackOverflowSymbol, reinterpret_cast<void*>(&test_stack_overflow)});
    }
    auto j = jit::Jit::create(std::move(options));
    if (!j) FAIL("Jit::create: " << j.error().describe());
    return std::move(*j);
}

struct Outcome {
    bs_ctx ctx;
    Stop stop = Stop::none;
};

// UBSan's function check (clang) reads the 8 bytes before a function called through a pointer;
// the first kernel sits at the start of the code zone, after PROT_NONE pages.
#if defined(__clang__)
#define BITSHIP_NO_SANITIZE_FUNCTION __attribute__((no_sanitize("function")))
#else
#define BITSHIP_NO_SANITIZE_FUNCTION
#endif

/// Runs `entry` as an sfi agent would: the arguments copied into the arena, the unsafe stack
/// reset; a stop by the overflow or forged-call handler is reported, not fatal.
BITSHIP_NO_SANITIZE_FUNCTION Outcome run(const jit::CompiledCode& code, const char* entry, std::span<const std::byte> args, bool in_arena = true) {
    auto fn = code.entry(entry);
    REQUIRE(fn);
    Outcome out;
    std::byte* at = arena().base + kArgsAt;
    REQUIRE(args.size() <= 64 * 1024);
    if (in_arena) {
        std::memcpy(at, args.data(), args.size());
        out.ctx.args = std::span<const std::byte>(at, args.size());
    } else {
        out.ctx.args = args;
    }
    t_stack.limit = arena().base + kStackAt;
    t_stack.sp = t_stack.limit + kStackBytes;
    int stopped = sigsetjmp(t_stop, 0);
    if (stopped == 0) {
        (*fn)(&out.ctx);
    } else {
        out.stop = static_cast<Stop>(stopped);
    }
    return out;
}

template <class T> std::span<const std::byte> bytes_of(const T& v) { return std::as_bytes(std::span(&v, 1)); }

/// sfi.c's kernels; `kernels` "sfi_stateless" for the build without a writable global.
std::shared_ptr<const jit::CompiledCode> compile(jit::Jit& j, const std::vector<std::string>& entries,
                                                 const std::string& kernels = "sfi") {
    auto bundle = make_bundle(kernel_bitcode(kernels), entries);
    auto code = j.compile(bundle.bytes, bundle.hash);
    if (!code) FAIL("compile: " << code.error().describe());
    return *code;
}

const std::vector<std::string> kEntries{"sfi_write", "sfi_read", "sfi_compute", "sfi_recurse", "sfi_indirect"};

} // namespace

TEST_CASE("to_string names each sandbox mode", "[unit]") {
    CHECK(jit::to_string(jit::Sandbox::none) == "none");
    CHECK(jit::to_string(jit::Sandbox::sfi) == "sfi");
}

TEST_CASE("an sfi JIT needs the arena's zones and symbols", "[unit]") {
    jit::JitOptions options;
    options.exports = jit_test::runtime_exports();
    options.sandbox = jit::Sandbox::sfi;
    auto no_zones = jit::Jit::create(options);
    REQUIRE_FALSE(no_zones);
    CHECK(no_zones.error().code == Errc::invalid_argument);
    options.zones = arena().zones();
    auto no_symbols = jit::Jit::create(options);
    REQUIRE_FALSE(no_symbols);
    CHECK(no_symbols.error().code == Errc::invalid_argument);
    CHECK_THAT(no_symbols.error().message, Catch::Contains(jit::kArenaBaseSymbol));
    // One JIT per zones: a second live one would map its pages over the first's.
    auto first = make_jit(jit::Sandbox::sfi);
    jit::JitOptions second = options;
    second.exports.clear();
    for (const auto& e : jit_test::runtime_exports()) second.exports.push_back(e);
    second.exports.push_back({jit::kArenaBaseSymbol, arena().base});
    second.exports.push_back({jit::kArenaMaskSymbol, reinterpret_cast<void*>(kArenaSize - 1)});
    second.exports.push_back({jit::kUnsafeStackSymbol, reinterpret_cast<void*>(&test_unsafe_stack)});
    second.exports.push_back({jit::kStackOverflowSymbol, reinterpret_cast<void*>(&test_stack_overflow)});
    auto overlapping = jit::Jit::create(second);
    REQUIRE_FALSE(overlapping);
    CHECK_THAT(overlapping.error().message, Catch::Contains("overlap"));
    first.reset();
    CHECK(jit::Jit::create(second)); // free again once the first is gone
}

TEST_CASE("sfi: a write through a forged pointer lands inside the arena and the canary outside is unchanged",
          "[unit]") {
    // Both tiers' code: one tier, two tiers for a slice without state (tier 0 first), and
    // two for one with a writable global (compiled once, at tier 1).
    for (auto [tiers, kernels] : {std::pair{1u, "sfi"}, {2u, "sfi_stateless"}, {2u, "sfi"}}) {
        INFO("tiers " << tiers << ", " << kernels);
        auto t = make_jit(jit::Sandbox::sfi, tiers);
        auto code = compile(*t, kEntries, kernels);
        CHECK(code->stats().tier == (tiers == 2 && kernels == std::string("sfi_stateless") ? 0u : 1u));
        *arena().landing = 0;
        const std::uint64_t args[2] = {reinterpret_cast<std::uint64_t>(arena().canary), 0xbadc0ffee};
        auto out = run(*code, "sfi_write", std::as_bytes(std::span(args)));
        REQUIRE(out.stop == Stop::none);
        REQUIRE(jit_test::reply_u64(out.ctx) == 1u);
        CHECK(*arena().canary == kCanaryValue);
        CHECK(*arena().landing == 0xbadc0ffee);
    }
    // The same kernel without the sandbox does write the canary: the test's forged pointer is real.
    auto none = make_jit(jit::Sandbox::none);
    auto code = compile(*none, kEntries);
    const std::uint64_t args[2] = {reinterpret_cast<std::uint64_t>(arena().canary), 0xbadc0ffee};
    auto out = run(*code, "sfi_write", std::as_bytes(std::span(args)));
    CHECK(*arena().canary == 0xbadc0ffee);
    *arena().canary = kCanaryValue;
}

TEST_CASE("sfi reaches the bitship-compiler process: its code is confined too", "[unit]") {
    auto j = make_jit(jit::Sandbox::sfi, 1, {{}, jit::CompilerMode::process});
    auto code = compile(*j, kEntries);
    *arena().landing = 0;
    const std::uint64_t args[2] = {reinterpret_cast<std::uint64_t>(arena().canary), 0xc0de};
    auto out = run(*code, "sfi_write", std::as_bytes(std::span(args)));
    REQUIRE(out.stop == Stop::none);
    CHECK(*arena().canary == kCanaryValue);
    CHECK(*arena().landing == 0xc0de);
}

TEST_CASE("the disk cache never hands an sfi object to a none agent, nor the reverse", "[unit]") {
    const auto dir = std::filesystem::temp_directory_path() / ("bitship-sfi-test-" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir);
    auto bundle = make_bundle(kernel_bitcode("sfi"), kEntries);
    {
        auto sfi = make_jit(jit::Sandbox::sfi, 1, {dir});
        REQUIRE(sfi->compile(bundle.bytes, bundle.hash));
    }
    {
        // A restarted agent of the same mode links the object as it is.
        auto sfi = make_jit(jit::Sandbox::sfi, 1, {dir});
        auto again = sfi->load(bundle.hash);
        REQUIRE(again);
        CHECK((*again)->stats().from_object);
    }
    {
        // A none agent refuses it and compiles the bundle: its code writes where it is told.
        auto none = make_jit(jit::Sandbox::none, 1, {dir});
        auto code = none->load(bundle.hash);
        REQUIRE(code);
        CHECK_FALSE((*code)->stats().from_object);
        std::uint64_t target = 0;
        const std::uint64_t args[2] = {reinterpret_cast<std::uint64_t>(&target), 7};
        run(**code, "sfi_write", std::as_bytes(std::span(args)), false);
        CHECK(target == 7);
    }
    {
        // And an sfi agent refuses the none object it left.
        auto sfi = make_jit(jit::Sandbox::sfi, 1, {dir});
        auto code = sfi->load(bundle.hash);
        REQUIRE(code);
        CHECK_FALSE((*code)->stats().from_object);
        *arena().landing = 0;
        const std::uint64_t args[2] = {reinterpret_cast<std::uint64_t>(arena().canary), 9};
        run(**code, "sfi_write", std::as_bytes(std::span(args)));
        CHECK(*arena().canary == kCanaryValue);
        CHECK(*arena().landing == 9);
    }
    std::filesystem::remove_all(dir);
}

// Whether 8 bytes at `p` can be read: the kernel copies them into a pipe, or says EFAULT.
static bool readable(const void* p) {
    int fds[2];
    REQUIRE(::pipe(fds) == 0);
    const bool ok = ::write(fds[1], p, 8) == 8;
    ::close(fds[0]);
    ::close(fds[1]);
    return ok;
}

TEST_CASE("sfi: a read through a forged pointer cannot see a secret outside the arena", "[unit]") {
    auto j = make_jit(jit::Sandbox::sfi);
    auto code = compile(*j, kEntries);
    *arena().landing = 0x1a4d1a4d;
    const std::uint64_t where = reinterpret_cast<std::uint64_t>(arena().canary);
    auto out = run(*code, "sfi_read", bytes_of(where));
    REQUIRE(out.stop == Stop::none);
    auto seen = jit_test::reply_u64(out.ctx);
    REQUIRE(seen);
    CHECK(*seen != kCanaryValue);
    CHECK(*seen == 0x1a4d1a4d);
    // A secret in the test's own heap: whatever the kernel sees, it is not the secret (its
    // address lands in an unmapped part of the arena or on one of the test's pages). Only a
    // landing the test can read is tried (this harness runs kernels unguarded): the JIT's data
    // zone, for one, is reserved whole but readable only where the JIT has put something.
    REQUIRE(readable(arena().landing));
    REQUIRE_FALSE(readable(arena().base + 3 * kMiB)); // between the arguments and the stack: reserved only
    auto secret = std::make_unique<std::uint64_t>(0x7e57c0de7e57c0de);
    const std::uint64_t landing_offset = reinterpret_cast<std::uint64_t>(secret.get()) & (kArenaSize - 1);
    if (readable(arena().base + landing_offset)) {
        const std::uint64_t heap_where = reinterpret_cast<std::uint64_t>(secret.get());
        auto heap_out = run(*code, "sfi_read", bytes_of(heap_where));
        auto heap_seen = jit_test::reply_u64(heap_out.ctx);
        REQUIRE(heap_seen);
        CHECK(*heap_seen != *secret);
    }
}

TEST_CASE("sfi: stack arrays, address-taken locals, VLAs, structs by value and global tables compute what "
          "they compute without the sandbox",
          "[unit]") {
    auto none = make_jit(jit::Sandbox::none);
    auto none_code = compile(*none, kEntries);
    for (unsigned tiers : {1u, 2u}) {
        auto sfi = make_jit(jit::Sandbox::sfi, tiers);
        auto sfi_code = compile(*sfi, kEntries);
        for (std::uint32_t n : {1u, 7u, 64u, 1000u, 4096u}) {
            for (std::uint32_t seed : {0u, 5u, 0xdeadbeefu}) {
                INFO("tiers " << tiers << " n " << n << " seed " << seed);
                const std::uint32_t args[2] = {n, seed};
                auto expected = run(*none_code, "sfi_compute", std::as_bytes(std::span(args)), false);
                auto got = run(*sfi_code, "sfi_compute", std::as_bytes(std::span(args)));
                REQUIRE(expected.stop == Stop::none);
                REQUIRE(got.stop == Stop::none);
                auto want = jit_test::reply_u64(expected.ctx);
                REQUIRE(want);
                CHECK(jit_test::reply_u64(got.ctx) == want);
                // The unsafe stack is back where the call found it.
                CHECK(t_stack.sp == arena().base + kStackAt + kStackBytes);
            }
        }
    }
}

TEST_CASE("sfi: recursion keeps its address-taken frames on the unsafe stack and stops at its limit",
          "[unit]") {
    auto none = make_jit(jit::Sandbox::none);
    auto sfi = make_jit(jit::Sandbox::sfi);
    auto none_code = compile(*none, kEntries);
    auto sfi_code = compile(*sfi, kEntries);
    // 100 frames of 512 bytes fit in 256 KiB.
    const std::uint32_t shallow = 100;
    auto want = run(*none_code, "sfi_recurse", bytes_of(shallow), false);
    auto got = run(*sfi_code, "sfi_recurse", bytes_of(shallow));
    REQUIRE(got.stop == Stop::none);
    CHECK(jit_test::reply_u64(got.ctx) == jit_test::reply_u64(want.ctx));
    // 10,000 do not: __bs_stack_overflow is called before a frame passes the limit.
    const std::uint32_t deep = 10000;
    auto stopped = run(*sfi_code, "sfi_recurse", bytes_of(deep));
    CHECK(stopped.stop == Stop::overflow);
    CHECK_FALSE(stopped.ctx.answered());
    CHECK(arena().contains(t_stack.sp));
    CHECK(t_stack.sp >= t_stack.limit);
    // And the next call runs normally.
    auto again = run(*sfi_code, "sfi_recurse", bytes_of(shallow));
    CHECK(jit_test::reply_u64(again.ctx) == jit_test::reply_u64(want.ctx));
}

TEST_CASE("sfi: an indirect call to a forged target is still stopped, one to the kernel's own function runs",
          "[unit]") {
    auto sfi = make_jit(jit::Sandbox::sfi);
    auto code = compile(*sfi, kEntries);
    struct {
        std::uint64_t (*fn)(std::uint64_t);
        std::uint64_t x;
    } own{nullptr, 21}, forged{&test_evil, 21};
    auto ok = run(*code, "sfi_indirect", bytes_of(own));
    REQUIRE(ok.stop == Stop::none);
    CHECK(jit_test::reply_u64(ok.ctx) == 42u);
    auto stopped = run(*code, "sfi_indirect", bytes_of(forged));
    CHECK(stopped.stop == Stop::forged_call);
    CHECK(g_evil_calls == 0);
}

TEST_CASE("sfi refuses variadic functions, accesses wider than 4 KiB, segment-relative pointers and the sandbox's own symbols, naming the rule", "[unit]") {
    auto sfi = make_jit(jit::Sandbox::sfi);
    for (auto [name, entry, rules] :
         {std::tuple{"sfi_varargs", "sfi_varargs", std::vector<std::string>{"sfi-no-varargs", "va_start"}},
          std::tuple{"sfi_wide", "sfi_wide", std::vector<std::string>{"sfi-access-size"}},
          std::tuple{"sfi_segment", "sfi_segment", std::vector<std::string>{"sfi-address-space"}},
          std::tuple{"sfi_reserved", "sfi_reserved", std::vector<std::string>{"sfi-reserved-name"}}}) {
        INFO(name);
        auto bundle = make_bundle(kernel_bitcode(name), {entry});
        auto code = sfi->compile(bundle.bytes, bundle.hash);
        REQUIRE_FALSE(code);
        CHECK(code.error().code == Errc::policy_violation);
        bool named = false;
        for (const auto& r : rules) named = named || code.error().message.find(r) != std::string::npos;
        CHECK(named);
        INFO(code.error().message);
    }
    // The wide load is fine without the sandbox.
    auto none = make_jit(jit::Sandbox::none);
    auto bundle = make_bundle(kernel_bitcode("sfi_wide"), {"sfi_wide"});
    CHECK(none->compile(bundle.bytes, bundle.hash));
}

TEST_CASE("sfi: after the pass, every load and store is masked, a safe alloca's, or the unsafe stack's own",
          "[unit]") {
    llvm::LLVMContext context;
    auto bitcode = kernel_bitcode("sfi");
    auto buffer = llvm::MemoryBuffer::getMemBuffer(
        llvm::StringRef(reinterpret_cast<const char*>(bitcode.data()), bitcode.size()), "sfi", false);
    auto module = llvm::parseBitcodeFile(*buffer, context);
    REQUIRE(static_cast<bool>(module));
    // The checker is not vacuous: the kernels make unconfined accesses before the pass.
    CHECK_FALSE(jit::unconfined_accesses(**module).empty());
    auto stats = jit::confine_memory(**module);
    REQUIRE(stats);
    std::string problems;
    llvm::raw_string_ostream out(problems);
    CHECK_FALSE(llvm::verifyModule(**module, &out));
    INFO(problems);
    auto left = jit::unconfined_accesses(**module);
    for (const auto& l : left) INFO(l);
    CHECK(left.empty());
    CHECK(stats->accesses_masked > 10);
    CHECK(stats->allocas_moved >= 3);  // local, copy, acc and the like, the recursion's frame
    CHECK(stats->allocas_dynamic >= 1); // the VLA
    CHECK(stats->mem_calls >= 1);       // the 512-byte memcpy
    CHECK(stats->mem_inline >= 1);      // the 64-byte memset
    CHECK(stats->unsafe_frames >= 3);
}

TEST_CASE("sfi: the JIT's data is inside the arena and its code outside, never writable and executable",
          "[unit]") {
    auto sfi = make_jit(jit::Sandbox::sfi);
    auto code = compile(*sfi, kEntries);
    auto fn = code->entry("sfi_compute");
    REQUIRE(fn);
    const auto zones = arena().zones();
    auto* at = reinterpret_cast<std::byte*>(*fn);
    CHECK(at >= zones.code);
    CHECK(at < zones.code + zones.code_size);
    CHECK_FALSE(arena().contains(at));
    std::ifstream maps("/proc/self/maps");
    REQUIRE(maps);
    std::string line;
    bool data_seen = false;
    while (std::getline(maps, line)) {
        auto dash = line.find('-');
        auto lo = std::stoull(line.substr(0, dash), nullptr, 16);
        auto perms = line.substr(line.find(' ') + 1, 4);
        INFO(line);
        CHECK_FALSE((perms[1] == 'w' && perms[2] == 'x'));
        auto* p = reinterpret_cast<std::byte*>(lo);
        if (p >= zones.data && p < zones.data + zones.data_size && perms[0] == 'r') data_seen = true;
        if (p >= zones.code && p < zones.code + zones.code_size && perms[0] == 'r') CHECK(perms[2] == 'x');
    }
    CHECK(data_seen);
}

}  // namespace sfi_test_cpp
