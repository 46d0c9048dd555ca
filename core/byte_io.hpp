#pragma once
// Bounds-checked little-endian reading and writing, shared by the wire protocol and the bundle
// container. Every read returns nullopt instead of touching a byte past the end.

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "spare_bytes.hpp"

namespace bitship {

static_assert(std::endian::native == std::endian::little, "bitship's wire format assumes little-endian hosts");

class ByteReader {
public:
    explicit ByteReader(std::span<const std::byte> bytes) noexcept : bytes_(bytes) {}

    std::optional<std::span<const std::byte>> bytes(std::size_t n) noexcept {
        if (n > remaining()) return std::nullopt;
        auto out = bytes_.subspan(pos_, n);
        pos_ += n;
        return out;
    }
    template <class T> std::optional<T> scalar() noexcept {
        auto b = bytes(sizeof(T));
        if (!b) return std::nullopt;
        T v;
        std::memcpy(&v, b->data(), sizeof(T));
        return v;
    }
    std::optional<std::uint8_t> u8() noexcept { return scalar<std::uint8_t>(); }
    std::optional<std::uint16_t> u16() noexcept { return scalar<std::uint16_t>(); }
    std::optional<std::uint32_t> u32() noexcept { return scalar<std::uint32_t>(); }
    std::optional<std::uint64_t> u64() noexcept { return scalar<std::uint64_t>(); }
    /// A string prefixed by a u16 length. On failure nothing is consumed, so the reads that
    /// follow cannot succeed from the middle of a field.
    std::optional<std::string_view> str16() noexcept {
        auto start = pos_;
        auto n = u16();
        auto b = n ? bytes(*n) : std::nullopt;
        if (!b) {
            pos_ = start;
            return std::nullopt;
        }
        return std::string_view(reinterpret_cast<const char*>(b->data()), b->size());
    }
    /// A byte block prefixed by a u32 length; on failure nothing is consumed.
    std::optional<std::span<const std::byte>> blob32() noexcept {
        auto start = pos_;
        auto n = u32();
        auto b = n ? bytes(*n) : std::nullopt;
        if (!b) pos_ = start;
        return b;
    }
    [[nodiscard]] std::size_t remaining() const noexcept { return bytes_.size() - pos_; }
    [[nodiscard]] std::size_t position() const noexcept { return pos_; }
    /// Skips the padding up to the next multiple of `n` from the start; false if it runs out.
    bool align(std::size_t n) noexcept {
        auto pad = (n - pos_ % n) % n;
        if (pad > remaining()) return false;
        pos_ += pad;
        return true;
    }

private:
    std::span<const std::byte> bytes_;
    std::size_t pos_ = 0;
};

class ByteWriter {
public:
    /// Room for `n` more bytes at once: a message with a large field is then copied once,
    /// not again by each growth after it. Up to kSlackMax, the room is made ready to write
    /// (zeroed), so that each field after it is one bounds check and one copy; a larger
    /// reservation is capacity only, so its bytes are written once, not zeroed first.
    void reserve(std::size_t n) {
        if (size_ + n <= buf_.size()) return;
        if (buf_.capacity() == 0) buf_ = SpareBytes::take(); // the thread's last message's buffer
        if (n <= kSlackMax) {
            buf_.resize(size_ + n); // (the room there already is zeroed: only the rest is filled)
            return;
        }
        buf_.resize(size_); // no room made ready behind what is written: writes append
        buf_.reserve(size_ + n);
    }
    [[gnu::always_inline]] void raw(std::span<const std::byte> b) {
        if (size_ + b.size() > buf_.size()) return append(b.data(), b.size());
        if (!b.empty()) std::memcpy(buf_.data() + size_, b.data(), b.size());
        size_ += b.size();
    }
    template <class T> [[gnu::always_inline]] void scalar(T v) {
        // A fixed-size copy: one store when it fits (the common case, after reserve()).
        if (size_ + sizeof(T) > buf_.size()) [[unlikely]] return append(&v, sizeof(T));
        std::memcpy(buf_.data() + size_, &v, sizeof(T));
        size_ += sizeof(T);
    }
    void u8(std::uint8_t v) { scalar(v); }
    void u16(std::uint16_t v) { scalar(v); }
    void u32(std::uint32_t v) { scalar(v); }
    void u64(std::uint64_t v) { scalar(v); }
    /// Strings longer than 65535 bytes are a caller bug; they are cut, never overflow.
    void str16(std::string_view s) {
        auto n = s.size() > 0xffff ? 0xffff : s.size();
        u16(static_cast<std::uint16_t>(n));
        raw(std::as_bytes(std::span(s.data(), n)));
    }
    void blob32(std::span<const std::byte> b) {
        u32(static_cast<std::uint32_t>(b.size()));
        raw(b);
    }
    /// Zero padding up to the next multiple of `n` from the start.
    void align(std::size_t n) {
        const auto pad = (n - size_ % n) % n;
        if (pad == 0) return;
        if (size_ + pad > buf_.size()) buf_.resize(size_ + pad);
        else std::memset(buf_.data() + size_, 0, pad); // (the room is zeroed already: cheap to be sure)
        size_ += pad;
    }
    void patch_u64(std::size_t at, std::uint64_t v) { std::memcpy(buf_.data() + at, &v, sizeof v); }
    [[nodiscard]] std::size_t size() const noexcept { return size_; }
    std::vector<std::byte> take() && {
        buf_.resize(size_);
        size_ = 0;
        return std::move(buf_);
    }

    /// The most reserve() makes ready to write ahead (zeroing it costs less than per-field growth).
    static constexpr std::size_t kSlackMax = std::size_t{4} << 10;

private:
    // Past the room made ready: appends to what is written (the vector grows geometrically,
    // into capacity a large reserve() made).
    [[gnu::noinline]] void append(const void* p, std::size_t n) {
        buf_.resize(size_);
        auto b = static_cast<const std::byte*>(p);
        buf_.insert(buf_.end(), b, b + n);
        size_ = buf_.size();
    }

    std::vector<std::byte> buf_; ///< [0, size_) written; [size_, buf_.size()) zeroed room
    std::size_t size_ = 0;
};

} // namespace bitship
