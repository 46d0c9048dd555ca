#pragma once
// The one place an llvm::Error becomes a bitship::Error (STYLE.md: each foreign error type is
// converted in exactly one place). Private to jit/.

#include <string_view>

#include <llvm/Support/Error.h>

#include <bitship/errc.hpp>

namespace bitship::jit {

/// Consumes `err` (which must hold a failure) and returns it as an Error. A symbol lookup that
/// failed for want of a definition (orc::SymbolsNotFound, anywhere in a joined error) becomes
/// unresolved_symbol naming every missing symbol; anything else becomes `code`. `context`
/// says what was being done ("parsing slice 3fa2...") and leads the message.
Error to_error(llvm::Error err, Errc code, std::string_view context);

} // namespace bitship::jit
