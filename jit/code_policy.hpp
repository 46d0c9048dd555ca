#pragma once
// The code policy: what shipped code may not contain, checked on the verified IR before any
// optimisation or code generation, so a refusal costs no compile and LLVM's back end never sees
// a construct it would abort on. Private to jit/.
//
// The rules, in one table a reader can audit (code_policy.cpp, kRules):
//   no-module-asm        module-level inline assembly
//   no-inline-asm        a call to an inline assembly string
//   no-appending-global  a global with appending linkage (llvm.global_ctors/dtors, ...):
//                        constructors and destructors never run in an agent, and LLVM's code
//                        generator aborts on the ones it does not know
//   no-reserved-name     a global variable or a defined function named llvm.* (llvm.used and
//                        llvm.compiler.used excepted: they only keep symbols alive)
//   no-alias             a global alias
//   no-ifunc             an ifunc (its resolver would run at link time, in the agent)
//   no-thread-local      a thread_local variable (kernels run on whichever worker)
//   no-section           a global or function with an explicit section (data placed among code)
//   no-raw-code          prologue data, prefix data (bytes of the author's choosing at a
//                        function's entry, in executable memory) or a personality function
//   no-indirect-branch   a computed goto (indirectbr jumps to any address it is given)
//   listed-intrinsics-only
//                        a declared llvm.* intrinsic not in kIntrinsicFamilies (computation,
//                        memory the kernel reaches, hints, debug info, vector reductions)
//   no-forged-call       a call through a pointer made from an integer or a constant address,
//                        or from a function's address plus an offset; at compile time where it
//                        can be seen, and at run time for every other indirect call
//                        (call_guard.hpp): only functions the module defines may be reached
//                        indirectly; allow-listed functions are called directly
// Each refusal is Errc::policy_violation and names the symbol (or function) and the rule.

#include <bitship/errc.hpp>

namespace llvm {
class Module;
}

namespace bitship::jit {

/// Checks `module` against every rule; the first violation found, naming the rule.
Result<void> check_code_policy(const llvm::Module& module);

} // namespace bitship::jit
