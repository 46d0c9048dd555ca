// RUN: a call, its code when the agent lacks it, where it may travel next, and (flags) its bulk
// window, GPU launch or group of calls. Part of the wire codec (wire.hpp).
#include "wire_codec.hpp"

namespace bitship::wire {
using namespace codec;

namespace {

// The arguments of a RUN, at the reader's position, `size` bytes: in the payload, or where a
// split message's data landed (which must be exactly there).
Result<std::span<const std::byte>> read_args(ByteReader& in, std::uint32_t size, const OutsideArgs* outside) {
    std::optional<std::span<const std::byte>> args;
    if (outside == nullptr) {
        args = in.bytes(size);
    } else if (in.position() == outside->at && size == outside->bytes.size()) {
        args = outside->bytes;
    } else {
        return fail(Errc::malformed_message,
                    fmt::format("RUN message declares {} bytes of arguments at byte {}, but its sender split {} bytes off "
                                "at byte {}",
                                size, in.position(), outside->bytes.size(), outside->at));
    }
    if (!args) return codec::truncated(Type::run, "args");
    return *args;
}

// A RUN in its compact form (kFlagCompact): hash, args size, entry, padding, args; the rest as
// a direct call has it.
Result<void> decode_compact_run(const Header& header, ByteReader& in, Run& r, const OutsideArgs* outside) {
    const auto t = Type::run;
    if (header.flags != kFlagCompact)
        return fail(Errc::malformed_message, fmt::format("a compact RUN message has other flags too ({:#06x})", header.flags));
    auto hash = in.bytes(32);
    if (!hash) return codec::truncated(t, "hash");
    auto args_size = in.u32();
    if (!args_size) return codec::truncated(t, "args");
    auto entry = in.str16();
    if (!entry) return codec::truncated(t, "entry");
    if (entry->empty()) return fail(Errc::malformed_message, "RUN message names no entry point");
    if (!in.align(kArgsAlignment)) return codec::truncated(t, "args");
    auto args = read_args(in, *args_size, outside);
    if (!args) return tl::make_unexpected(args.error());
    if (in.remaining() != 0) return codec::trailing(t, in.remaining());
    std::memcpy(r.hash.data(), hash->data(), 32);
    r.origin = header.request_id;
    r.entry = *entry;
    r.args = *args;
    return {};
}

} // namespace

Result<void> codec::decode_run(const Header& header, ByteReader& in, Run& r, const OutsideArgs* outside) {
    const auto t = Type::run;
    if (header.flags & kFlagCompact) return decode_compact_run(header, in, r, outside);
    if (header.flags & ~(kFlagWindow | kFlagGpu | kFlagEach))
        return fail(Errc::malformed_message, fmt::format("RUN message has unknown flags {:#06x}", header.flags));
    if ((header.flags & kFlagEach) && (header.flags & (kFlagWindow | kFlagGpu)))
        return fail(Errc::malformed_message, "a RUN for a group of calls uses no bulk window and runs on no GPU");
    if (header.flags & kFlagWindow) {
        auto args_offset = in.u64(), args_size = in.u64(), result_offset = in.u64(), result_capacity = in.u64();
        if (!args_offset || !args_size || !result_offset || !result_capacity) return truncated(t, "window");
        r.window = WindowUse{*args_offset, *args_size, *result_offset, *result_capacity};
    }
    if (header.flags & kFlagGpu) {
        GpuLaunch g;
        for (auto* field : {&g.grid[0], &g.grid[1], &g.grid[2], &g.block[0], &g.block[1], &g.block[2],
                            &g.result_bytes, &g.device}) {
            auto v = in.u32();
            if (!v) return truncated(t, "gpu launch");
            *field = *v;
        }
        r.gpu = g;
    }
    if (header.flags & kFlagEach) {
        auto count = in.u32(), size = in.u32();
        if (!count || !size) return truncated(t, "group");
        if (*count == 0 || *count > kMaxEachCalls)
            return fail(Errc::malformed_message,
                        fmt::format("RUN message is a group of {} calls (1 to {} allowed)", *count, kMaxEachCalls));
        r.each = Each{*count, *size};
    }
    auto hash = in.bytes(32);
    if (!hash) return truncated(t, "hash");
    std::memcpy(r.hash.data(), hash->data(), 32);
    auto origin = in.u64();
    auto budget = in.u16();
    auto hops = in.u16();
    auto self = in.u16();
    if (!origin || !budget || !hops || !self) return truncated(t, "hops");
    auto entry = in.str16();
    if (!entry) return truncated(t, "entry");
    auto args_size = in.u32();
    if (!args_size || !in.align(kArgsAlignment)) return truncated(t, "args");
    auto args = read_args(in, *args_size, outside);
    if (!args) return tl::make_unexpected(args.error());
    auto code = in.blob32();
    if (!code) return truncated(t, "code");
    auto reply_to = in.blob32();
    if (!reply_to) return truncated(t, "reply_to");
    auto peer_count = in.u16();
    if (!peer_count) return truncated(t, "peers");
    // Each peer takes at least its 2-byte length: refuse counts the payload cannot hold.
    if (*peer_count > in.remaining() / 2) return truncated(t, "peers");
    r.peers.reserve(*peer_count);
    for (std::uint16_t i = 0; i < *peer_count; ++i) {
        auto peer = in.str16();
        if (!peer) return truncated(t, "peers");
        r.peers.push_back(*peer);
    }
    if (in.remaining() != 0) { // signatures of the attached code (absent: none)
        auto n = in.u16();
        if (!n || *n > in.remaining() / kCodeSignatureBytes) return truncated(t, "signatures");
        r.signatures.resize(*n);
        for (auto& sig : r.signatures)
            if (!read_hash(in, sig.hash) || !read_array(in, sig.signer) || !read_array(in, sig.signature))
                return truncated(t, "signatures");
    }
    if (entry->empty()) return fail(Errc::malformed_message, "RUN message names no entry point");
    if (r.window && r.window->args_size != 0 && !args->empty())
        return fail(Errc::malformed_message, "RUN message carries arguments both in the message and in its window");
    if (r.each) {
        if (!r.peers.empty() || !reply_to->empty() || *hops != 0)
            return fail(Errc::malformed_message, "a RUN for a group of calls carries peers, a reply-to or hops: its calls cannot forward");
        if (std::uint64_t{r.each->count} * each_stride(r.each->size) != args->size())
            return fail(Errc::malformed_message,
                        fmt::format("RUN message is a group of {} calls of {} bytes of arguments, which take {} bytes, not {}",
                                    r.each->count, r.each->size,
                                    std::uint64_t{r.each->count} * each_stride(r.each->size), args->size()));
    }
    if (!r.peers.empty() && *self >= r.peers.size())
        return fail(Errc::malformed_message,
                    fmt::format("RUN message says this agent is peer {} of {}", *self, r.peers.size()));
    r.origin = *origin;
    r.hop_budget = *budget;
    r.hops = *hops;
    r.self_index = *self;
    r.entry = *entry;
    r.args = *args;
    r.code = *code;
    r.reply_to = *reply_to;
    return {};
}

namespace {

// A RUN's payload; the arguments are written there, or (borrowing) left out and their place
// returned, for encode_run_borrowing_args.
std::size_t write_run(ByteWriter& w, const Run& r, bool borrowing) {
    if (r.window) {
        w.u64(r.window->args_offset);
        w.u64(r.window->args_size);
        w.u64(r.window->result_offset);
        w.u64(r.window->result_capacity);
    }
    if (r.gpu)
        for (auto v : {r.gpu->grid[0], r.gpu->grid[1], r.gpu->grid[2], r.gpu->block[0], r.gpu->block[1], r.gpu->block[2],
                       r.gpu->result_bytes, r.gpu->device})
            w.u32(v);
    if (r.each) {
        w.u32(r.each->count);
        w.u32(r.each->size);
    }
    std::size_t peers = 0;
    for (auto p : r.peers) peers += 2 + p.size();
    w.reserve(sizeof r.hash + 8 + 3 * 2 + 2 + r.entry.size() + 4 + kArgsAlignment + (borrowing ? 0 : r.args.size()) + 4 +
              r.code.size() + 4 + r.reply_to.size() + 2 + peers + 2 + r.signatures.size() * sizeof(CodeSignature));
    w.raw(std::as_bytes(std::span(r.hash)));
    w.u64(r.origin);
    w.u16(r.hop_budget);
    w.u16(r.hops);
    w.u16(r.self_index);
    w.str16(r.entry);
    w.u32(static_cast<std::uint32_t>(r.args.size()));
    w.align(kArgsAlignment);
    const std::size_t args_at = w.size();
    if (!borrowing) w.raw(r.args);
    w.blob32(r.code);
    w.blob32(r.reply_to);
    w.u16(static_cast<std::uint16_t>(r.peers.size()));
    for (auto p : r.peers) w.str16(p);
    if (!r.signatures.empty()) {
        // More than 65535 slices is not a bundle (bundles hold at most 64): the list is cut.
        const auto n = std::min<std::size_t>(r.signatures.size(), 0xffff);
        w.u16(static_cast<std::uint16_t>(n));
        for (std::size_t i = 0; i < n; ++i) {
            write_array(w, r.signatures[i].hash);
            write_array(w, r.signatures[i].signer);
            write_array(w, r.signatures[i].signature);
        }
    }
    return args_at;
}

void set_flags(Encoded& e, const Run& r) {
    if (r.window) e.header.flags |= kFlagWindow;
    if (r.gpu) e.header.flags |= kFlagGpu;
    if (r.each) e.header.flags |= kFlagEach;
}

// Whether `r`, sent as request `id`, is a direct call the compact form carries whole.
bool fits_compact(std::uint64_t id, const Run& r) {
    return r.origin == id && r.hop_budget == 0 && r.hops == 0 && r.self_index == 0 && r.code.empty() &&
           r.reply_to.empty() && r.peers.empty() && r.signatures.empty() && !r.window && !r.gpu && !r.each &&
           !r.entry.empty() && r.entry.size() <= 0xffff;
}

Encoded encode_compact_run(std::uint64_t id, const Run& r) {
    ByteWriter w;
    w.reserve(sizeof r.hash + 4 + 2 + r.entry.size() + kArgsAlignment + r.args.size());
    w.raw(std::as_bytes(std::span(r.hash)));
    w.u32(static_cast<std::uint32_t>(r.args.size()));
    w.str16(r.entry);
    w.align(kArgsAlignment);
    w.raw(r.args);
    auto e = finish(start(Type::run, id), std::move(w));
    e.header.flags = kFlagCompact;
    return e;
}

} // namespace

Encoded encode_run(std::uint64_t id, const Run& r, bool compact) {
    if (compact && fits_compact(id, r)) return encode_compact_run(id, r);
    ByteWriter w;
    write_run(w, r, false);
    auto e = finish(start(Type::run, id), std::move(w));
    set_flags(e, r);
    return e;
}

Encoded encode_run_borrowing_args(std::uint64_t id, const Run& r, std::shared_ptr<const void> keep) {
    if (r.args.empty()) return encode_run(id, r);
    ByteWriter w;
    const auto args_at = write_run(w, r, true);
    auto e = finish(start(Type::run, id), std::move(w));
    set_flags(e, r);
    e.split_at = args_at;
    e.borrowed = r.args;
    e.keep = std::move(keep);
    e.header.payload_size = static_cast<std::uint32_t>(e.payload.size() + r.args.size());
    return e;
}

} // namespace bitship::wire
