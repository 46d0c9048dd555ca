// The disk cache's object file format (see object_file.hpp). Fields are little-endian, strings
// and the object are length-prefixed; the trailing digest (the code hash function over every
// byte before it) catches a torn or altered file before any of it reaches the linker.
#include "object_file.hpp"

#include <array>
#include <bit>
#include <cstdint>
#include <cstring>
#include <string_view>

#include <fmt/format.h>

#include "jit.hpp"

namespace bitship::jit {
namespace {

// 002: objects carry the run-time indirect-call checks; 003: the key holds the sandbox mode.
// Older ones are refused and remade.
constexpr std::array<char, 8> kMagic{'B', 'S', 'O', 'B', 'J', '0', '0', '3'};
/// No field of a sane file comes near this; a larger length is damage, not data.
constexpr std::uint64_t kMaxFieldBytes = std::uint64_t{1} << 32;

class Writer {
public:
    void bytes(std::span<const std::byte> b) { out_.insert(out_.end(), b.begin(), b.end()); }
    void u64(std::uint64_t v) {
        std::array<std::byte, 8> b{};
        for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<std::byte>(v >> (8 * i));
        bytes(b);
    }
    void text(std::string_view s) {
        u64(s.size());
        bytes(std::as_bytes(std::span(s.data(), s.size())));
    }
    std::vector<std::byte> take() { return std::move(out_); }
    [[nodiscard]] std::span<const std::byte> view() const { return out_; }

private:
    std::vector<std::byte> out_;
};

class Reader {
public:
    explicit Reader(std::span<const std::byte> in) : in_(in) {}
    Result<std::span<const std::byte>> bytes(std::uint64_t n, std::string_view what) {
        if (n > in_.size() - pos_)
            return fail(Errc::malformed_bundle, fmt::format("object file: {} runs past the end", what));
        auto out = in_.subspan(pos_, static_cast<std::size_t>(n));
        pos_ += static_cast<std::size_t>(n);
        return out;
    }
    Result<std::uint64_t> u64(std::string_view what) {
        auto b = bytes(8, what);
        if (!b) return tl::make_unexpected(b.error());
        std::uint64_t v = 0;
        for (std::size_t i = 0; i < 8; ++i) v |= std::uint64_t(std::to_integer<std::uint8_t>((*b)[i])) << (8 * i);
        return v;
    }
    Result<std::uint64_t> length(std::string_view what) {
        auto n = u64(what);
        if (n && *n > kMaxFieldBytes) return fail(Errc::malformed_bundle, fmt::format("object file: {} is too long", what));
        return n;
    }
    Result<std::string> text(std::string_view what) {
        auto n = length(what);
        if (!n) return tl::make_unexpected(n.error());
        auto b = bytes(*n, what);
        if (!b) return tl::make_unexpected(b.error());
        return std::string(reinterpret_cast<const char*>(b->data()), b->size());
    }
    [[nodiscard]] std::size_t pos() const { return pos_; }

private:
    std::span<const std::byte> in_;
    std::size_t pos_ = 0;
};

} // namespace

ObjectKey ObjectKey::of_this_host(unsigned opt_level, Sandbox sandbox) {
    const HostInfo& h = host();
    return {to_string(h.llvm), h.triple, h.cpu, h.features, opt_level, sandbox};
}

std::vector<std::byte> encode_object_file(const ObjectFile& file) {
    Writer w;
    w.bytes(std::as_bytes(std::span(kMagic)));
    w.text(file.key.llvm);
    w.text(file.key.triple);
    w.text(file.key.cpu);
    w.text(file.key.features);
    w.u64(file.key.opt_level);
    w.u64(static_cast<std::uint64_t>(file.key.sandbox));
    w.bytes(std::as_bytes(std::span(file.hash)));
    w.u64(file.entries.size());
    for (const auto& e : file.entries) w.text(e);
    w.u64(file.object.size());
    w.bytes(file.object);
    const CodeHash digest = hash_code(w.view());
    w.bytes(std::as_bytes(std::span(digest)));
    return w.take();
}

Result<ObjectFile> decode_object_file(std::span<const std::byte> bytes) {
    constexpr std::size_t kDigestBytes = std::tuple_size_v<CodeHash>;
    if (bytes.size() < kMagic.size() + kDigestBytes)
        return fail(Errc::malformed_bundle, fmt::format("object file of {} bytes is too short", bytes.size()));
    if (std::memcmp(bytes.data(), kMagic.data(), kMagic.size()) != 0)
        return fail(Errc::malformed_bundle, "object file: bad magic (not a bitship object, or another format version)");
    const auto body = bytes.first(bytes.size() - kDigestBytes);
    const CodeHash digest = hash_code(body);
    if (std::memcmp(digest.data(), bytes.data() + body.size(), kDigestBytes) != 0)
        return fail(Errc::malformed_bundle, "object file: digest mismatch (torn or altered)");

    Reader r(body);
    ObjectFile out;
    if (auto m = r.bytes(kMagic.size(), "magic"); !m) return tl::make_unexpected(m.error());
    for (auto [field, name] : {std::pair{&out.key.llvm, "LLVM version"}, {&out.key.triple, "triple"},
                               {&out.key.cpu, "CPU"}, {&out.key.features, "features"}}) {
        auto t = r.text(name);
        if (!t) return tl::make_unexpected(t.error());
        *field = std::move(*t);
    }
    auto level = r.u64("opt level");
    if (!level) return tl::make_unexpected(level.error());
    out.key.opt_level = static_cast<unsigned>(*level);
    auto sandbox = r.u64("sandbox mode");
    if (!sandbox) return tl::make_unexpected(sandbox.error());
    if (*sandbox > static_cast<std::uint64_t>(Sandbox::sfi))
        return fail(Errc::malformed_bundle, fmt::format("object file: unknown sandbox mode {}", *sandbox));
    out.key.sandbox = static_cast<Sandbox>(*sandbox);
    auto hash = r.bytes(out.hash.size(), "hash");
    if (!hash) return tl::make_unexpected(hash.error());
    std::memcpy(out.hash.data(), hash->data(), out.hash.size());
    auto count = r.length("entry count");
    if (!count) return tl::make_unexpected(count.error());
    for (std::uint64_t i = 0; i < *count; ++i) {
        auto e = r.text("entry name");
        if (!e) return tl::make_unexpected(e.error());
        out.entries.push_back(std::move(*e));
    }
    auto size = r.length("object size");
    if (!size) return tl::make_unexpected(size.error());
    auto object = r.bytes(*size, "object");
    if (!object) return tl::make_unexpected(object.error());
    out.object.assign(object->begin(), object->end());
    if (r.pos() != body.size()) return fail(Errc::malformed_bundle, "object file: trailing bytes before the digest");
    return out;
}

} // namespace bitship::jit
