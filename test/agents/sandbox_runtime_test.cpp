// The checked runtime under --sandbox sfi (agents/sandbox_runtime.*), called the way shipped
// code calls it: through the addresses sandboxed_exports() gives the JIT, from a "kernel" run
// by the kernel guard. Each check that fails must stop that kernel with the right code, and the
// next call on the thread must work.
#include <sys/mman.h>

#include <chrono>
#include <cstring>
#include <map>
#include <optional>
#include <string>

#include <catch2/catch.hpp>

#include "kernel_guard.hpp"
#include "kernel_heap.hpp"
#include "runtime.hpp"
#include "sandbox_arena.hpp"
#include "sandbox_runtime.hpp"

namespace sandbox_runtime_test_cpp {

using bitship::Errc;
using namespace bitship::agent;

namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

// One arena and its exports for the whole file (an arena per test would do as well; this keeps
// the thread's area claims few).
struct Sandbox {
    std::unique_ptr<SandboxArena> arena;
    std::map<std::string, void*, std::less<>> exports;
    Sandbox() {
        install_kernel_guard();
        prepare_worker_thread();
        ArenaOptions o;
        o.size_log2 = 30;
        o.heap_bytes = 4 * kMiB;
        o.stack_bytes = kMiB;
        o.call_buffer_bytes = 4096;
        o.max_threads = 2;
        o.jit_data_bytes = 16 * kMiB;
        o.jit_code_bytes = 16 * kMiB;
        auto a = SandboxArena::reserve(o);
        REQUIRE(a.has_value());
        arena = std::move(*a);
        for (auto& e : sandboxed_exports(*arena)) exports[e.name] = e.address;
    }
    template <class F> F* fn(std::string_view name) {
        auto it = exports.find(name);
        REQUIRE(it != exports.end());
        return reinterpret_cast<F*>(it->second);
    }
    ThreadArea& area() { return **arena->this_thread(); }
};

Sandbox& sandbox() {
    static Sandbox s;
    return s;
}

// What the test's "kernel" does: set before each run (a kernel is a plain function pointer).
std::function<void(bs_ctx*)> g_body;
void kernel(bs_ctx* ctx) { g_body(ctx); }

// Runs `body` as a kernel of one sandboxed call; the call's error, if it was stopped.
std::optional<bitship::Error> run(bs_ctx& ctx, std::function<void(bs_ctx*)> body) {
    auto entered = SandboxedCall::enter(*sandbox().arena, ctx);
    REQUIRE(entered.has_value());
    g_body = std::move(body);
    auto outcome = run_guarded(&kernel, &ctx, std::chrono::milliseconds(0));
    SandboxedCall::leave();
    return outcome;
}

std::optional<bitship::Error> run(std::function<void(bs_ctx*)> body) {
    bs_ctx ctx;
    ctx.max_result = 1 << 20;
    ctx.max_args = 1 << 20;
    return run(ctx, std::move(body));
}

void expect_stopped(const std::optional<bitship::Error>& outcome, Errc code, const std::string& says) {
    REQUIRE(outcome.has_value());
    CHECK(outcome->code == code);
    CHECK_THAT(outcome->message, Catch::Contains(says));
}

// Memory inside the arena the kernel may use: its heap, as a kernel would get it.
std::byte* arena_bytes(std::size_t n) {
    auto* p = sandbox().fn<void*(size_t)>("malloc")(n);
    REQUIRE(p != nullptr);
    return static_cast<std::byte*>(p);
}

} // namespace

TEST_CASE("sandboxed bs_args hands out the call's arguments from the call buffer inside the arena", "[unit]") {
    auto& s = sandbox();
    std::vector<std::byte> args(100);
    for (std::size_t i = 0; i < args.size(); ++i) args[i] = std::byte(i);
    bs_ctx ctx;
    ctx.args = args;
    auto outcome = run(ctx, [&](bs_ctx* c) {
        auto* len = reinterpret_cast<size_t*>(arena_bytes(sizeof(size_t)));
        const void* p = s.fn<const void*(bs_ctx*, size_t*)>("bs_args")(c, len);
        CHECK(p == s.area().call_buffer);
        CHECK(*len == 100);
        CHECK(std::memcmp(p, args.data(), 100) == 0);
    });
    CHECK_FALSE(outcome.has_value());
    CHECK(ctx.args.data() == s.area().call_buffer);
    // Left for the next call: nothing of these arguments.
    CHECK(std::all_of(s.area().call_buffer, s.area().call_buffer + 100, [](std::byte b) { return b == std::byte{0}; }));

    bs_ctx none;
    outcome = run(none, [&](bs_ctx* c) {
        const void* p = s.fn<const void*(bs_ctx*, size_t*)>("bs_args")(c, nullptr);
        CHECK(s.arena->contains(p, 0)); // no arguments: still a pointer inside the arena
    });
    CHECK_FALSE(outcome.has_value());

    bs_ctx over;
    std::vector<std::byte> big(4097);
    over.args = big;
    auto refused = SandboxedCall::enter(*s.arena, over);
    REQUIRE_FALSE(refused.has_value());
    CHECK(refused.error().code == Errc::too_large);
}

TEST_CASE("sandboxed runtime functions stop a kernel that passes a range outside the arena", "[unit]") {
    auto& s = sandbox();
    auto reply = s.fn<int(bs_ctx*, const void*, size_t)>("bs_reply");
    std::uint64_t outside = 42; // on this test's stack: not in the arena

    auto outcome = run([&](bs_ctx* c) { reply(c, &outside, sizeof outside); });
    expect_stopped(outcome, Errc::out_of_bounds, "bs_reply: 0x");
    CHECK_THAT(outcome->message, Catch::Contains("+ 8 bytes reach outside the kernel's sandbox arena"));

    // Past the result limit: refused as without the sandbox, before any byte is read.
    int refused = BS_OK;
    outcome = run([&](bs_ctx* c) { refused = reply(c, arena_bytes(16), std::size_t{1} << 40); });
    CHECK_FALSE(outcome);
    CHECK(refused == BS_ETOOLARGE);

    outcome = run([&](bs_ctx* c) { s.fn<const void*(bs_ctx*, size_t*)>("bs_args")(c, reinterpret_cast<size_t*>(&outside)); });
    expect_stopped(outcome, Errc::out_of_bounds, "bs_args");

    outcome = run([&](bs_ctx* c) { s.fn<int(bs_ctx*, int, const char*)>("bs_fail")(c, 1, "a literal, outside"); });
    expect_stopped(outcome, Errc::out_of_bounds, "bs_fail");

    outcome = run([&](bs_ctx* c) { s.fn<void*(bs_ctx*, const char*, size_t*)>("bs_region")(c, "name", nullptr); });
    expect_stopped(outcome, Errc::out_of_bounds, "bs_region");

    outcome = run([&](bs_ctx* c) {
        s.fn<int(bs_ctx*, uint32_t, const char*, const void*, size_t)>("bs_ship")(c, 0, "entry", nullptr, 0);
    });
    expect_stopped(outcome, Errc::out_of_bounds, "bs_ship");

    outcome = run([&](bs_ctx* c) { s.fn<int(bs_ctx*, uint32_t, const void*, size_t)>("bs_forward")(c, 0, &outside, 8); });
    expect_stopped(outcome, Errc::out_of_bounds, "bs_forward");

    outcome = run([&](bs_ctx* c) { s.fn<int(bs_ctx*, uint32_t*)>("bs_self")(c, reinterpret_cast<uint32_t*>(&outside)); });
    expect_stopped(outcome, Errc::out_of_bounds, "bs_self");

    outcome = run([&](bs_ctx* c) {
        auto* actual = reinterpret_cast<size_t*>(arena_bytes(16) + 4); // inside, misaligned
        s.fn<void*(bs_ctx*, const char*, size_t, size_t*)>("bs_region_create")(c, nullptr, 1, actual);
    });
    expect_stopped(outcome, Errc::out_of_bounds, "not aligned");
}

TEST_CASE("sandboxed runtime functions do their work on ranges inside the arena", "[unit]") {
    auto& s = sandbox();
    bs_ctx ctx;
    ctx.max_result = 64;
    auto outcome = run(ctx, [&](bs_ctx* c) {
        auto* data = arena_bytes(8);
        std::memcpy(data, "answered", 8);
        CHECK(s.fn<int(bs_ctx*, const void*, size_t)>("bs_reply")(c, data, 8) == BS_OK);
        CHECK(s.fn<int(bs_ctx*, const void*, size_t)>("bs_reply")(c, data, 8) == BS_EALREADY);
        auto* count = reinterpret_cast<uint32_t*>(arena_bytes(4));
        CHECK(s.fn<int(bs_ctx*, uint32_t*)>("bs_self")(c, count) == -1);
        CHECK(*count == 0);
        auto* name = reinterpret_cast<char*>(arena_bytes(8));
        std::strcpy(name, "none");
        auto* size = reinterpret_cast<size_t*>(arena_bytes(8));
        CHECK(s.fn<void*(bs_ctx*, const char*, size_t*)>("bs_region")(c, name, size) == nullptr);
        CHECK(*size == 0);
    });
    CHECK_FALSE(outcome.has_value());
    REQUIRE(ctx.reply.size() == 8);
    CHECK(std::memcmp(ctx.reply.data(), "answered", 8) == 0);

    bs_ctx failing;
    outcome = run(failing, [&](bs_ctx* c) {
        auto* msg = reinterpret_cast<char*>(arena_bytes(32));
        std::strcpy(msg, "kernel says no");
        CHECK(s.fn<int(bs_ctx*, int, const char*)>("bs_fail")(c, 7, msg) == BS_OK);
    });
    CHECK_FALSE(outcome.has_value());
    CHECK(failing.failed);
    CHECK(failing.fail_code == 7);
    CHECK(failing.fail_message == "kernel says no");
}

TEST_CASE("a ctx that is not the thread's current call is refused and never dereferenced", "[unit]") {
    auto& s = sandbox();
    bs_ctx ctx;
    auto outcome = run(ctx, [&](bs_ctx*) {
        auto* forged = reinterpret_cast<bs_ctx*>(std::uintptr_t{0x10}); // would fault if read
        auto* data = arena_bytes(8);
        CHECK(s.fn<int(bs_ctx*, const void*, size_t)>("bs_reply")(forged, data, 8) == BS_EINVAL);
        CHECK(s.fn<int(bs_ctx*, int, const char*)>("bs_fail")(forged, 1, nullptr) == BS_EINVAL);
        CHECK(s.fn<int(bs_ctx*, uint32_t, const void*, size_t)>("bs_forward")(forged, 0, nullptr, 0) == BS_EINVAL);
        CHECK(s.fn<int(bs_ctx*, uint32_t*)>("bs_self")(forged, nullptr) == BS_EINVAL);
        CHECK(s.fn<void*(bs_ctx*, const char*, size_t*)>("bs_region")(forged, nullptr, nullptr) == nullptr);
        auto* len = reinterpret_cast<size_t*>(arena_bytes(8));
        *len = 99;
        CHECK(s.fn<const void*(bs_ctx*, size_t*)>("bs_args")(forged, len) != nullptr);
        CHECK(*len == 0);
        bs_ctx other; // a real ctx, of no running call
        CHECK(s.fn<int(bs_ctx*, const void*, size_t)>("bs_reply")(&other, data, 8) == BS_EINVAL);
        CHECK_FALSE(other.answered);
    });
    CHECK_FALSE(outcome.has_value());
    CHECK_FALSE(ctx.answered);
}

TEST_CASE("checked memcpy, memset, memcmp and memmove accept the arena and stop at its edges", "[unit]") {
    auto& s = sandbox();
    auto memcpy_ = s.fn<void*(void*, const void*, size_t)>("memcpy");
    auto memmove_ = s.fn<void*(void*, const void*, size_t)>("memmove");
    auto memset_ = s.fn<void*(void*, int, size_t)>("memset");
    auto memcmp_ = s.fn<int(const void*, const void*, size_t)>("memcmp");
    char outside[16] = "agent's secret";

    auto outcome = run([&](bs_ctx*) {
        auto* a = arena_bytes(64);
        auto* b = arena_bytes(64);
        memset_(a, 'x', 64);
        CHECK(memcpy_(b, a, 64) == b);
        CHECK(memcmp_(a, b, 64) == 0);
        CHECK(memmove_(a + 1, a, 32) == a + 1);
        CHECK(memcpy_(a, &outside, 0) == a); // no bytes touch nothing: any pointer passes
        CHECK(memcpy_(nullptr, nullptr, 0) == nullptr);
    });
    CHECK_FALSE(outcome.has_value());

    outcome = run([&](bs_ctx*) { memcpy_(arena_bytes(16), outside, 16); });
    expect_stopped(outcome, Errc::out_of_bounds, "memcpy: 0x");
    outcome = run([&](bs_ctx*) { memcpy_(outside, arena_bytes(16), 16); });
    expect_stopped(outcome, Errc::out_of_bounds, "memcpy");
    outcome = run([&](bs_ctx*) { memset_(outside, 0, 1); });
    expect_stopped(outcome, Errc::out_of_bounds, "memset");
    outcome = run([&](bs_ctx*) { memmove_(arena_bytes(16), outside, 16); });
    expect_stopped(outcome, Errc::out_of_bounds, "memmove");
    outcome = run([&](bs_ctx*) { memcmp_(arena_bytes(16), outside, 16); });
    expect_stopped(outcome, Errc::out_of_bounds, "memcmp");
    // A range that starts inside and runs past the arena's end.
    outcome = run([&](bs_ctx*) { memset_(s.arena->base() + s.arena->size() - 8, 0, 16); });
    expect_stopped(outcome, Errc::out_of_bounds, "+ 16 bytes reach outside");
    CHECK(std::string(outside) == "agent's secret");
}

TEST_CASE("checked string functions read only inside the arena", "[unit]") {
    auto& s = sandbox();
    auto strlen_ = s.fn<size_t(const char*)>("strlen");
    auto strnlen_ = s.fn<size_t(const char*, size_t)>("strnlen");
    auto strcmp_ = s.fn<int(const char*, const char*)>("strcmp");
    auto strncmp_ = s.fn<int(const char*, const char*, size_t)>("strncmp");
    auto strchr_ = s.fn<char*(const char*, int)>("strchr");
    auto strrchr_ = s.fn<char*(const char*, int)>("strrchr");
    auto strstr_ = s.fn<char*(const char*, const char*)>("strstr");

    auto outcome = run([&](bs_ctx*) {
        auto* a = reinterpret_cast<char*>(arena_bytes(32));
        auto* b = reinterpret_cast<char*>(arena_bytes(32));
        std::strcpy(a, "hello, sandbox");
        std::strcpy(b, "hello, world");
        CHECK(strlen_(a) == 14);
        CHECK(strnlen_(a, 5) == 5);
        CHECK(strnlen_(a, 100) == 14);
        CHECK(strcmp_(a, b) < 0);
        CHECK(strcmp_(a, a) == 0);
        CHECK(strncmp_(a, b, 7) == 0);
        CHECK(strncmp_(a, b, 8) != 0);
        CHECK(strchr_(a, 's') == a + 7);
        CHECK(strchr_(a, 0) == a + 14);
        CHECK(strchr_(a, 'q') == nullptr);
        CHECK(strrchr_(a, 'o') == a + 12);
        auto* needle = reinterpret_cast<char*>(arena_bytes(8));
        std::strcpy(needle, "sand");
        CHECK(strstr_(a, needle) == a + 7);
        std::strcpy(needle, "sandy");
        CHECK(strstr_(a, needle) == nullptr);
        strstr_(a, "sand"); // a needle outside the arena: stopped here
    });
    expect_stopped(outcome, Errc::out_of_bounds, "strstr");

    const char* outside = "outside";
    for (const char* fn : {"strlen", "strchr", "strrchr"}) {
        outcome = run([&](bs_ctx*) {
            if (std::string_view(fn) == "strlen") strlen_(outside);
            else if (std::string_view(fn) == "strchr") strchr_(outside, 'x');
            else strrchr_(outside, 'x');
        });
        expect_stopped(outcome, Errc::out_of_bounds, fn);
    }
    outcome = run([&](bs_ctx*) { strcmp_(reinterpret_cast<char*>(arena_bytes(8)), outside); });
    expect_stopped(outcome, Errc::out_of_bounds, "strcmp");
    outcome = run([&](bs_ctx*) { strnlen_(outside, 3); });
    expect_stopped(outcome, Errc::out_of_bounds, "strnlen");

    // A string that runs to the arena's very end. The arena's top is a guard, so this maps a
    // page there for the test: the functions must stop at the end, not read past it.
    std::byte* last = s.arena->base() + s.arena->size() - 4096;
    REQUIRE(::mmap(last, 4096, PROT_READ | PROT_WRITE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) == last);
    std::memset(last, 'z', 4096);
    auto* tail = reinterpret_cast<const char*>(last);
    outcome = run([&](bs_ctx*) { strlen_(tail); });
    expect_stopped(outcome, Errc::out_of_bounds, "runs to the end of the kernel's sandbox arena");
    outcome = run([&](bs_ctx*) { strcmp_(tail, tail); });
    expect_stopped(outcome, Errc::out_of_bounds, "strcmp");
    outcome = run([&](bs_ctx*) { strnlen_(tail, 8192); });
    expect_stopped(outcome, Errc::out_of_bounds, "strnlen");
    outcome = run([&](bs_ctx*) {
        CHECK(strnlen_(tail, 4096) == 4096); // bounded by its limit, not the arena: fine
        CHECK(strncmp_(tail, tail, 4096) == 0);
    });
    CHECK_FALSE(outcome.has_value());
    auto bs_fail_ = s.fn<int(bs_ctx*, int, const char*)>("bs_fail");
    outcome = run([&](bs_ctx* c) { bs_fail_(c, 1, tail + 4096 - 100); }); // 100 bytes to the end, no NUL
    expect_stopped(outcome, Errc::out_of_bounds, "bs_fail");
    bs_ctx failing;
    outcome = run(failing, [&](bs_ctx* c) { bs_fail_(c, 1, tail); }); // truncated to 1 KiB before the end: fine
    CHECK_FALSE(outcome.has_value());
    CHECK(failing.fail_message == std::string(1024, 'z'));
    REQUIRE(::mmap(last, 4096, PROT_NONE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0) == last);
}

TEST_CASE("sandboxed malloc serves from the call's heap, stops at the quota and is reclaimed when the call ends",
          "[unit]") {
    auto& s = sandbox();
    auto malloc_ = s.fn<void*(size_t)>("malloc");
    auto calloc_ = s.fn<void*(size_t, size_t)>("calloc");
    auto realloc_ = s.fn<void*(void*, size_t)>("realloc");
    auto free_ = s.fn<void(void*)>("free");

    auto outcome = run([&](bs_ctx*) {
        void* p = malloc_(1000);
        CHECK(s.arena->contains(p, 1000));
        p = realloc_(p, 5000);
        CHECK(s.arena->contains(p, 5000));
        auto* z = static_cast<unsigned char*>(calloc_(10, 10));
        CHECK(std::all_of(z, z + 100, [](unsigned char c) { return c == 0; }));
        free_(z);
        free_(nullptr);
        (void)malloc_(2 * kMiB); // leaked: the call's end takes it back
    });
    CHECK_FALSE(outcome.has_value());
    CHECK(last_call_heap_peak() > 2 * kMiB);
    CHECK(s.area().heap->in_use() == 0);
    CHECK_FALSE(s.area().heap->touched());

    outcome = run([&](bs_ctx*) { malloc_(5 * kMiB); });
    expect_stopped(outcome, Errc::too_large,
                   "kernel heap: malloc of 5242880 bytes would pass the call's quota of 4 MiB (0 bytes in use); keep "
                   "large or lasting data in a region (bs_region_create)");
    outcome = run([&](bs_ctx*) {
        for (;;) malloc_(kMiB); // a kernel that leaks until it is stopped
    });
    expect_stopped(outcome, Errc::too_large, "would pass the call's quota of 4 MiB");
    outcome = run([&](bs_ctx*) { calloc_(SIZE_MAX, 2); });
    expect_stopped(outcome, Errc::too_large, "calloc");

    int outside = 0;
    outcome = run([&](bs_ctx*) { free_(&outside); });
    expect_stopped(outcome, Errc::out_of_bounds, "free: 0x");
    CHECK_THAT(outcome->message, Catch::Contains("is no block this call allocated"));
    outcome = run([&](bs_ctx*) {
        void* p = malloc_(10);
        free_(p);
        free_(p);
    });
    expect_stopped(outcome, Errc::out_of_bounds, "is no block this call allocated");
    outcome = run([&](bs_ctx*) { realloc_(static_cast<char*>(malloc_(64)) + 16, 128); });
    expect_stopped(outcome, Errc::out_of_bounds, "realloc");

    // And after all those, the thread's next call runs as usual on a fresh heap.
    outcome = run([&](bs_ctx*) { CHECK(malloc_(3 * kMiB) != nullptr); });
    CHECK_FALSE(outcome.has_value());
}

TEST_CASE("the sfi symbols: the arena's base and mask as addresses, the unsafe stack, stack overflow", "[unit]") {
    auto& s = sandbox();
    CHECK(s.exports.at(bitship::jit::kArenaBaseSymbol) == s.arena->base());
    CHECK(reinterpret_cast<std::uintptr_t>(s.exports.at(bitship::jit::kArenaMaskSymbol)) == s.arena->mask());
    auto unsafe_stack = s.fn<bitship::jit::UnsafeStack*()>(bitship::jit::kUnsafeStackSymbol);

    auto outcome = run([&](bs_ctx*) {
        auto* st = unsafe_stack();
        CHECK(st == s.area().stack);
        CHECK_FALSE(s.arena->contains(st, 1)); // out of every confined store's reach
        CHECK(st->sp == s.area().stack_top);
        st->sp -= 4096; // a frame, as instrumented code makes one
        st->limit = nullptr; // a call stopped half-way leaves it anywhere
    });
    CHECK_FALSE(outcome.has_value());
    outcome = run([&](bs_ctx*) {
        CHECK(unsafe_stack()->sp == s.area().stack_top); // every call starts afresh
        CHECK(unsafe_stack()->limit == s.area().stack_limit);
        s.fn<void()>(bitship::jit::kStackOverflowSymbol)();
    });
    expect_stopped(outcome, Errc::kernel_crashed, "stack overflow");
}

TEST_CASE("sandboxed exports replace every runtime function and every curated one that takes pointers", "[unit]") {
    auto& s = sandbox();
    for (const auto& e : runtime_exports()) {
        INFO(e.name);
        REQUIRE(s.exports.count(e.name) == 1);
        if (e.name == bitship::jit::kForgedCallSymbol) CHECK(s.exports.at(e.name) == e.address);
        else CHECK(s.exports.at(e.name) != e.address);
    }
    std::map<std::string, void*> curated;
    for (const auto& e : bitship::jit::curated_exports()) curated[e.name] = e.address;
    for (const char* name : {"memcpy", "memmove", "memset", "memcmp", "strlen", "strnlen", "strcmp", "strncmp", "strchr",
                             "strrchr", "strstr", "malloc", "calloc", "realloc", "free"}) {
        INFO(name);
        REQUIRE(s.exports.count(name) == 1);
        CHECK(s.exports.at(name) != curated[name]);
    }
    // Pure math is left as it is.
    CHECK(s.exports.count("sqrt") == 0);
}

}  // namespace sandbox_runtime_test_cpp
