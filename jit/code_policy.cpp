#include "code_policy.hpp"

#include <llvm/IR/Function.h>
#include <llvm/IR/GlobalAlias.h>
#include <llvm/IR/GlobalIFunc.h>
#include <llvm/IR/GlobalVariable.h>
#include <llvm/IR/InlineAsm.h>
#include <llvm/IR/InstrTypes.h>
#include <llvm/IR/Module.h>

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
        if (g.getName() == "llvm.used" || g.getName() == "llvm.compiler.used") continue;
        if (g.hasAppendingLinkage()) return tl::make_unexpected(refuse(kAppending, name_of(g)));
        if (g.getName().starts_with("llvm.")) return tl::make_unexpected(refuse(kReserved, name_of(g)));
        if (g.isThreadLocal()) return tl::make_unexpected(refuse(kThreadLocal, name_of(g)));
    }
    for (const auto& a : module.aliases()) return tl::make_unexpected(refuse(kAlias, name_of(a)));
    for (const auto& i : module.ifuncs()) return tl::make_unexpected(refuse(kIfunc, name_of(i)));
    for (const auto& f : module.functions()) {
        if (!f.isDeclaration() && f.getName().starts_with("llvm."))
            return tl::make_unexpected(refuse(kReserved, name_of(f)));
        if (f.isThreadLocal()) return tl::make_unexpected(refuse(kThreadLocal, name_of(f)));
        for (const auto& block : f)
            for (const auto& inst : block)
                if (const auto* call = llvm::dyn_cast<llvm::CallBase>(&inst); call && call->isInlineAsm())
                    return tl::make_unexpected(refuse(kInlineAsm, fmt::format("function '{}'", f.getName().str())));
    }
    return {};
}

} // namespace bitship::jit
