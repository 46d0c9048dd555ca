#pragma once
// A tiny kernel.h runtime for the JIT's tests and timing program: a real bs_ctx that holds the
// argument bytes and collects the reply, and helpers that read kernel bitcode and build bundles.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <bitship/bundle.hpp>
#include <bitship/kernel.h>

#include "jit.hpp"

/// The call a test kernel runs for.
struct bs_ctx {
    std::span<const std::byte> args;
    std::optional<std::vector<std::byte>> reply; ///< set by bs_reply
    std::optional<int> fail_code;                ///< set by bs_fail
    std::string fail_message;
    [[nodiscard]] bool answered() const { return reply.has_value() || fail_code.has_value(); }
};

namespace bitship::jit_test {

/// bs_args, bs_reply and bs_fail, as exports for JitOptions.
std::vector<jit::Export> runtime_exports();

/// Runs `entry` on `args`; returns the context with what the kernel answered.
bs_ctx call(bs_entry_fn entry, std::span<const std::byte> args);

/// A u64 reply, or nullopt when the reply is not 8 bytes.
std::optional<std::uint64_t> reply_u64(const bs_ctx& ctx);

/// The bytes of `<kernel dir>/<name>.bc` (built by test/jit/CMakeLists.txt); throws if absent.
std::vector<std::byte> kernel_bitcode(const std::string& name);

/// A bundle and the hash a caller asks for.
struct Bundle {
    std::vector<std::byte> bytes;
    CodeHash hash; ///< of the (first) slice
};

/// A one-slice bundle for `bitcode`, made as this host (triple, LLVM version) unless told.
Bundle make_bundle(std::span<const std::byte> bitcode, std::vector<std::string> entries,
                   std::string triple = jit::host().triple, LlvmVersion llvm = jit::host().llvm);

} // namespace bitship::jit_test
