// The operator's control replies (xctl): STATS_REPLY, INFO_REPLY, KERNEL_STATS_REPLY,
// CACHE_LIST_REPLY, CACHE_EVICT and ACK. Part of the wire codec (wire.hpp).
#include "wire_codec.hpp"

namespace bitship::wire {
using namespace codec;

namespace {

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

void write_errors(ByteWriter& w, const std::vector<ErrorCount>& errors) {
    w.u32(static_cast<std::uint32_t>(errors.size()));
    for (const auto& e : errors) {
        w.u32(e.code);
        w.u64(e.count);
    }
}

} // namespace

Result<Body> codec::decode_control(Type t, ByteReader& in) {
    switch (t) {
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
        return Body{std::move(s)};
    }
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
        return Body{std::move(f)};
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
        return Body{std::move(s)};
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
        return Body{std::move(c)};
    }
    case Type::cache_evict: {
        CacheEvict e;
        if (!read_hash(in, e.hash)) return truncated(t, "hash");
        return Body{e};
    }
    case Type::ack: {
        auto done = in.u8();
        auto note = in.str16();
        if (!done || !note) return truncated(t, "ack");
        if (*done > 1) return fail(Errc::malformed_message, "ACK message: done is neither 0 nor 1");
        return Body{Ack{*done == 1, *note}};
    }
    default: break;
    }
    return fail(Errc::internal, fmt::format("{} is not an operator's control reply", to_string(t)));
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

} // namespace bitship::wire
