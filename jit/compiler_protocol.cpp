// The agent ⇄ compiler protocol (see compiler_protocol.hpp): encoding, bounds-checked decoding,
// and frame I/O on a blocking socket.
#include "compiler_protocol.hpp"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "core/byte_io.hpp"
#include "core/frame_io.hpp"
#include "ptx_compile.hpp"

namespace bitship::jit::compiler_protocol {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::size_t kHeaderBytes = sizeof(std::uint32_t);
/// A stage time a compiler reports beyond this (a day, in ms) is nonsense, not a slow compile.
constexpr double kMaxStageMs = 86'400'000.0;
constexpr std::size_t kFatalFrameBytes = 1024;

Error malformed(std::string_view what) {
    return Error{Errc::malformed_message, fmt::format("compiler protocol: {}", what)};
}

ByteWriter start(Type t) {
    ByteWriter w;
    const std::byte type[] = {static_cast<std::byte>(t)};
    w.raw(type);
    return w;
}

/// A reader past the type byte of a payload that has type `want`.
Result<ByteReader> open(std::span<const std::byte> payload, Type want) {
    ByteReader r(payload);
    auto t = r.u8();
    if (!t || *t != static_cast<std::uint8_t>(want)) return tl::make_unexpected(malformed("unexpected message type"));
    return r;
}

Result<void> at_end(const ByteReader& r, std::string_view what) {
    if (r.remaining() != 0) return tl::make_unexpected(malformed(fmt::format("{} has {} trailing bytes", what, r.remaining())));
    return {};
}

void put_f64(ByteWriter& w, double v) { w.scalar(v); }
std::optional<double> get_stage_ms(ByteReader& r) {
    auto v = r.scalar<double>();
    if (!v || !std::isfinite(*v) || *v < 0 || *v > kMaxStageMs) return std::nullopt;
    return v;
}

} // namespace

std::vector<std::byte> encode(const Hello& m) {
    auto w = start(Type::hello);
    w.u32(m.version);
    w.u8(static_cast<std::uint8_t>(m.opt_level));
    w.u8(static_cast<std::uint8_t>(m.sandbox));
    w.u32(static_cast<std::uint32_t>(m.allowed.size()));
    for (const auto& n : m.allowed) w.str16(n);
    w.blob32(m.libdevice);
    return std::move(w).take();
}

std::vector<std::byte> encode(const Ready& m) {
    auto w = start(Type::ready);
    w.u8(m.confined ? 1 : 0);
    w.str16(m.note);
    return std::move(w).take();
}

std::vector<std::byte> encode(const CompileRequest& m) {
    auto w = start(Type::compile);
    w.u64(m.id);
    w.u8(static_cast<std::uint8_t>(m.tier));
    w.u8(static_cast<std::uint8_t>(m.target));
    w.u16(static_cast<std::uint16_t>(m.sm));
    w.str16(m.only);
    w.raw(std::as_bytes(std::span(m.expected)));
    w.blob32(m.bundle);
    return std::move(w).take();
}

std::vector<std::byte> encode(const CompileReply& m) {
    auto w = start(Type::compiled);
    w.u64(m.id);
    const auto& s = m.made.stats;
    for (double v : {s.verify_ms, s.parse_ms, s.optimise_ms, s.codegen_ms}) put_f64(w, v);
    w.u8(static_cast<std::uint8_t>(s.tier));
    w.u32(static_cast<std::uint32_t>(m.made.entries.size()));
    for (const auto& e : m.made.entries) w.str16(e);
    w.u32(static_cast<std::uint32_t>(m.made.left_out.size()));
    for (const auto& e : m.made.left_out) w.str16(e);
    w.blob32(m.made.slice_bundle);
    w.blob32(m.made.object);
    return std::move(w).take();
}

std::vector<std::byte> encode(const PtxReply& m) {
    auto w = start(Type::compiled_ptx);
    w.u64(m.id);
    put_f64(w, m.made.stats.verify_ms);
    put_f64(w, m.made.stats.codegen_ms);
    w.blob32(m.made.slice_bundle);
    w.blob32(std::as_bytes(std::span(m.made.ptx.data(), m.made.ptx.size())));
    return std::move(w).take();
}

std::vector<std::byte> encode(const CompileFailure& m) {
    auto w = start(Type::failed);
    w.u64(m.id);
    w.u32(static_cast<std::uint32_t>(m.error.code));
    w.u8(m.fatal ? 1 : 0);
    w.str16(m.error.message);
    return std::move(w).take();
}

Result<Type> type_of(std::span<const std::byte> payload) {
    if (payload.empty()) return tl::make_unexpected(malformed("empty frame"));
    auto t = static_cast<std::uint8_t>(payload[0]);
    if (t < static_cast<std::uint8_t>(Type::hello) || t > static_cast<std::uint8_t>(Type::compiled_ptx))
        return tl::make_unexpected(malformed(fmt::format("unknown message type {}", t)));
    return static_cast<Type>(t);
}

Result<Hello> decode_hello(std::span<const std::byte> payload) {
    auto r = open(payload, Type::hello);
    if (!r) return tl::make_unexpected(r.error());
    Hello m;
    auto version = r->u32();
    auto level = r->u8();
    auto sandbox = r->u8();
    auto count = r->u32();
    if (!version || !level || !sandbox || !count) return tl::make_unexpected(malformed("truncated HELLO"));
    if (*version != kVersion)
        return fail(Errc::unsupported_version, fmt::format("compiler protocol version {}; this compiler speaks {}", *version, kVersion));
    if (*level > 3) return tl::make_unexpected(malformed(fmt::format("opt level {}", *level)));
    if (*sandbox > static_cast<std::uint8_t>(Sandbox::sfi))
        return tl::make_unexpected(malformed(fmt::format("sandbox mode {}", *sandbox)));
    // Each name takes at least its two length bytes: a count the payload cannot hold is refused
    // before anything is reserved for it.
    if (*count > kMaxNames || *count > r->remaining() / 2) return tl::make_unexpected(malformed("HELLO's name count"));
    m.version = *version;
    m.opt_level = *level;
    m.sandbox = static_cast<Sandbox>(*sandbox);
    m.allowed.reserve(*count);
    for (std::uint32_t i = 0; i < *count; ++i) {
        auto n = r->str16();
        if (!n) return tl::make_unexpected(malformed("truncated name in HELLO"));
        m.allowed.emplace_back(*n);
    }
    auto libdevice = r->blob32();
    if (!libdevice) return tl::make_unexpected(malformed("truncated libdevice in HELLO"));
    if (libdevice->size() > kMaxLibdeviceBytes)
        return tl::make_unexpected(malformed(fmt::format("HELLO's libdevice of {} bytes", libdevice->size())));
    m.libdevice.assign(libdevice->begin(), libdevice->end());
    if (auto end = at_end(*r, "HELLO"); !end) return tl::make_unexpected(end.error());
    return m;
}

Result<Ready> decode_ready(std::span<const std::byte> payload) {
    auto r = open(payload, Type::ready);
    if (!r) return tl::make_unexpected(r.error());
    auto confined = r->u8();
    auto note = r->str16();
    if (!confined || *confined > 1 || !note) return tl::make_unexpected(malformed("truncated READY"));
    if (auto end = at_end(*r, "READY"); !end) return tl::make_unexpected(end.error());
    return Ready{*confined == 1, std::string(*note)};
}

Result<CompileRequest> decode_compile(std::span<const std::byte> payload) {
    auto r = open(payload, Type::compile);
    if (!r) return tl::make_unexpected(r.error());
    CompileRequest m;
    auto id = r->u64();
    auto tier = r->u8();
    auto target = r->u8();
    auto sm = r->u16();
    auto only = r->str16();
    auto hash = r->bytes(m.expected.size());
    auto bundle = r->blob32();
    if (!id || !tier || !target || !sm || !only || !hash || !bundle) return tl::make_unexpected(malformed("truncated COMPILE"));
    if (*tier > static_cast<std::uint8_t>(Tier::optimised)) return tl::make_unexpected(malformed(fmt::format("tier {}", *tier)));
    if (*target > static_cast<std::uint8_t>(Target::ptx))
        return tl::make_unexpected(malformed(fmt::format("COMPILE's target {}", *target)));
    // One encoding per request: an object names no sm; PTX is made whole, at O3, for a GPU
    // architecture LLVM knows.
    if (*target == static_cast<std::uint8_t>(Target::object) && *sm != 0)
        return tl::make_unexpected(malformed(fmt::format("COMPILE's sm {} for object code", *sm)));
    if (*target == static_cast<std::uint8_t>(Target::ptx)) {
        if (*sm < kMinPtxSm || *sm > kMaxPtxSm)
            return tl::make_unexpected(
                malformed(fmt::format("COMPILE's sm {} (PTX is made for sm {}..{})", *sm, kMinPtxSm, kMaxPtxSm)));
        if (*tier != static_cast<std::uint8_t>(Tier::optimised))
            return tl::make_unexpected(malformed(fmt::format("COMPILE's tier {} for PTX (made optimised only)", *tier)));
        if (!only->empty()) return tl::make_unexpected(malformed("COMPILE's only entry for PTX (made whole only)"));
    }
    if (auto end = at_end(*r, "COMPILE"); !end) return tl::make_unexpected(end.error());
    m.id = *id;
    m.tier = static_cast<Tier>(*tier);
    m.target = static_cast<Target>(*target);
    m.sm = *sm;
    m.only = *only;
    std::memcpy(m.expected.data(), hash->data(), m.expected.size());
    m.bundle = *bundle;
    return m;
}

Result<CompileReply> decode_compiled(std::span<const std::byte> payload) {
    auto r = open(payload, Type::compiled);
    if (!r) return tl::make_unexpected(r.error());
    CompileReply m;
    auto id = r->u64();
    if (!id) return tl::make_unexpected(malformed("truncated COMPILED"));
    m.id = *id;
    auto& s = m.made.stats;
    for (double* stage : {&s.verify_ms, &s.parse_ms, &s.optimise_ms, &s.codegen_ms}) {
        auto v = get_stage_ms(*r);
        if (!v) return tl::make_unexpected(malformed("COMPILED's stage times"));
        *stage = *v;
    }
    auto tier = r->u8();
    if (!tier || *tier > static_cast<std::uint8_t>(Tier::optimised)) return tl::make_unexpected(malformed("COMPILED's tier"));
    s.tier = *tier;
    auto count = r->u32();
    if (!count || *count > kMaxEntries || *count > r->remaining() / 2)
        return tl::make_unexpected(malformed("COMPILED's entry count"));
    m.made.entries.reserve(*count);
    for (std::uint32_t i = 0; i < *count; ++i) {
        auto e = r->str16();
        if (!e || e->empty()) return tl::make_unexpected(malformed("an entry name in COMPILED"));
        m.made.entries.emplace_back(*e);
    }
    auto left_out = r->u32();
    if (!left_out || *left_out > kMaxEntries || *left_out > r->remaining() / 2)
        return tl::make_unexpected(malformed("COMPILED's left-out entry count"));
    for (std::uint32_t i = 0; i < *left_out; ++i) {
        auto e = r->str16();
        if (!e || e->empty()) return tl::make_unexpected(malformed("a left-out entry name in COMPILED"));
        m.made.left_out.emplace_back(*e);
    }
    auto slice = r->blob32();
    auto object = r->blob32();
    if (!slice || !object) return tl::make_unexpected(malformed("truncated COMPILED"));
    if (object->empty()) return tl::make_unexpected(malformed("COMPILED with no object code"));
    if (auto end = at_end(*r, "COMPILED"); !end) return tl::make_unexpected(end.error());
    m.made.slice_bundle.assign(slice->begin(), slice->end());
    m.made.object.assign(object->begin(), object->end());
    return m;
}

Result<PtxReply> decode_compiled_ptx(std::span<const std::byte> payload) {
    auto r = open(payload, Type::compiled_ptx);
    if (!r) return tl::make_unexpected(r.error());
    PtxReply m;
    auto id = r->u64();
    if (!id) return tl::make_unexpected(malformed("truncated PTX_COMPILED"));
    m.id = *id;
    for (double* stage : {&m.made.stats.verify_ms, &m.made.stats.codegen_ms}) {
        auto v = get_stage_ms(*r);
        if (!v) return tl::make_unexpected(malformed("PTX_COMPILED's stage times"));
        *stage = *v;
    }
    m.made.stats.tier = static_cast<unsigned>(Tier::optimised);
    auto slice = r->blob32();
    auto ptx = r->blob32();
    if (!slice || !ptx) return tl::make_unexpected(malformed("truncated PTX_COMPILED"));
    if (ptx->empty()) return tl::make_unexpected(malformed("PTX_COMPILED with no PTX"));
    if (std::find(ptx->begin(), ptx->end(), std::byte{0}) != ptx->end())
        return tl::make_unexpected(malformed("PTX_COMPILED's PTX holds a NUL byte"));
    if (auto end = at_end(*r, "PTX_COMPILED"); !end) return tl::make_unexpected(end.error());
    m.made.slice_bundle.assign(slice->begin(), slice->end());
    m.made.ptx.assign(reinterpret_cast<const char*>(ptx->data()), ptx->size());
    return m;
}

Result<CompileFailure> decode_failed(std::span<const std::byte> payload) {
    auto r = open(payload, Type::failed);
    if (!r) return tl::make_unexpected(r.error());
    auto id = r->u64();
    auto code = r->u32();
    auto fatal = r->u8();
    auto message = r->str16();
    if (!id || !code || !fatal || *fatal > 1 || !message) return tl::make_unexpected(malformed("truncated FAILED"));
    if (auto end = at_end(*r, "FAILED"); !end) return tl::make_unexpected(end.error());
    // A code this build does not know, or "ok" for a failure, is the compiler's confusion.
    auto errc = *code == 0 || *code > static_cast<std::uint32_t>(kLastErrc) ? Errc::compile_failed : static_cast<Errc>(*code);
    return CompileFailure{*id, Error{errc, std::string(*message)}, *fatal == 1};
}

Result<void> write_frame(int fd, std::span<const std::byte> payload) {
    return bitship::write_frame(fd, payload, "compiler");
}

Result<std::vector<std::byte>> read_frame(int fd, std::uint32_t max, std::optional<Clock::time_point> deadline) {
    return bitship::read_frame(fd, max, "compiler", deadline);
}

void write_fatal_frame(int fd, std::uint64_t id, Errc code, std::string_view message) noexcept {
    // The layout of encode(CompileFailure), by hand into a fixed buffer: no allocation.
    std::byte buf[kFatalFrameBytes];
    const std::size_t fixed = kHeaderBytes + 1 + 8 + 4 + 1 + 2;
    const std::size_t text = std::min(message.size(), sizeof buf - fixed);
    std::size_t at = 0;
    auto put = [&](const void* p, std::size_t n) {
        std::memcpy(buf + at, p, n);
        at += n;
    };
    const auto frame = static_cast<std::uint32_t>(fixed - kHeaderBytes + text);
    const auto type = static_cast<std::uint8_t>(Type::failed);
    const auto errc = static_cast<std::uint32_t>(code);
    const std::uint8_t fatal = 1;
    const auto len = static_cast<std::uint16_t>(text);
    put(&frame, sizeof frame);
    put(&type, sizeof type);
    put(&id, sizeof id);
    put(&errc, sizeof errc);
    put(&fatal, sizeof fatal);
    put(&len, sizeof len);
    put(message.data(), text);
    std::size_t done = 0;
    while (done < at) {
        ssize_t w = ::write(fd, buf + done, at - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return;
        done += static_cast<std::size_t>(w);
    }
}

} // namespace bitship::jit::compiler_protocol
