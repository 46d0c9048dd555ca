#include <bitship/bundle.hpp>

#include <cstring>

#include <fmt/format.h>
#include <sodium.h>

#include "byte_io.hpp"

namespace bitship {
namespace {

constexpr std::array<char, 8> kMagic = {'B', 'S', 'B', 'U', 'N', 'D', 'L', '\0'};
constexpr std::size_t kFixedHeaderSize = 8 + 4 + 4 + 4 + 8;
// Generous ceilings that keep a hostile header from asking for absurd allocations.
constexpr std::uint32_t kMaxEntries = 1u << 16;
constexpr std::uint32_t kMaxSlices = 64;

} // namespace

CodeHash hash_code(std::span<const std::byte> bytes) {
    CodeHash out{};
    crypto_generichash(out.data(), out.size(), reinterpret_cast<const unsigned char*>(bytes.data()),
                       bytes.size(), nullptr, 0);
    return out;
}

std::string to_hex(const CodeHash& hash, std::size_t digits) {
    std::string s;
    s.reserve(64);
    for (auto b : hash) s += fmt::format("{:02x}", b);
    if (digits < s.size()) s.resize(digits);
    return s;
}

std::string to_string(const LlvmVersion& v) { return fmt::format("{}.{}.{}", v.major, v.minor, v.patch); }

std::string normalise_triple(std::string_view triple) {
    std::vector<std::string_view> parts;
    std::size_t start = 0;
    while (start <= triple.size()) {
        auto dash = triple.find('-', start);
        if (dash == std::string_view::npos) dash = triple.size();
        parts.push_back(triple.substr(start, dash - start));
        start = dash + 1;
    }
    std::string arch(parts.empty() ? std::string_view{} : parts[0]);
    if (arch == "amd64") arch = "x86_64";
    if (arch == "arm64") arch = "aarch64";
    // arch-vendor-os[-env] or arch-os (no vendor, as in "x86_64-linux-gnu").
    std::string_view os;
    static constexpr std::string_view kKnownOs[] = {"linux", "darwin", "windows", "cuda", "freebsd",
                                                    "macosx", "none", "unknown"};
    for (std::size_t i = 1; i < parts.size(); ++i) {
        for (auto known : kKnownOs) {
            if (parts[i].starts_with(known) && parts[i] != "unknown") {
                os = parts[i];
                break;
            }
        }
        if (!os.empty()) break;
    }
    if (os.empty()) os = parts.size() >= 3 ? parts[2] : (parts.size() == 2 ? parts[1] : "unknown");
    // "linux" and "linux-gnu" are the same OS; strip version suffixes such as "macosx14.0".
    std::string os_name;
    for (char c : os) {
        if ((c >= '0' && c <= '9') || c == '.') break;
        os_name += c;
    }
    if (os_name == "macosx") os_name = "darwin";
    return arch + "-" + os_name;
}

Result<BundleView> BundleView::parse(std::span<const std::byte> bytes) {
    ByteReader in(bytes);
    auto bad = [](std::string what) { return fail(Errc::malformed_bundle, "bundle: " + what); };
    if (bytes.size() < kFixedHeaderSize) return bad(fmt::format("{} bytes is shorter than a header", bytes.size()));
    auto magic = in.bytes(kMagic.size());
    if (!magic || std::memcmp(magic->data(), kMagic.data(), kMagic.size()) != 0)
        return bad("missing 'BSBUNDL' magic (not a bitship bundle)");
    auto version = in.u32();
    if (*version != kBundleFormatVersion)
        return fail(Errc::unsupported_version,
                    fmt::format("bundle: format version {} (this build reads {})", *version, kBundleFormatVersion));
    auto entry_count = *in.u32();
    auto slice_count = *in.u32();
    auto total = *in.u64();
    if (total != bytes.size())
        return bad(fmt::format("header says {} bytes, buffer has {} (truncated or padded)", total, bytes.size()));
    if (entry_count > kMaxEntries) return bad(fmt::format("{} entries is over the limit of {}", entry_count, kMaxEntries));
    if (slice_count == 0 || slice_count > kMaxSlices)
        return bad(fmt::format("{} slices (must be 1..{})", slice_count, kMaxSlices));

    BundleView view;
    view.entries.reserve(entry_count);
    for (std::uint32_t i = 0; i < entry_count; ++i) {
        auto name = in.str16();
        if (!name) return bad(fmt::format("entry {} runs past the end", i));
        if (name->empty()) return bad(fmt::format("entry {} has an empty name", i));
        view.entries.emplace_back(*name);
    }
    for (std::uint32_t i = 0; i < slice_count; ++i) {
        SliceView s;
        auto triple = in.str16();
        auto cpu = in.str16();
        auto producer = in.str16();
        auto major = in.u16();
        auto minor = in.u16();
        auto patch = in.u16();
        auto hash = in.bytes(32);
        auto offset = in.u64();
        auto size = in.u64();
        // Every field, not just the last: a failed string read consumes its length but not its
        // body, so later reads can succeed from the wrong place.
        if (!triple || !cpu || !producer || !major || !minor || !patch || !hash || !offset || !size)
            return bad(fmt::format("slice {} header runs past the end", i));
        s.triple = *triple;
        s.cpu = *cpu;
        s.producer = *producer;
        s.llvm = {*major, *minor, *patch};
        std::memcpy(s.hash.data(), hash->data(), 32);
        if (*offset > bytes.size() || *size > bytes.size() - *offset)
            return bad(fmt::format("slice {} ({}) at offset {} size {} lies outside the {}-byte bundle", i,
                                   s.triple, *offset, *size, bytes.size()));
        s.bitcode = bytes.subspan(*offset, *size);
        if (hash_code(s.bitcode) != s.hash)
            return bad(fmt::format("slice {} ({}) does not match its hash {}", i, s.triple, to_hex(s.hash, 16)));
        view.slices.push_back(std::move(s));
    }
    return view;
}

std::optional<std::size_t> BundleView::find_slice(std::string_view host_triple) const {
    auto want = normalise_triple(host_triple);
    for (std::size_t i = 0; i < slices.size(); ++i)
        if (normalise_triple(slices[i].triple) == want) return i;
    return std::nullopt;
}

std::string BundleView::triples() const {
    std::string out;
    for (const auto& s : slices) out += (out.empty() ? "" : ", ") + s.triple;
    return out;
}

bool BundleView::has_entry(std::string_view name) const {
    for (const auto& e : entries)
        if (e == name) return true;
    return false;
}

std::vector<std::byte> write_bundle(std::span<const std::string> entries, std::span<const SliceInput> slices) {
    ByteWriter out;
    out.raw(std::as_bytes(std::span(kMagic)));
    out.u32(kBundleFormatVersion);
    out.u32(static_cast<std::uint32_t>(entries.size()));
    out.u32(static_cast<std::uint32_t>(slices.size()));
    auto total_at = out.size();
    out.u64(0);
    for (const auto& e : entries) out.str16(e);
    std::vector<std::size_t> offset_at;
    for (const auto& s : slices) {
        out.str16(s.triple);
        out.str16(s.cpu);
        out.str16(s.producer);
        out.u16(s.llvm.major);
        out.u16(s.llvm.minor);
        out.u16(s.llvm.patch);
        auto h = hash_code(s.bitcode);
        out.raw(std::as_bytes(std::span(h)));
        offset_at.push_back(out.size());
        out.u64(0);
        out.u64(s.bitcode.size());
    }
    for (std::size_t i = 0; i < slices.size(); ++i) {
        out.patch_u64(offset_at[i], out.size());
        out.raw(slices[i].bitcode);
    }
    out.patch_u64(total_at, out.size());
    return std::move(out).take();
}

std::vector<std::byte> extract_slice(const BundleView& bundle, std::size_t index) {
    const auto& s = bundle.slices.at(index);
    SliceInput one{s.triple, s.cpu, s.producer, s.llvm, s.bitcode};
    return write_bundle(bundle.entries, std::span(&one, 1));
}

} // namespace bitship
