// curated_exports(): the libc/libm/compiler-runtime subset every agent lets kernels call.
// Only pure computation and heap memory: nothing that reaches files, processes, the network or
// the dynamic loader (no system, exec*, fork, dlopen, open, mmap, ...).
#include "jit.hpp"

#include <dlfcn.h>

#include <array>
#include <string_view>

// Compiler helpers the code generator may call for 128-bit arithmetic. They live in libgcc
// (static), which dlsym cannot always see, so their addresses are taken directly.
extern "C" {
__int128 __divti3(__int128, __int128);
__int128 __modti3(__int128, __int128);
unsigned __int128 __udivti3(unsigned __int128, unsigned __int128);
unsigned __int128 __umodti3(unsigned __int128, unsigned __int128);
void __stack_chk_fail(void);
}

namespace bitship::jit {
namespace {

/// Resolved with dlsym; a name the C library lacks is skipped rather than failing the agent.
constexpr std::array kLibcNames = {
    // <string.h>
    "memcpy", "memmove", "memset", "memcmp", "strlen", "strnlen", "strcmp", "strncmp", "strchr",
    "strrchr", "strstr",
    // <stdlib.h>: heap memory and integer helpers
    "malloc", "calloc", "realloc", "free", "abs", "labs", "llabs",
    // <math.h>, double
    "sqrt", "sin", "cos", "tan", "asin", "acos", "atan", "atan2", "exp", "exp2", "log", "log2",
    "log10", "pow", "fabs", "floor", "ceil", "round", "trunc", "fmod", "fmin", "fmax", "fma",
    "hypot", "cbrt",
    // <math.h>, float
    "sqrtf", "sinf", "cosf", "tanf", "asinf", "acosf", "atanf", "atan2f", "expf", "exp2f", "logf",
    "log2f", "log10f", "powf", "fabsf", "floorf", "ceilf", "roundf", "truncf", "fmodf", "fminf",
    "fmaxf", "fmaf", "hypotf", "cbrtf",
    // Stack-protector canary, where the ABI keeps it in a global rather than in TLS
    // (x86_64 glibc uses %fs:0x28, so this is usually absent and skipped).
    "__stack_chk_guard",
};

/// Where no agent says otherwise, a forged indirect call ends in an illegal instruction: the
/// kernel stops, the call is never made.
[[noreturn]] void trap_forged_call() { __builtin_trap(); }

} // namespace

std::vector<Export> curated_exports() {
    std::vector<Export> out;
    out.reserve(kLibcNames.size() + 6);
    for (const char* name : kLibcNames)
        if (void* address = ::dlsym(RTLD_DEFAULT, name)) out.push_back({name, address});
    out.push_back({"__divti3", reinterpret_cast<void*>(&__divti3)});
    out.push_back({"__modti3", reinterpret_cast<void*>(&__modti3)});
    out.push_back({"__udivti3", reinterpret_cast<void*>(&__udivti3)});
    out.push_back({"__umodti3", reinterpret_cast<void*>(&__umodti3)});
    out.push_back({"__stack_chk_fail", reinterpret_cast<void*>(&__stack_chk_fail)});
    out.push_back({kForgedCallSymbol, reinterpret_cast<void*>(&trap_forged_call)});
    return out;
}

} // namespace bitship::jit
