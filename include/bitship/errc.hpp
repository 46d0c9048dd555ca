#pragma once
/// @file
/// The one error vocabulary of bitship: an `Errc` code plus the message that explains it.
/// `ucs_status_t` and `llvm::Error` are converted to it in exactly one place each.

#include <cstdint>
#include <string>
#include <string_view>

#include <tl/expected.hpp>

namespace bitship {

/// What went wrong. The numeric values travel on the wire in ERROR replies: never renumber.
enum class Errc : std::uint32_t {
    ok = 0,
    invalid_argument = 1,     ///< the caller passed something unusable
    malformed_message = 2,    ///< a wire message failed a length, offset or magic check
    unsupported_version = 3,  ///< a wire or bundle version this build does not speak
    unknown_message = 4,      ///< a wire message type this build does not know
    too_large = 5,            ///< a message, argument block or result over the negotiated limit
    malformed_bundle = 6,     ///< a bundle failed its structure or hash checks
    no_matching_slice = 7,    ///< no slice of the bundle is for the agent's architecture
    producer_too_new = 8,     ///< the slice was made by a newer LLVM than the agent's
    invalid_bitcode = 9,      ///< LLVM could not read or verify the slice
    unresolved_symbol = 10,   ///< the kernel references a symbol the agent does not export
    entry_not_found = 11,     ///< the bundle has no kernel of that name
    compile_failed = 12,      ///< optimisation or code generation failed
    kernel_failed = 13,       ///< the kernel called bs_fail
    kernel_crashed = 14,      ///< the kernel faulted (SIGSEGV, SIGBUS, SIGFPE, SIGILL)
    kernel_timeout = 15,      ///< the kernel overran the agent's time budget and was stopped
    code_missing = 16,        ///< the agent lacks the code for a hash (NEED_CODE, internal)
    connect_failed = 17,      ///< no agent answered at that address in time
    disconnected = 18,        ///< the agent went away with this call in flight
    timeout = 19,             ///< the call did not complete within its deadline
    shutting_down = 20,       ///< the client or agent is stopping
    transport_error = 21,     ///< UCX reported an error
    io_error = 22,            ///< a file could not be read or written
    internal = 23,            ///< a bug: please report it
    hop_budget_exceeded = 24, ///< a forwarding kernel ran out of hops
    region_not_found = 25,    ///< no memory region of that name on the agent
    out_of_bounds = 26,       ///< an address or range outside every region
    policy_violation = 27,    ///< the kernel's code breaks the agent's code policy (asm, ctors, ...)
    unauthorized = 28,        ///< the agent does not know the client's key, or the code's author
    no_device = 29,           ///< a device (a GPU, its driver) the call or the agent needs is not there
    busy = 30,                ///< the agent holds as many of this connection's messages as it allows: retry later
};

/// The highest code this build knows; newer codes from a peer decode as Errc::internal.
inline constexpr Errc kLastErrc = Errc::busy;

/// The stable, lower-case name of a code (`"unresolved_symbol"`).
std::string_view to_string(Errc code) noexcept;

/// A code and the message that says what was wrong, naming the thing that was.
struct Error {
    Errc code = Errc::internal;
    std::string message;

    /// `"unresolved_symbol: kernel references 'system', ..."`
    [[nodiscard]] std::string describe() const;
};

/// Every fallible call returns one of these.
template <class T> using Result = tl::expected<T, Error>;

/// Shorthand for `tl::make_unexpected(Error{code, message})`.
inline tl::unexpected<Error> fail(Errc code, std::string message) {
    return tl::make_unexpected(Error{code, std::move(message)});
}

} // namespace bitship
