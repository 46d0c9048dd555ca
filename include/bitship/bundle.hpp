#pragma once
/// @file
/// The bundle container: one LLVM bitcode slice per target architecture, each with its triple,
/// CPU baseline, producer LLVM version and content hash. Reading it needs no LLVM.
///
/// Layout (all integers little-endian):
/// @code
///   "BSBUNDL\0"  u32 format_version  u32 entry_count  u32 slice_count  u64 total_size
///   entry_count × { u16 len, name bytes }                       kernel entry points
///   slice_count × { u16 len, triple; u16 len, cpu; u16 len, producer;
///                   u16 llvm_major, u16 llvm_minor, u16 llvm_patch;
///                   u8 hash[32]; u64 offset; u64 size }        offset from bundle start
///   slice bytes
/// @endcode

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <bitship/errc.hpp>

namespace bitship {

/// Content hash of a slice: BLAKE2b-256 of its bytes. Code identity everywhere in bitship.
using CodeHash = std::array<std::uint8_t, 32>;

/// BLAKE2b-256 of `bytes` (libsodium).
CodeHash hash_code(std::span<const std::byte> bytes);

/// Lower-case hex of a hash, or of its first `digits` hex digits.
std::string to_hex(const CodeHash& hash, std::size_t digits = 64);

/// How many hex digits of a code hash errors, logs and metrics print: enough to tell hashes apart.
inline constexpr std::size_t kHashDigitsInMessages = 16;

/// An LLVM version as major.minor.patch.
struct LlvmVersion {
    std::uint16_t major = 0, minor = 0, patch = 0;
    friend auto operator<=>(const LlvmVersion&, const LlvmVersion&) = default;
};

/// `"19.1.7"`
std::string to_string(const LlvmVersion& v);

/// The part of a target triple that decides whether code runs: architecture and OS, vendor and
/// environment ignored (`"x86_64-pc-linux-gnu"` and `"x86_64-unknown-linux"` both give
/// `"x86_64-linux"`; `amd64` is `x86_64`, `arm64` is `aarch64`).
std::string normalise_triple(std::string_view triple);

/// The triple of a bundle's GPU slice (bitship_add_kernels ARCHS nvptx64).
inline constexpr std::string_view kGpuTriple = "nvptx64-nvidia-cuda";

/// One slice as read from a bundle; `bitcode` points into the bundle's buffer.
struct SliceView {
    std::string triple;
    std::string cpu;
    std::string producer;
    LlvmVersion llvm;
    CodeHash hash{};
    std::span<const std::byte> bitcode;
};

/// A parsed bundle; spans point into the buffer given to parse(), which must outlive it.
struct BundleView {
    std::vector<std::string> entries;
    std::vector<SliceView> slices;

    /// Checks every length, offset and hash; never reads outside `bytes`.
    static Result<BundleView> parse(std::span<const std::byte> bytes);

    /// Index of the slice whose normalised triple matches `host_triple`'s, if any.
    [[nodiscard]] std::optional<std::size_t> find_slice(std::string_view host_triple) const;

    /// `"x86_64-pc-linux-gnu, aarch64-unknown-linux-gnu"`: for error messages.
    [[nodiscard]] std::string triples() const;

    [[nodiscard]] bool has_entry(std::string_view name) const;
};

/// What to put into one slice of a new bundle.
struct SliceInput {
    std::string triple;
    std::string cpu;
    std::string producer;
    LlvmVersion llvm;
    std::span<const std::byte> bitcode;
};

/// The current bundle format version; parse() refuses others.
inline constexpr std::uint32_t kBundleFormatVersion = 1;

/// Builds a bundle; hashes are computed here.
std::vector<std::byte> write_bundle(std::span<const std::string> entries,
                                    std::span<const SliceInput> slices);

/// A bundle holding only slice `index` of `bundle` (what a client sends to one agent).
std::vector<std::byte> extract_slice(const BundleView& bundle, std::size_t index);

} // namespace bitship
