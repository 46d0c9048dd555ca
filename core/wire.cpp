#include "wire.hpp"

#include <cstring>
#include <optional>

#include <fmt/format.h>

#include "byte_io.hpp"

namespace bitship::wire {
namespace {

constexpr std::size_t kMaxMessageText = 64 * 1024;

Encoded start(Type type, std::uint64_t id) {
    Encoded e;
    e.header.type = type;
    e.header.request_id = id;
    return e;
}

Encoded finish(Encoded e, ByteWriter&& w) {
    e.payload = std::move(w).take();
    e.header.payload_size = static_cast<std::uint32_t>(e.payload.size());
    return e;
}

tl::unexpected<Error> truncated(Type t, std::string_view field) {
    return fail(Errc::malformed_message, fmt::format("{} message: '{}' runs past the end of the payload", to_string(t), field));
}

// A list count checked against what the payload can hold at `min_size` bytes per element,
// before anything is reserved for it.
std::optional<std::uint32_t> count_of(ByteReader& in, std::size_t min_size) {
    auto n = in.u32();
    if (!n || *n > in.remaining() / min_size) return std::nullopt;
    return n;
}

bool read_hash(ByteReader& in, CodeHash& out) {
    auto b = in.bytes(out.size());
    if (!b) return false;
    std::memcpy(out.data(), b->data(), out.size());
    return true;
}

bool read_errors(ByteReader& in, std::vector<ErrorCount>& out) {
    auto n = count_of(in, 12);
    if (!n) return false;
    out.reserve(*n);
    for (std::uint32_t i = 0; i < *n; ++i) {
        auto code = in.u32();
        auto count = in.u64();
        if (!code || !count) return false;
        out.push_back({*code, *count});
    }
    return true;
}

template <std::size_t N> bool read_array(ByteReader& in, std::array<std::uint8_t, N>& out) {
    auto b = in.bytes(N);
    if (!b) return false;
    std::memcpy(out.data(), b->data(), N);
    return true;
}

template <std::size_t N> void write_array(ByteWriter& w, const std::array<std::uint8_t, N>& a) {
    w.raw(std::as_bytes(std::span(a)));
}

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

void write_errors(ByteWriter& w, const std::vector<ErrorCount>& errors) {
    w.u32(static_cast<std::uint32_t>(errors.size()));
    for (const auto& e : errors) {
        w.u32(e.code);
        w.u64(e.count);
    }
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
        m.body = w;
        break;
    }
    case Type::run: {
        Run r;
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
        auto args = in.bytes(*args_size);
        if (!args) return truncated(t, "args");
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
    case Type::stats_reply: {
        auto count = in.u32();
        if (!count) return truncated(t, "count");
        StatsReply s;
        // Each counter takes at least 10 bytes; refuse counts the payload cannot hold.
        if (*count > in.remaining() / 10) return truncated(t, "counters");
        for (std::uint32_t i = 0; i < *count; ++i) {
            auto name = in.str16();
            auto value = in.u64();
            if (!name || !value) return truncated(t, "counters");
            s.counters.emplace_back(*name, *value);
        }
        m.body = std::move(s);
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
    case Type::info_reply: {
        Fields f;
        auto n = count_of(in, 4); // two empty str16s at least
        if (!n) return truncated(t, "count");
        f.fields.reserve(*n);
        for (std::uint32_t i = 0; i < *n; ++i) {
            auto name = in.str16();
            auto value = in.str16();
            if (!name || !value) return truncated(t, "fields");
            f.fields.emplace_back(*name, *value);
        }
        m.body = std::move(f);
        break;
    }
    case Type::kernel_stats_reply: {
        KernelStatsReply s;
        constexpr std::size_t kMinKernel = 32 + 2 + 9 * 8 + 4, kMinClient = 2 + 3 * 8 + 4;
        auto kernels = count_of(in, kMinKernel);
        if (!kernels) return truncated(t, "kernels");
        s.kernels.reserve(*kernels);
        for (std::uint32_t i = 0; i < *kernels; ++i) {
            KernelStat k;
            if (!read_hash(in, k.hash)) return truncated(t, "kernel hash");
            auto entry = in.str16();
            if (!entry) return truncated(t, "kernel entry");
            k.entry = *entry;
            for (auto* field : {&k.calls, &k.bytes_in, &k.bytes_out, &k.runs, &k.run_p50_ns, &k.run_p99_ns,
                                &k.run_total_ns, &k.compile_ns_first, &k.compile_ns_optimised}) {
                auto v = in.u64();
                if (!v) return truncated(t, "kernel counters");
                *field = *v;
            }
            if (!read_errors(in, k.errors)) return truncated(t, "kernel errors");
            s.kernels.push_back(std::move(k));
        }
        auto clients = count_of(in, kMinClient);
        if (!clients) return truncated(t, "clients");
        s.clients.reserve(*clients);
        for (std::uint32_t i = 0; i < *clients; ++i) {
            ClientStat c;
            auto name = in.str16();
            auto calls = in.u64(), bytes_in = in.u64(), bytes_out = in.u64();
            if (!name || !calls || !bytes_in || !bytes_out) return truncated(t, "client");
            c.client = *name;
            c.calls = *calls;
            c.bytes_in = *bytes_in;
            c.bytes_out = *bytes_out;
            if (!read_errors(in, c.errors)) return truncated(t, "client errors");
            s.clients.push_back(std::move(c));
        }
        m.body = std::move(s);
        break;
    }
    case Type::cache_list_reply: {
        CacheList c;
        constexpr std::size_t kEntry = 32 + 3 * 8 + 1;
        auto n = count_of(in, kEntry);
        if (!n) return truncated(t, "count");
        c.entries.reserve(*n);
        for (std::uint32_t i = 0; i < *n; ++i) {
            CacheEntry e;
            if (!read_hash(in, e.hash)) return truncated(t, "hash");
            auto mem = in.u64(), disk = in.u64(), idle = in.u64();
            auto in_use = in.u8();
            if (!mem || !disk || !idle || !in_use) return truncated(t, "entry");
            if (*in_use > 1) return fail(Errc::malformed_message, "CACHE_LIST_REPLY message: in_use is neither 0 nor 1");
            e.memory_bytes = *mem;
            e.disk_bytes = *disk;
            e.idle_ms = *idle;
            e.in_use = *in_use == 1;
            c.entries.push_back(e);
        }
        m.body = std::move(c);
        break;
    }
    case Type::cache_evict: {
        CacheEvict e;
        if (!read_hash(in, e.hash)) return truncated(t, "hash");
        m.body = e;
        break;
    }
    case Type::ack: {
        auto done = in.u8();
        auto note = in.str16();
        if (!done || !note) return truncated(t, "ack");
        if (*done > 1) return fail(Errc::malformed_message, "ACK message: done is neither 0 nor 1");
        m.body = Ack{*done == 1, *note};
        break;
    }
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
    if (in.remaining() != 0)
        return fail(Errc::malformed_message,
                    fmt::format("{} message has {} unexpected trailing bytes", to_string(t), in.remaining()));
    return m;
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
    return finish(start(Type::welcome, 0), std::move(w));
}

Encoded encode_run(std::uint64_t id, const Run& r) {
    ByteWriter w;
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
    w.reserve(sizeof r.hash + 8 + 3 * 2 + 2 + r.entry.size() + 4 + kArgsAlignment + r.args.size() + 4 + r.code.size() + 4 +
              r.reply_to.size() + 2 + peers + 2 + r.signatures.size() * sizeof(CodeSignature));
    w.raw(std::as_bytes(std::span(r.hash)));
    w.u64(r.origin);
    w.u16(r.hop_budget);
    w.u16(r.hops);
    w.u16(r.self_index);
    w.str16(r.entry);
    w.u32(static_cast<std::uint32_t>(r.args.size()));
    w.align(kArgsAlignment);
    w.raw(r.args);
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
    auto e = finish(start(Type::run, id), std::move(w));
    if (r.window) e.header.flags |= kFlagWindow;
    if (r.gpu) e.header.flags |= kFlagGpu;
    if (r.each) e.header.flags |= kFlagEach;
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

Encoded encode_stats_reply(std::uint64_t id, std::span<const std::pair<std::string, std::uint64_t>> counters) {
    ByteWriter w;
    w.u32(static_cast<std::uint32_t>(counters.size()));
    for (const auto& [name, value] : counters) {
        w.str16(name);
        w.u64(value);
    }
    return finish(start(Type::stats_reply, id), std::move(w));
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

Encoded encode_info_reply(std::uint64_t id, const Fields& f) {
    ByteWriter w;
    w.u32(static_cast<std::uint32_t>(f.fields.size()));
    for (const auto& [name, value] : f.fields) {
        w.str16(name);
        w.str16(value);
    }
    return finish(start(Type::info_reply, id), std::move(w));
}

Encoded encode_kernel_stats_reply(std::uint64_t id, const KernelStatsReply& s) {
    ByteWriter w;
    w.u32(static_cast<std::uint32_t>(s.kernels.size()));
    for (const auto& k : s.kernels) {
        w.raw(std::as_bytes(std::span(k.hash)));
        w.str16(k.entry);
        for (auto v : {k.calls, k.bytes_in, k.bytes_out, k.runs, k.run_p50_ns, k.run_p99_ns, k.run_total_ns,
                       k.compile_ns_first, k.compile_ns_optimised})
            w.u64(v);
        write_errors(w, k.errors);
    }
    w.u32(static_cast<std::uint32_t>(s.clients.size()));
    for (const auto& c : s.clients) {
        w.str16(c.client);
        w.u64(c.calls);
        w.u64(c.bytes_in);
        w.u64(c.bytes_out);
        write_errors(w, c.errors);
    }
    return finish(start(Type::kernel_stats_reply, id), std::move(w));
}

Encoded encode_cache_list_reply(std::uint64_t id, const CacheList& c) {
    ByteWriter w;
    w.u32(static_cast<std::uint32_t>(c.entries.size()));
    for (const auto& e : c.entries) {
        w.raw(std::as_bytes(std::span(e.hash)));
        w.u64(e.memory_bytes);
        w.u64(e.disk_bytes);
        w.u64(e.idle_ms);
        w.u8(e.in_use ? 1 : 0);
    }
    return finish(start(Type::cache_list_reply, id), std::move(w));
}

Encoded encode_cache_evict(std::uint64_t id, const CodeHash& hash) {
    ByteWriter w;
    w.raw(std::as_bytes(std::span(hash)));
    return finish(start(Type::cache_evict, id), std::move(w));
}

Encoded encode_ack(std::uint64_t id, bool done, std::string_view note) {
    ByteWriter w;
    w.u8(done ? 1 : 0);
    w.str16(note.substr(0, 0xffff));
    return finish(start(Type::ack, id), std::move(w));
}

Encoded encode_auth(std::uint64_t id, const Auth& a) {
    ByteWriter w;
    write_array(w, a.key);
    write_array(w, a.signature);
    return finish(start(Type::auth, id), std::move(w));
}

} // namespace bitship::wire
