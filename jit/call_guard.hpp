#pragma once
// The run-time half of policy rule no-forged-call (code_policy.hpp): every indirect call in
// shipped code is checked, before it is made, against the functions the module itself defines
// and takes the address of. A call to anything else (an address made from an integer, an
// exported function's address plus an offset, a return address read off the stack) stops the
// kernel through kForgedCallSymbol instead of jumping. What the policy can prove at compile
// time it refuses there; this covers what it cannot, as LLVM's control-flow integrity does.
// Private to jit/.

#include <bitship/errc.hpp>

namespace llvm {
class Module;
}

namespace bitship::jit {

/// Puts a check in front of every indirect call in `module`. Runs after the code policy and
/// the allow-list check, before optimisation (which folds the checks it can prove). Returns how
/// many call sites it guarded.
unsigned guard_indirect_calls(llvm::Module& module);

} // namespace bitship::jit
