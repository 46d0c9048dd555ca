#include "allow_list.hpp"

#include <llvm/IR/Function.h>
#include <llvm/IR/GlobalVariable.h>
#include <llvm/IR/Module.h>

namespace bitship::jit {

Result<AllowList> AllowList::make(std::span<const Export> operator_exports) {
    AllowList list;
    for (auto& e : curated_exports()) list.symbols_[e.name] = e.address;
    for (const auto& e : operator_exports) {
        if (e.name.empty()) return fail(Errc::invalid_argument, "an export has an empty name");
        if (e.address == nullptr)
            return fail(Errc::invalid_argument, "export '" + e.name + "' has a null address");
        list.symbols_[e.name] = e.address;
    }
    return list;
}

Result<void> AllowList::check(const llvm::Module& module, const std::function<bool(std::string_view)>& allowed) {
    std::vector<std::string> missing;
    auto need = [&](const llvm::GlobalValue& g) {
        if (!allowed(std::string_view(g.getName()))) missing.push_back(g.getName().str());
    };
    for (const auto& f : module.functions())
        if (f.isDeclaration() && !f.isIntrinsic()) need(f);
    for (const auto& g : module.globals())
        if (g.isDeclaration()) need(g);
    // Aliases and ifuncs always name something in the module: they add no external reference.
    if (!missing.empty()) return fail(Errc::unresolved_symbol, missing_message(missing));
    return {};
}

std::string AllowList::missing_message(std::span<const std::string> names) {
    std::string list;
    for (const auto& n : names) list += (list.empty() ? "'" : ", '") + n + "'";
    return "kernel references " + list + ", which this agent does not export";
}

} // namespace bitship::jit
