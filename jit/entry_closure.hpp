#pragma once
// A tier-0 compile for one call: only the kernel the call names and what it reaches, read from
// the bitcode lazily. A bundle of several kernels would otherwise cost its first call the
// parsing, checks and code generation of all of them (for bench/kernels/tiny.c against its
// `empty` alone: code generation 1.1 ms against 0.19 ms; reading and verifying the bitcode,
// in a warm process, 315 µs against 147 µs); the full slice follows at tier 1 in the
// background, or at tier 0 when another of its kernels is called first.
// Private to jit/.

#include <string>
#include <string_view>
#include <vector>

#include <llvm/Support/Error.h>

namespace llvm {
class Module;
}

namespace bitship::jit {

/// Keeps in `module` only the functions and global variables that `entry` reaches through its
/// calls, its address-taken functions and the initialisers of the globals it uses, and returns
/// the `entries` that were defined and are gone. `module` may be loaded lazily
/// (llvm::getLazyBitcodeModule): the functions reached are materialised as they are found, the
/// bodies of the others are never read, and the module is fully loaded on return. It is left
/// whole (and fully loaded) when `entry` is not defined there, or when the module defines a
/// writable global variable: two separately compiled parts would each hold their own copy of
/// it. Errors: those of the bitcode reader, for a function reached whose body is not valid
/// bitcode. What is removed is never checked or compiled; the caller checks what is left (the
/// IR verifier, the code policy, the allow-list).
llvm::Expected<std::vector<std::string>> keep_only_entry(llvm::Module& module, std::string_view entry,
                                                         const std::vector<std::string>& entries);

/// Whether `module` defines a writable global variable (LLVM's own `llvm.*` globals aside):
/// state its kernels keep from one call to the next. Such a slice is compiled once, whole and
/// optimised (compile_to_object.cpp): a second compile, a part or a tier-up, would hold a
/// fresh copy of that state, and the calls it served would lose what earlier calls wrote.
bool holds_state(const llvm::Module& module);

} // namespace bitship::jit
