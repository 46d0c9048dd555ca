#pragma once
// The symbols shipped code may link against, and the check that a module asks for no others.
// Private to jit/.

#include <functional>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <bitship/errc.hpp>

#include "jit.hpp"

namespace llvm {
class Module;
}

namespace bitship::jit {

/// curated_exports() plus what the operator exports; nothing else resolves.
class AllowList {
public:
    /// Operator exports win over a curated symbol of the same name (an agent may wrap malloc,
    /// say). An export with an empty name or a null address is invalid_argument.
    static Result<AllowList> make(std::span<const Export> operator_exports);

    [[nodiscard]] bool contains(std::string_view name) const { return symbols_.find(name) != symbols_.end(); }
    /// Name → address, one entry per name.
    [[nodiscard]] const std::map<std::string, void*, std::less<>>& symbols() const { return symbols_; }

    /// Every symbol `module` declares without defining (functions and globals; LLVM intrinsics
    /// aside) must be `allowed`; otherwise unresolved_symbol naming all that are not. Runs
    /// before code generation, so refused code never reaches the backend. Static: a compiler
    /// process knows the allow-list's names, never its addresses.
    [[nodiscard]] static Result<void> check(const llvm::Module& module,
                                            const std::function<bool(std::string_view)>& allowed);

    /// "kernel references 'system', 'fork', which this agent does not export"
    static std::string missing_message(std::span<const std::string> names);

private:
    std::map<std::string, void*, std::less<>> symbols_;
};

} // namespace bitship::jit
