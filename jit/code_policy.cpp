#include "code_policy.hpp"

#include <llvm/IR/Function.h>
#include <llvm/IR/GlobalAlias.h>
#include <llvm/IR/GlobalIFunc.h>
#include <llvm/IR/GlobalVariable.h>
#include <llvm/IR/InlineAsm.h>
#include <llvm/IR/InstrTypes.h>
#include <llvm/IR/Instructions.h>
#include <llvm/IR/Module.h>

#include <llvm/IR/Constants.h>
#include <llvm/IR/Operator.h>

#include <array>
#include <string_view>

#include <fmt/format.h>

namespace bitship::jit {
namespace {

struct Rule {
    const char* name;
    const char* says;
};

// The whole policy. Keep code_policy.hpp's table in step.
constexpr Rule kModuleAsm{"no-module-asm", "module-level inline assembly is not allowed"};
constexpr Rule kInlineAsm{"no-inline-asm", "inline assembly is not allowed"};
constexpr Rule kAppending{"no-appending-global", "globals with appending linkage (constructors, destructors) are not allowed"};
constexpr Rule kReserved{"no-reserved-name", "names beginning with 'llvm.' are reserved"};
constexpr Rule kAlias{"no-alias", "global aliases are not allowed"};
constexpr Rule kIfunc{"no-ifunc", "ifuncs are not allowed"};
constexpr Rule kThreadLocal{"no-thread-local", "thread-local variables are not allowed"};
constexpr Rule kForgedCall{"no-forged-call",
                           "calls through a pointer made from an integer or from a function's address plus an offset "
                           "are not allowed; indirect calls may only reach functions the kernel defines"};
constexpr Rule kIndirectBranch{"no-indirect-branch", "computed gotos (indirectbr) are not allowed"};
constexpr Rule kRawCode{"no-raw-code",
                        "prologue data, prefix data and personality functions are not allowed (they place bytes the "
                        "kernel chose in executable memory, or code the unwinder would run)"};
constexpr Rule kSection{"no-section", "explicit sections are not allowed (data placed among code)"};
constexpr Rule kIntrinsic{"listed-intrinsics-only", "this LLVM intrinsic is not on the agent's list"};

// The LLVM intrinsics shipped code may use: plain computation and memory the kernel already
// reaches. A name is allowed when it is "llvm.<family>" or "llvm.<family>.<overload suffix>".
// Everything else (llvm.x86.*, frame and return addresses, register reads and writes, stack
// and exception machinery beyond stacksave, cache clearing, profiling) is refused.
constexpr std::string_view kIntrinsicFamilies[] = {
    // memory
    "memcpy", "memcpy.inline", "memmove", "memset", "memset.inline", "lifetime.start", "lifetime.end",
    "invariant.start", "invariant.end", "launder.invariant.group", "strip.invariant.group", "prefetch",
    "masked.load", "masked.store", "masked.gather", "masked.scatter", "masked.expandload",
    "masked.compressstore", "stacksave", "stackrestore", "objectsize", "ptrmask",
    // hints and debug information
    "assume", "expect", "expect.with.probability", "is.constant", "dbg.declare", "dbg.value", "dbg.label",
    "dbg.assign", "experimental.noalias.scope.decl", "var.annotation", "ptr.annotation", "annotation",
    // integer arithmetic
    "abs", "smax", "smin", "umax", "umin", "ctpop", "ctlz", "cttz", "bswap", "bitreverse", "fshl", "fshr",
    "sadd.with.overflow", "uadd.with.overflow", "ssub.with.overflow", "usub.with.overflow",
    "smul.with.overflow", "umul.with.overflow", "sadd.sat", "uadd.sat", "ssub.sat", "usub.sat",
    // floating point
    "sqrt", "fabs", "fma", "fmuladd", "minnum", "maxnum", "minimum", "maximum", "copysign", "floor",
    "ceil", "trunc", "round", "roundeven", "rint", "nearbyint", "powi", "is.fpclass",
    // reductions (the vectoriser's), and the trap of a failed check
    "vector.reduce", "trap",
};

// Math functions LLVM models as intrinsics too; they lower to the same libm calls a kernel may
// make directly.
constexpr std::string_view kMathIntrinsicFamilies[] = {
    "sin", "cos", "tan", "exp", "exp2", "exp10", "log", "log2", "log10", "pow", "lround", "llround", "lrint",
};

bool listed_intrinsic(std::string_view name) {
    if (!name.starts_with("llvm.")) return false;
    name.remove_prefix(5);
    auto in = [&](const auto& families) {
        for (std::string_view family : families)
            if (name == family || (name.starts_with(family) && name.size() > family.size() && name[family.size()] == '.'))
                return true;
        return false;
    };
    return in(kIntrinsicFamilies) || in(kMathIntrinsicFamilies);
}

/// Where a call's target provably comes from something other than a function: an integer, or
/// a function's address moved by an offset. Empty when it cannot be told at compile time (the
/// run-time check of call_guard.cpp covers that).
std::string forged_callee(const llvm::CallBase& call) {
    const llvm::Value* callee = call.getCalledOperand()->stripPointerCasts();
    if (llvm::isa<llvm::Function>(callee) || call.isInlineAsm()) return {};
    if (const auto* op = llvm::dyn_cast<llvm::Operator>(callee)) {
        if (op->getOpcode() == llvm::Instruction::IntToPtr) return "a pointer made from an integer";
        if (const auto* gep = llvm::dyn_cast<llvm::GEPOperator>(op))
            if (const auto* base = llvm::dyn_cast<llvm::Function>(gep->getPointerOperand()->stripPointerCasts()))
                return fmt::format("the address of '{}' plus an offset", base->getName().str());
    }
    if (llvm::isa<llvm::ConstantInt>(callee) || llvm::isa<llvm::ConstantPointerNull>(callee))
        return "a constant address";
    return {};
}

Error refuse(const Rule& rule, std::string_view where) {
    return Error{Errc::policy_violation, fmt::format("kernel code policy, rule {}: {}: {}", rule.name, where, rule.says)};
}

std::string name_of(const llvm::GlobalValue& g) { return g.hasName() ? "'" + g.getName().str() + "'" : "an unnamed global"; }

} // namespace

Result<void> check_code_policy(const llvm::Module& module) {
    if (!module.getModuleInlineAsm().empty()) return tl::make_unexpected(refuse(kModuleAsm, "the module"));
    for (const auto& g : module.globals()) {
        // llvm.used and llvm.compiler.used only keep symbols alive (clang emits them for
        // kernels marked used); every other special global is refused.
        // Only as clang makes them: in section llvm.metadata (LLVM's code generator aborts on
        // an llvm.compiler.used placed anywhere else: "unknown special variable").
        if ((g.getName() == "llvm.used" || g.getName() == "llvm.compiler.used") && g.hasAppendingLinkage() &&
            g.getSection() == "llvm.metadata")
            continue;
        if (g.hasAppendingLinkage()) return tl::make_unexpected(refuse(kAppending, name_of(g)));
        if (g.getName().starts_with("llvm.")) return tl::make_unexpected(refuse(kReserved, name_of(g)));
        if (g.isThreadLocal()) return tl::make_unexpected(refuse(kThreadLocal, name_of(g)));
        if (g.hasSection()) return tl::make_unexpected(refuse(kSection, name_of(g)));
    }
    for (const auto& a : module.aliases()) return tl::make_unexpected(refuse(kAlias, name_of(a)));
    for (const auto& i : module.ifuncs()) return tl::make_unexpected(refuse(kIfunc, name_of(i)));
    for (const auto& f : module.functions()) {
        if (!f.isDeclaration() && f.getName().starts_with("llvm."))
            return tl::make_unexpected(refuse(kReserved, name_of(f)));
        if (f.isDeclaration() && f.getName().starts_with("llvm.") && !listed_intrinsic(f.getName()))
            return tl::make_unexpected(refuse(kIntrinsic, name_of(f)));
        if (f.isThreadLocal()) return tl::make_unexpected(refuse(kThreadLocal, name_of(f)));
        if (f.hasSection()) return tl::make_unexpected(refuse(kSection, name_of(f)));
        if (f.hasPrologueData() || f.hasPrefixData() || f.hasPersonalityFn())
            return tl::make_unexpected(refuse(kRawCode, name_of(f)));
        for (const auto& block : f)
            for (const auto& inst : block) {
                if (llvm::isa<llvm::IndirectBrInst>(inst))
                    return tl::make_unexpected(refuse(kIndirectBranch, fmt::format("function '{}'", f.getName().str())));
                const auto* call = llvm::dyn_cast<llvm::CallBase>(&inst);
                if (call == nullptr) continue;
                if (call->isInlineAsm())
                    return tl::make_unexpected(refuse(kInlineAsm, fmt::format("function '{}'", f.getName().str())));
                if (auto forged = forged_callee(*call); !forged.empty())
                    return tl::make_unexpected(
                        refuse(kForgedCall, fmt::format("function '{}' calls through {}", f.getName().str(), forged)));
            }
    }
    return {};
}

} // namespace bitship::jit
