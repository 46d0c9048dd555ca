#include "sandbox_runtime.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <string_view>

#include <fmt/format.h>

#include "kernel_guard.hpp"
#include "kernel_heap.hpp"
#include "runtime.hpp"
#include "sandbox_arena.hpp"

namespace bitship::agent {
namespace {

// The call running on this thread (SandboxedCall::enter .. leave). One thread_local, read by
// every export: a kernel's ctx is compared with `ctx` and never dereferenced otherwise.
struct CurrentCall {
    bs_ctx* ctx = nullptr;
    ThreadArea* area = nullptr;
    SandboxArena* arena = nullptr;
    std::size_t args_bytes = 0;
    bool args_landed = false; // read where they landed (args_landing.hpp), not in the call buffer
};
thread_local CurrentCall t_call;
thread_local std::size_t t_last_peak = 0;

alignas(16) constexpr char kNoArgs[16] = {};
constexpr std::size_t kMaxFailMessage = 1024; // what runtime.cpp's bs_fail reads at most

// Every message here is made with fmt::format straight into stop_kernel's argument: the frames
// stop_kernel jumps over hold nothing to destroy.
[[noreturn]] void no_call(const char* fn) {
    stop_kernel(Error{Errc::internal, fmt::format("{}: called with no sandboxed call on this thread (the agent did "
                                                  "not enter one)",
                                                  fn)});
}

[[noreturn]] void out_of_arena(const char* fn, const void* p, std::size_t n) {
    stop_kernel(Error{Errc::out_of_bounds, fmt::format("{}: {} + {} bytes reach outside the kernel's sandbox arena", fn,
                                                       p, n)});
}

SandboxArena& arena_of(const char* fn) {
    if (!t_call.arena) no_call(fn);
    return *t_call.arena;
}

// [p, p + n) inside the arena. No bytes touch nothing: any p passes with n == 0 (C code passes
// memcpy(dst, NULL, 0) and the like).
inline void check_range(const char* fn, const void* p, std::size_t n) {
    if (!arena_of(fn).contains(p, n) && n != 0) out_of_arena(fn, p, n);
}

// An out parameter: inside the arena and aligned (the runtime writes it as a T). Null is fine.
template <class T> void check_out(const char* fn, T* p) {
    if (!p) return;
    check_range(fn, p, sizeof(T));
    if (reinterpret_cast<std::uintptr_t>(p) % alignof(T) != 0)
        stop_kernel(Error{Errc::out_of_bounds,
                          fmt::format("{}: the out parameter at {} is not aligned to {} bytes", fn, static_cast<void*>(p),
                                      alignof(T))});
}

// Bytes from `p` to the arena's end (p inside the arena).
inline std::size_t room_after(const void* p) {
    const SandboxArena& a = *t_call.arena;
    return static_cast<std::size_t>(a.base() + a.size() - static_cast<const std::byte*>(p));
}

[[noreturn]] void unterminated(const char* fn, const void* s) {
    stop_kernel(Error{Errc::out_of_bounds, fmt::format("{}: the string at {} runs to the end of the kernel's sandbox "
                                                       "arena without a terminating NUL",
                                                       fn, s)});
}

// strlen, reading only inside the arena: a string that starts outside it or runs to its end
// stops the kernel.
std::size_t arena_strlen(const char* fn, const char* s) {
    check_range(fn, s, 1);
    std::size_t room = room_after(s);
    std::size_t n = ::strnlen(s, room);
    if (n == room) unterminated(fn, s);
    return n;
}

bool is_current(const bs_ctx* ctx) { return ctx && ctx == t_call.ctx; }

// ---- the kernel.h runtime, checked, then handed to runtime.cpp's functions ----------------

const void* checked_bs_args(bs_ctx* ctx, size_t* len) {
    check_out("bs_args", len);
    if (!is_current(ctx)) {
        if (len) *len = 0;
        return t_call.area ? static_cast<const void*>(t_call.area->call_buffer) : kNoArgs;
    }
    const void* args = ::bs_args(ctx, len);
    // No arguments: still a pointer inside the arena (memcpy(&x, args, 0) must pass the checks).
    return t_call.args_bytes ? args : t_call.area->call_buffer;
}

int checked_bs_reply(bs_ctx* ctx, const void* data, size_t len) {
    if (!is_current(ctx)) return BS_EINVAL;
    // A length past the agent's result limit is refused as it is without the sandbox, before
    // any byte is read; within it, the bytes must be the kernel's own.
    if (len > ctx->max_result) return ctx->answered ? BS_EALREADY : BS_ETOOLARGE;
    if (data) check_range("bs_reply", data, len);
    return ::bs_reply(ctx, data, len);
}

int checked_bs_fail(bs_ctx* ctx, int code, const char* message) {
    if (!is_current(ctx)) return BS_EINVAL;
    if (message) {
        // runtime.cpp reads at most kMaxFailMessage bytes of it: either the NUL is in the arena,
        // or that much of the arena follows.
        check_range("bs_fail", message, 1);
        std::size_t room = room_after(message);
        if (room < kMaxFailMessage && ::strnlen(message, room) == room) unterminated("bs_fail", message);
    }
    return ::bs_fail(ctx, code, message);
}

void* checked_bs_region(bs_ctx* ctx, const char* name, size_t* size) {
    check_out("bs_region", size);
    if (!is_current(ctx)) {
        if (size) *size = 0;
        return nullptr;
    }
    if (name) arena_strlen("bs_region", name);
    return ::bs_region(ctx, name, size);
}

void* checked_bs_region_create(bs_ctx* ctx, const char* name, size_t size, size_t* actual) {
    check_out("bs_region_create", actual);
    if (!is_current(ctx)) {
        if (actual) *actual = 0;
        return nullptr;
    }
    if (name) arena_strlen("bs_region_create", name);
    return ::bs_region_create(ctx, name, size, actual);
}

int checked_bs_self(bs_ctx* ctx, uint32_t* count) {
    check_out("bs_self", count);
    if (!is_current(ctx)) {
        if (count) *count = 0;
        return BS_EINVAL;
    }
    return ::bs_self(ctx, count);
}

int checked_bs_forward(bs_ctx* ctx, uint32_t peer, const void* args, size_t len) {
    if (!is_current(ctx)) return BS_EINVAL;
    if (args) check_range("bs_forward", args, len);
    return ::bs_forward(ctx, peer, args, len);
}

int checked_bs_ship(bs_ctx* ctx, uint32_t peer, const char* entry, const void* args, size_t len) {
    if (!is_current(ctx)) return BS_EINVAL;
    if (entry) arena_strlen("bs_ship", entry);
    if (args) check_range("bs_ship", args, len);
    return ::bs_ship(ctx, peer, entry, args, len);
}

// ---- libc: the curated functions that take pointers, checked ------------------------------

// Zero bytes touch no memory, whatever the pointers (null included: libc's own functions may
// not be given null even then).
void* checked_memcpy(void* dst, const void* src, size_t n) {
    if (n == 0) return dst;
    check_range("memcpy", dst, n);
    check_range("memcpy", src, n);
    return std::memcpy(dst, src, n);
}

void* checked_memmove(void* dst, const void* src, size_t n) {
    if (n == 0) return dst;
    check_range("memmove", dst, n);
    check_range("memmove", src, n);
    return std::memmove(dst, src, n);
}

void* checked_memset(void* dst, int c, size_t n) {
    if (n == 0) return dst;
    check_range("memset", dst, n);
    return std::memset(dst, c, n);
}

int checked_memcmp(const void* a, const void* b, size_t n) {
    if (n == 0) return 0;
    check_range("memcmp", a, n);
    check_range("memcmp", b, n);
    return std::memcmp(a, b, n);
}

size_t checked_strlen(const char* s) { return arena_strlen("strlen", s); }

size_t checked_strnlen(const char* s, size_t max) {
    if (max == 0) return 0;
    check_range("strnlen", s, 1);
    std::size_t bound = std::min(max, room_after(s));
    std::size_t n = ::strnlen(s, bound);
    if (n == bound && bound < max) unterminated("strnlen", s);
    return n;
}

// strncmp reading only inside the arena: compares at most `n` bytes, stopping the kernel when
// the comparison would have to read past the arena's end.
int bounded_strncmp(const char* fn, const char* a, const char* b, size_t n) {
    if (n == 0) return 0;
    check_range(fn, a, 1);
    check_range(fn, b, 1);
    std::size_t m = std::min({n, room_after(a), room_after(b)});
    int r = std::strncmp(a, b, m);
    // Equal over m bytes with no NUL among them (equal bytes: a's say for both), and more to
    // compare: the next byte lies outside the arena for one of them.
    if (r == 0 && m < n && std::memchr(a, 0, m) == nullptr) unterminated(fn, room_after(a) == m ? a : b);
    return r;
}

int checked_strcmp(const char* a, const char* b) { return bounded_strncmp("strcmp", a, b, SIZE_MAX); }

int checked_strncmp(const char* a, const char* b, size_t n) { return bounded_strncmp("strncmp", a, b, n); }

char* checked_strchr(const char* s, int c) {
    std::size_t n = arena_strlen("strchr", s);
    return static_cast<char*>(const_cast<void*>(std::memchr(s, c, n + 1))); // n + 1: c may be the NUL
}

char* checked_strrchr(const char* s, int c) {
    std::size_t n = arena_strlen("strrchr", s);
    return static_cast<char*>(const_cast<void*>(static_cast<const void*>(::memrchr(s, c, n + 1))));
}

char* checked_strstr(const char* haystack, const char* needle) {
    std::size_t hn = arena_strlen("strstr", haystack);
    std::size_t nn = arena_strlen("strstr", needle);
    return static_cast<char*>(const_cast<void*>(static_cast<const void*>(::memmem(haystack, hn, needle, nn))));
}

// ---- the kernel heap ---------------------------------------------------------------------

KernelHeap& heap_of(const char* fn) {
    if (!t_call.area) no_call(fn);
    return *t_call.area->heap;
}

std::string quota_text(std::size_t bytes) {
    return bytes % (std::size_t{1} << 20) == 0 ? fmt::format("{} MiB", bytes >> 20) : fmt::format("{} bytes", bytes);
}

[[noreturn]] void over_quota(const char* fn, std::size_t bytes, const KernelHeap& heap) {
    stop_kernel(Error{Errc::too_large,
                      fmt::format("kernel heap: {} of {} bytes would pass the call's quota of {} ({} bytes in use); keep "
                                  "large or lasting data in a region (bs_region_create)",
                                  fn, bytes, quota_text(heap.quota()), heap.in_use())});
}

[[noreturn]] void not_a_block(const char* fn, const void* p) {
    stop_kernel(Error{Errc::out_of_bounds, fmt::format("{}: {} is no block this call allocated", fn, p)});
}

void* checked_malloc(size_t n) {
    KernelHeap& heap = heap_of("malloc");
    if (void* p = heap.allocate(n)) return p;
    over_quota("malloc", n, heap);
}

void* checked_calloc(size_t count, size_t size) {
    KernelHeap& heap = heap_of("calloc");
    std::size_t bytes = 0;
    if (__builtin_mul_overflow(count, size, &bytes))
        stop_kernel(Error{Errc::too_large, fmt::format("kernel heap: calloc of {} × {} bytes overflows", count, size)});
    if (void* p = heap.allocate_zeroed(count, size)) return p;
    over_quota("calloc", bytes, heap);
}

void* checked_realloc(void* p, size_t n) {
    KernelHeap& heap = heap_of("realloc");
    if (p && heap.usable_size(p) == 0) not_a_block("realloc", p);
    if (void* q = heap.reallocate(p, n)) return q;
    if (n == 0 && p) return nullptr; // freed, as C says
    over_quota("realloc", n, heap);
}

void checked_free(void* p) {
    if (!heap_of("free").release(p)) not_a_block("free", p);
}

// ---- what the sfi pass refers to -----------------------------------------------------------

jit::UnsafeStack* unsafe_stack() {
    if (!t_call.area) no_call(jit::kUnsafeStackSymbol);
    return t_call.area->stack;
}

[[noreturn]] void stack_overflow() {
    std::size_t bytes = t_call.area ? static_cast<std::size_t>(t_call.area->stack_top - t_call.area->stack_limit) : 0;
    stop_kernel(Error{Errc::kernel_crashed,
                      fmt::format("stack overflow: the kernel's frames need more than the {} of its unsafe stack "
                                  "(address-taken locals and arrays); deep recursion or large local arrays belong in "
                                  "the heap or a region",
                                  quota_text(bytes))});
}

// A curated libc function that takes pointers but has no checked version here: linking it
// unchecked would let a kernel reach outside the arena through it.
[[noreturn]] void refuse_unchecked() {
    stop_kernel(Error{Errc::policy_violation, "the kernel called a C library function that has no bounds-checked "
                                              "version under --sandbox sfi; it was stopped before the call"});
}

struct Replacement {
    std::string_view name;
    void* address;
};

template <class F> void* fn(F* f) { return reinterpret_cast<void*>(f); }

// The checked version of every runtime_exports() function, by name.
const std::array kCheckedRuntime = {
    Replacement{"bs_args", fn(&checked_bs_args)},
    Replacement{"bs_reply", fn(&checked_bs_reply)},
    Replacement{"bs_fail", fn(&checked_bs_fail)},
    Replacement{"bs_region", fn(&checked_bs_region)},
    Replacement{"bs_region_create", fn(&checked_bs_region_create)},
    Replacement{"bs_self", fn(&checked_bs_self)},
    Replacement{"bs_forward", fn(&checked_bs_forward)},
    Replacement{"bs_ship", fn(&checked_bs_ship)},
};

// The checked version of every curated libc function that reads or writes memory it is given.
const std::array kCheckedLibc = {
    Replacement{"memcpy", fn(&checked_memcpy)},   Replacement{"memmove", fn(&checked_memmove)},
    Replacement{"memset", fn(&checked_memset)},   Replacement{"memcmp", fn(&checked_memcmp)},
    Replacement{"strlen", fn(&checked_strlen)},   Replacement{"strnlen", fn(&checked_strnlen)},
    Replacement{"strcmp", fn(&checked_strcmp)},   Replacement{"strncmp", fn(&checked_strncmp)},
    Replacement{"strchr", fn(&checked_strchr)},   Replacement{"strrchr", fn(&checked_strrchr)},
    Replacement{"strstr", fn(&checked_strstr)},   Replacement{"malloc", fn(&checked_malloc)},
    Replacement{"calloc", fn(&checked_calloc)},   Replacement{"realloc", fn(&checked_realloc)},
    Replacement{"free", fn(&checked_free)},
};

// Curated exports that touch no memory they are given (math, integer helpers, the compiler's
// 128-bit division), so sandboxed code may call them as they are. Any other curated name is
// refused until it has a checked version: a new export is closed by default.
constexpr std::string_view kNoPointerArguments[] = {
    "abs",     "labs",     "llabs",    "sqrt",     "sin",      "cos",      "tan",      "asin",     "acos",
    "atan",    "atan2",    "exp",      "exp2",     "log",      "log2",     "log10",    "pow",      "fabs",
    "floor",   "ceil",     "round",    "trunc",    "fmod",     "fmin",     "fmax",     "fma",      "hypot",
    "cbrt",    "sqrtf",    "sinf",     "cosf",     "tanf",     "asinf",    "acosf",    "atanf",    "atan2f",
    "expf",    "exp2f",    "logf",     "log2f",    "log10f",   "powf",     "fabsf",    "floorf",   "ceilf",
    "roundf",  "truncf",   "fmodf",    "fminf",    "fmaxf",    "fmaf",     "hypotf",   "cbrtf",    "__divti3",
    "__modti3", "__udivti3", "__umodti3", "__stack_chk_fail",
    // Data, not a function (absent on x86-64 glibc): read by stack-protector code.
    "__stack_chk_guard",
    // The JIT's own: replaced by the runtime's stop_forged_call (runtime_exports).
    jit::kForgedCallSymbol};

template <std::size_t N> const Replacement* find(const std::array<Replacement, N>& table, std::string_view name) {
    for (const auto& r : table)
        if (r.name == name) return &r;
    return nullptr;
}

bool needs_no_check(std::string_view name) {
    return std::find(std::begin(kNoPointerArguments), std::end(kNoPointerArguments), name) != std::end(kNoPointerArguments);
}

} // namespace

std::vector<jit::Export> sandboxed_exports(SandboxArena& arena) {
    std::vector<jit::Export> out;
    // 1. The runtime: each function replaced by its checked version. One without is left out (a
    //    kernel naming it gets unresolved_symbol): never exported unchecked.
    for (auto& e : runtime_exports()) {
        if (e.name == jit::kForgedCallSymbol) out.push_back(e);
        else if (const auto* r = find(kCheckedRuntime, e.name)) out.push_back({e.name, r->address});
    }
    // 2. libc: checked, kept as curated (no pointer arguments), or refused.
    for (const auto& r : kCheckedLibc) out.push_back({std::string(r.name), r.address});
    for (auto& e : jit::curated_exports()) {
        bool named = std::any_of(out.begin(), out.end(), [&](const jit::Export& x) { return x.name == e.name; });
        if (!named && !needs_no_check(e.name)) out.push_back({e.name, fn(&refuse_unchecked)});
    }
    // 3. What the sfi pass refers to. The arena's base and mask are absolute symbols: their
    //    addresses are the values (both non-zero).
    out.push_back({jit::kArenaBaseSymbol, static_cast<void*>(arena.base())});
    out.push_back({jit::kArenaMaskSymbol, reinterpret_cast<void*>(static_cast<std::uintptr_t>(arena.mask()))});
    out.push_back({jit::kUnsafeStackSymbol, fn(&unsafe_stack)});
    out.push_back({jit::kStackOverflowSymbol, fn(&stack_overflow)});
    return out;
}

Result<void> SandboxedCall::enter(SandboxArena& arena, bs_ctx& ctx) {
    auto claimed = arena.this_thread();
    if (!claimed) return tl::make_unexpected(claimed.error());
    ThreadArea& area = **claimed;
    const std::size_t n = ctx.args.size();
    if (n > area.call_buffer_bytes)
        return fail(Errc::too_large, fmt::format("the call's {} bytes of arguments exceed the sandbox call buffer of {} "
                                                 "bytes",
                                                 n, area.call_buffer_bytes));
    // Arguments that landed in the arena are read there; their slot is wiped when let go.
    const bool in_place = ctx.args_landed && arena.contains(ctx.args.data(), n);
    if (!in_place) {
        if (n) std::memcpy(area.call_buffer, ctx.args.data(), n);
        ctx.args = std::span<const std::byte>(area.call_buffer, n);
    }
    // The kernel can write these (they are in the arena): set them afresh for every call.
    area.stack->sp = area.stack_top;
    area.stack->limit = area.stack_limit;
    t_call = {&ctx, &area, &arena, n, in_place};
    return {};
}

void SandboxedCall::leave() noexcept {
    CurrentCall call = t_call;
    t_call = {};
    if (!call.area) {
        t_last_peak = 0;
        return;
    }
    // The next call on this thread (another client's, maybe) does not find these arguments.
    // (Landed ones are wiped as their slot is let go.)
    if (call.args_bytes && !call.args_landed) std::memset(call.area->call_buffer, 0, call.args_bytes);
    KernelHeap& heap = *call.area->heap;
    t_last_peak = heap.peak();
    if (heap.touched()) heap.reset();
}

std::size_t last_call_heap_peak() noexcept { return t_last_peak; }

} // namespace bitship::agent
