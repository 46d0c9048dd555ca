#pragma once
// A tier-0 compile for one call: only the kernel the call names and what it reaches. A bundle
// of several kernels costs its first call the code generation of all of them (here 1.1 ms
// for bench/kernels/tiny.c against 0.19 ms for its `empty` alone); the full slice follows at
// tier 1 in the background, or at tier 0 when another of its kernels is called first.
// Private to jit/.

#include <string>
#include <string_view>
#include <vector>

namespace llvm {
class Module;
}

namespace bitship::jit {

/// Removes from `module` every function and global variable that `entry` does not reach
/// through its calls, its address-taken functions and the initialisers of the globals it
/// uses, and returns the `entries` that were defined and are gone. Returns nothing and leaves
/// `module` whole when `entry` is not defined there, or when the module defines a writable
/// global variable: two separately compiled parts would each hold their own copy of it.
/// Runs after the code policy and the allow-list check, which see the whole module.
std::vector<std::string> keep_only_entry(llvm::Module& module, std::string_view entry,
                                         const std::vector<std::string>& entries);

/// Whether `module` defines a writable global variable (LLVM's own `llvm.*` globals aside):
/// state its kernels keep from one call to the next. Such a slice is compiled once, whole and
/// optimised (compile_to_object.cpp): a second compile, a part or a tier-up, would hold a
/// fresh copy of that state, and the calls it served would lose what earlier calls wrote.
bool holds_state(const llvm::Module& module);

} // namespace bitship::jit
