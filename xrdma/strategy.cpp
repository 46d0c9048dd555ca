#include "strategy.hpp"

#include <fmt/format.h>

namespace bitship::xrdma {

std::string_view to_string(Strategy s) noexcept {
    switch (s) {
    case Strategy::get: return "get";
    case Strategy::native: return "native";
    case Strategy::xrdma: return "xrdma";
    case Strategy::reship: return "reship";
    }
    return "?";
}

Result<Strategy> parse_strategy(std::string_view name) {
    if (name == "get") return Strategy::get;
    if (name == "native") return Strategy::native;
    if (name == "xrdma") return Strategy::xrdma;
    if (name == "reship") return Strategy::reship;
    return fail(Errc::invalid_argument, fmt::format("unknown strategy '{}' (get, native, xrdma or reship)", name));
}

} // namespace bitship::xrdma
