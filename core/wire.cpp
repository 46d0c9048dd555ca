// The wire codec: the header, and each message type decoded (decode) and encoded. RUN is
// wire_run.cpp, the operator's control replies wire_control.cpp, a group's answers wire_each.cpp;
// what they share, wire_codec.hpp.
#include "wire.hpp"

#include <cstring>
#include <optional>

#include <fmt/format.h>

#include "byte_io.hpp"
#include "wire_codec.hpp"

namespace bitship::wire {
using namespace codec;

namespace {

constexpr std::size_t kMaxMessageText = 64 * 1024;

// WELCOME's session fields, after the capabilities in their block; absent: an older, open agent.
Result<bool> read_session(std::span<const std::byte> rest, Welcome& w) {
    if (rest.empty()) return true;
    ByteReader in(rest);
    auto access = in.u8();
    if (!access || !read_array(in, w.challenge))
        return fail(Errc::malformed_message, "WELCOME message: the session fields run past the end of their block");
    if (*access > static_cast<std::uint8_t>(AgentAccess::insecure))
        return fail(Errc::malformed_message, fmt::format("WELCOME message: access mode {} is none of open (0), keys (1), "
                                                         "insecure (2)", *access));
    w.access = static_cast<AgentAccess>(*access);
    if (in.remaining() == 0) return true; // an agent from before the sandbox field
    auto sandbox = in.u8();
    if (!sandbox) return fail(Errc::malformed_message, "WELCOME message: the sandbox field runs past the end of its block");
    if (*sandbox > static_cast<std::uint8_t>(SandboxMode::sfi))
        return fail(Errc::malformed_message,
                    fmt::format("WELCOME message: sandbox mode {} is none of none (0), sfi (1)", *sandbox));
    w.sandbox = static_cast<SandboxMode>(*sandbox);
    if (in.remaining() == 0) return true; // an agent from before the GPU details
    if (auto gpus = decode_gpu_details(rest.subspan(rest.size() - in.remaining()), w.caps); !gpus)
        return tl::make_unexpected(gpus.error());
    return true;
}

} // namespace

std::string_view to_string(Type t) noexcept {
    switch (t) {
    case Type::hello: return "HELLO";
    case Type::welcome: return "WELCOME";
    case Type::run: return "RUN";
    case Type::need_code: return "NEED_CODE";
    case Type::result: return "RESULT";
    case Type::error: return "ERROR";
    case Type::ping: return "PING";
    case Type::pong: return "PONG";
    case Type::stats: return "STATS";
    case Type::stats_reply: return "STATS_REPLY";
    case Type::region: return "REGION";
    case Type::region_info: return "REGION_INFO";
    case Type::info: return "INFO";
    case Type::info_reply: return "INFO_REPLY";
    case Type::kernel_stats: return "KERNEL_STATS";
    case Type::kernel_stats_reply: return "KERNEL_STATS_REPLY";
    case Type::cache_list: return "CACHE_LIST";
    case Type::cache_list_reply: return "CACHE_LIST_REPLY";
    case Type::cache_evict: return "CACHE_EVICT";
    case Type::ack: return "ACK";
    case Type::drain: return "DRAIN";
    case Type::auth: return "AUTH";
    case Type::window: return "WINDOW";
    case Type::batch: return "BATCH";
    case Type::gpu_read: return "GPU_READ";
    case Type::gpu_write: return "GPU_WRITE";
    }
    return "UNKNOWN";
}

Result<Header> decode_header(std::span<const std::byte> bytes, std::size_t payload_size) {
    if (bytes.size() != sizeof(Header))
        return fail(Errc::malformed_message, fmt::format("header is {} bytes, expected {}", bytes.size(), sizeof(Header)));
    Header h;
    std::memcpy(&h, bytes.data(), sizeof h);
    if (h.magic != kMagic) return fail(Errc::malformed_message, fmt::format("bad magic {:#010x} (not a bitship message)", h.magic));
    if (h.version != kVersion)
        return fail(Errc::unsupported_version, fmt::format("wire version {} (this build speaks {})", h.version, kVersion));
    if (h.payload_size != payload_size)
        return fail(Errc::malformed_message, fmt::format("{} header declares {} payload bytes but {} arrived (truncated or padded)",
                                                         to_string(h.type), h.payload_size, payload_size));
    return h;
}

Result<Message> decode(const Header& header, std::span<const std::byte> payload) {
    ByteReader in(payload);
    Message m{header, Empty{}};
    const auto t = header.type;
    switch (t) {
    case Type::hello: {
        auto client = in.str16();
        if (!client) return truncated(t, "client");
        m.body = Hello{*client};
        break;
    }
    case Type::welcome: {
        Welcome w;
        auto agent = in.str16(), triple = in.str16(), cpu = in.str16();
        auto major = in.u16(), minor = in.u16(), patch = in.u16();
        auto max_message = in.u64();
        auto max_args = in.u32(), max_result = in.u32(), cores = in.u32(), workers = in.u32();
        auto instance = in.u64();
        if (!agent || !triple || !cpu || !major || !minor || !patch || !max_message || !max_args || !max_result ||
            !cores || !workers || !instance)
            return truncated(t, "fields");
        auto caps_block = in.blob32();
        if (!caps_block) return truncated(t, "capabilities");
        std::size_t caps_used = 0;
        auto caps = decode_capabilities(*caps_block, &caps_used);
        if (!caps) return tl::make_unexpected(caps.error());
        w.caps = std::move(*caps);
        if (auto session = read_session(caps_block->subspan(caps_used), w); !session)
            return tl::make_unexpected(session.error());
        w.agent = *agent;
        w.triple = *triple;
        w.cpu = *cpu;
        w.llvm = {*major, *minor, *patch};
        w.limits = {*max_message, *max_args, *max_result};
        w.cores = *cores;
        w.workers = *workers;
        w.instance = *instance;
        w.reads_split = (header.flags & kFlagReadsSplit) != 0;
        w.reads_compact = (header.flags & kFlagReadsCompact) != 0;
        m.body = w;
        break;
    }
    case Type::run: {
        Run r;
        if (auto ok = codec::decode_run(header, in, r); !ok) return tl::make_unexpected(ok.error());
        m.body = std::move(r);
        break;
    }
    case Type::need_code: {
        auto hash = in.bytes(32);
        if (!hash) return truncated(t, "hash");
        NeedCode n;
        std::memcpy(n.hash.data(), hash->data(), 32);
        m.body = n;
        break;
    }
    case Type::result: {
        if (!(header.flags & kFlagWindow)) {
            m.body = ResultMsg{payload, std::nullopt};
            return m;
        }
        auto offset = in.u64(), size = in.u64();
        if (!offset || !size) return truncated(t, "window");
        m.body = ResultMsg{{}, WindowSpan{*offset, *size}};
        break;
    }
    case Type::error: {
        auto code = in.u32();
        auto kcode = in.u32();
        auto text = in.blob32();
        if (!code || !kcode || !text) return truncated(t, "message");
        ErrorMsg e;
        e.code = static_cast<Errc>(*code);
        if (*code > static_cast<std::uint32_t>(kLastErrc)) e.code = Errc::internal;
        e.kernel_code = static_cast<std::int32_t>(*kcode);
        e.message = std::string_view(reinterpret_cast<const char*>(text->data()), text->size());
        m.body = e;
        break;
    }
    case Type::ping:
    case Type::pong: m.body = Ping{payload}; return m;
    case Type::stats: m.body = Empty{}; break;
    case Type::stats_reply:
    case Type::info_reply:
    case Type::kernel_stats_reply:
    case Type::cache_list_reply:
    case Type::cache_evict:
    case Type::ack: {
        auto b = codec::decode_control(t, in);
        if (!b) return tl::make_unexpected(b.error());
        m.body = std::move(*b);
        break;
    }
    case Type::region: {
        auto name = in.str16();
        if (!name) return truncated(t, "name");
        m.body = Region{*name};
        break;
    }
    case Type::region_info: {
        auto base = in.u64();
        auto size = in.u64();
        auto rkey = in.blob32();
        if (!base || !size || !rkey) return truncated(t, "rkey");
        RegionInfo info{*base, *size, *rkey};
        if (in.remaining() != 0) { // a GPU region
            auto memory = in.u8();
            auto index = in.u32();
            if (!memory || !index) return truncated(t, "gpu region");
            if (*memory != 1) return fail(Errc::malformed_message, fmt::format("REGION_INFO message: memory kind {} is not gpu (1)", *memory));
            info.gpu = true;
            info.gpu_index = *index;
        }
        m.body = info;
        break;
    }
    case Type::gpu_read: {
        auto name = in.str16();
        auto offset = in.u64(), length = in.u64();
        if (!name || !offset || !length) return truncated(t, "range");
        m.body = GpuRead{*name, *offset, *length};
        break;
    }
    case Type::gpu_write: {
        auto name = in.str16();
        auto offset = in.u64();
        if (!name || !offset) return truncated(t, "range");
        m.body = GpuWrite{*name, *offset, *in.bytes(in.remaining())};
        break;
    }
    case Type::info:
    case Type::kernel_stats:
    case Type::cache_list:
    case Type::drain:
    case Type::window: m.body = Empty{}; break;
    case Type::batch: {
        // The engine opens batches; decoding one checks it holds whole messages.
        if (auto items = split_batch(payload); !items) return tl::make_unexpected(items.error());
        (void)in.bytes(payload.size());
        m.body = Empty{};
        break;
    }
    case Type::auth: {
        Auth a;
        if (!read_array(in, a.key) || !read_array(in, a.signature)) return truncated(t, "auth");
        m.body = a;
        break;
    }
    default:
        return fail(Errc::unknown_message, fmt::format("unknown message type {} (this build knows 1..{})",
                                                       static_cast<unsigned>(t), static_cast<unsigned>(kLastType)));
    }
    if (in.remaining() != 0) return trailing(t, in.remaining());
    return m;
}

Result<void> decode_run(const Header& header, std::span<const std::byte> payload, Run& out, const OutsideArgs* outside) {
    ByteReader in(payload);
    if (auto ok = codec::decode_run(header, in, out, outside); !ok) return ok;
    if (in.remaining() != 0) return trailing(Type::run, in.remaining());
    return {};
}

Encoded encode_hello(std::string_view client) {
    ByteWriter w;
    w.str16(client);
    return finish(start(Type::hello, 0), std::move(w));
}

Encoded encode_welcome(const Welcome& x) {
    ByteWriter w;
    w.str16(x.agent);
    w.str16(x.triple);
    w.str16(x.cpu);
    w.u16(x.llvm.major);
    w.u16(x.llvm.minor);
    w.u16(x.llvm.patch);
    w.u64(x.limits.max_message);
    w.u32(x.limits.max_args);
    w.u32(x.limits.max_result);
    w.u32(x.cores);
    w.u32(x.workers);
    w.u64(x.instance);
    auto block = encode_capabilities(x.caps);
    ByteWriter session;
    session.u8(static_cast<std::uint8_t>(x.access));
    write_array(session, x.challenge);
    session.u8(static_cast<std::uint8_t>(x.sandbox));
    auto tail = std::move(session).take();
    if (!x.caps.gpu_devices.empty() || !x.caps.gpu_regions.empty()) { // absent: no GPU, as before them
        auto gpus = encode_gpu_details(x.caps);
        tail.insert(tail.end(), gpus.begin(), gpus.end());
    }
    block.insert(block.end(), tail.begin(), tail.end());
    w.blob32(block);
    auto e = finish(start(Type::welcome, 0), std::move(w));
    if (x.reads_split) e.header.flags |= kFlagReadsSplit;
    if (x.reads_compact) e.header.flags |= kFlagReadsCompact;
    return e;
}

Encoded encode_need_code(std::uint64_t id, const CodeHash& hash) {
    ByteWriter w;
    w.raw(std::as_bytes(std::span(hash)));
    return finish(start(Type::need_code, id), std::move(w));
}

Encoded encode_result(std::uint64_t id, std::vector<std::byte> bytes) {
    auto e = start(Type::result, id);
    e.payload = std::move(bytes);
    e.header.payload_size = static_cast<std::uint32_t>(e.payload.size());
    return e;
}

Encoded encode_result(std::uint64_t id, std::span<const std::byte> bytes, std::shared_ptr<const void> keep) {
    auto e = start(Type::result, id);
    e.borrowed = bytes;
    e.keep = std::move(keep);
    e.header.payload_size = static_cast<std::uint32_t>(bytes.size());
    return e;
}

Encoded encode_window_result(std::uint64_t id, const WindowSpan& where) {
    ByteWriter w;
    w.u64(where.offset);
    w.u64(where.size);
    auto e = finish(start(Type::result, id), std::move(w));
    e.header.flags |= kFlagWindow;
    return e;
}

Encoded encode_error(std::uint64_t id, Errc code, std::string_view message, std::int32_t kernel_code) {
    ByteWriter w;
    w.u32(static_cast<std::uint32_t>(code));
    w.u32(static_cast<std::uint32_t>(kernel_code));
    if (message.size() > kMaxMessageText) message = message.substr(0, kMaxMessageText);
    w.blob32(std::as_bytes(std::span(message.data(), message.size())));
    return finish(start(Type::error, id), std::move(w));
}

Encoded encode_ping(Type type, std::uint64_t id, std::span<const std::byte> bytes) {
    auto e = start(type, id);
    e.payload.assign(bytes.begin(), bytes.end());
    e.header.payload_size = static_cast<std::uint32_t>(e.payload.size());
    return e;
}

Encoded encode_stats(std::uint64_t id) { return start(Type::stats, id); }

Encoded encode_region(std::uint64_t id, std::string_view name) {
    ByteWriter w;
    w.str16(name);
    return finish(start(Type::region, id), std::move(w));
}

Encoded encode_region_info(std::uint64_t id, const RegionInfo& info) {
    ByteWriter w;
    w.u64(info.base);
    w.u64(info.size);
    w.blob32(info.rkey);
    if (info.gpu) {
        w.u8(1);
        w.u32(info.gpu_index);
    }
    return finish(start(Type::region_info, id), std::move(w));
}

Encoded encode_gpu_read(std::uint64_t id, const GpuRead& r) {
    ByteWriter w;
    w.str16(r.name);
    w.u64(r.offset);
    w.u64(r.length);
    return finish(start(Type::gpu_read, id), std::move(w));
}

Encoded encode_gpu_write(std::uint64_t id, const GpuWrite& x) {
    ByteWriter w;
    w.reserve(2 + x.name.size() + 8 + x.bytes.size());
    w.str16(x.name);
    w.u64(x.offset);
    w.raw(x.bytes);
    return finish(start(Type::gpu_write, id), std::move(w));
}

Encoded encode_request(Type type, std::uint64_t id) { return start(type, id); }

Result<std::vector<BatchItem>> split_batch(std::span<const std::byte> payload) {
    if (payload.empty()) return fail(Errc::malformed_message, "BATCH holds no messages");
    std::vector<BatchItem> items;
    std::size_t at = 0;
    while (at < payload.size()) {
        if (items.size() == kBatchMaxItems)
            return fail(Errc::malformed_message, fmt::format("BATCH holds more than {} messages", kBatchMaxItems));
        const auto rest = payload.size() - at;
        if (rest < sizeof(Header))
            return fail(Errc::malformed_message, fmt::format("BATCH message {} is cut short in its header ({} of {} bytes)",
                                                             items.size(), rest, sizeof(Header)));
        std::uint32_t declared = 0;
        std::memcpy(&declared, payload.data() + at + offsetof(Header, payload_size), sizeof declared);
        if (declared > rest - sizeof(Header))
            return fail(Errc::malformed_message, fmt::format("BATCH message {} declares {} payload bytes but {} follow",
                                                             items.size(), declared, rest - sizeof(Header)));
        auto h = decode_header(payload.subspan(at, sizeof(Header)), declared);
        if (!h) return fail(h.error().code, fmt::format("BATCH message {}: {}", items.size(), h.error().message));
        if (h->type == Type::batch) return fail(Errc::malformed_message, "a BATCH inside a BATCH");
        items.push_back({*h, payload.subspan(at + sizeof(Header), declared)});
        at += sizeof(Header) + declared;
    }
    return items;
}

void append_to_batch(Encoded& batch, const Encoded& item) {
    const auto* h = reinterpret_cast<const std::byte*>(&item.header);
    batch.payload.insert(batch.payload.end(), h, h + sizeof(Header));
    batch.payload.insert(batch.payload.end(), item.payload.begin(), item.payload.end());
    batch.header.payload_size = static_cast<std::uint32_t>(batch.payload.size());
}

Encoded encode_auth(std::uint64_t id, const Auth& a) {
    ByteWriter w;
    write_array(w, a.key);
    write_array(w, a.signature);
    return finish(start(Type::auth, id), std::move(w));
}

} // namespace bitship::wire
