#include "llvm_error.hpp"

#include <string>
#include <vector>

#include <llvm/ExecutionEngine/Orc/Core.h>

#include "allow_list.hpp"

namespace bitship::jit {

Error to_error(llvm::Error err, Errc code, std::string_view context) {
    std::vector<std::string> missing;
    std::string messages;
    llvm::handleAllErrors(
        std::move(err),
        [&](const llvm::orc::SymbolsNotFound& e) {
            for (const auto& name : e.getSymbols()) missing.push_back((*name).str());
        },
        [&](const llvm::ErrorInfoBase& e) {
            messages += (messages.empty() ? "" : "; ") + e.message();
        });
    if (!missing.empty()) return Error{Errc::unresolved_symbol, AllowList::missing_message(missing)};
    return Error{code, std::string(context) + ": " + messages};
}

} // namespace bitship::jit
