#include <bitship/errc.hpp>

#include <fmt/format.h>

namespace bitship {

std::string_view to_string(Errc code) noexcept {
    switch (code) {
    case Errc::ok: return "ok";
    case Errc::invalid_argument: return "invalid_argument";
    case Errc::malformed_message: return "malformed_message";
    case Errc::unsupported_version: return "unsupported_version";
    case Errc::unknown_message: return "unknown_message";
    case Errc::too_large: return "too_large";
    case Errc::malformed_bundle: return "malformed_bundle";
    case Errc::no_matching_slice: return "no_matching_slice";
    case Errc::producer_too_new: return "producer_too_new";
    case Errc::invalid_bitcode: return "invalid_bitcode";
    case Errc::unresolved_symbol: return "unresolved_symbol";
    case Errc::entry_not_found: return "entry_not_found";
    case Errc::compile_failed: return "compile_failed";
    case Errc::kernel_failed: return "kernel_failed";
    case Errc::kernel_crashed: return "kernel_crashed";
    case Errc::kernel_timeout: return "kernel_timeout";
    case Errc::code_missing: return "code_missing";
    case Errc::connect_failed: return "connect_failed";
    case Errc::disconnected: return "disconnected";
    case Errc::timeout: return "timeout";
    case Errc::shutting_down: return "shutting_down";
    case Errc::transport_error: return "transport_error";
    case Errc::io_error: return "io_error";
    case Errc::internal: return "internal";
    case Errc::hop_budget_exceeded: return "hop_budget_exceeded";
    case Errc::region_not_found: return "region_not_found";
    case Errc::out_of_bounds: return "out_of_bounds";
    case Errc::policy_violation: return "policy_violation";
    case Errc::unauthorized: return "unauthorized";
    case Errc::no_device: return "no_device";
    case Errc::busy: return "busy";
    }
    return "unknown_error";
}

std::string Error::describe() const { return fmt::format("{}: {}", to_string(code), message); }

} // namespace bitship
