#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>

#include "core/wire.hpp"
#include "wire_checks.hpp"

namespace wire_test_cpp {

using namespace bitship;
using bitship::test::as_bytes;
using bitship::test::every_truncation_refused;

namespace {

wire::Encoded sample_run() {
    wire::Run r;
    r.hash.fill(7);
    r.hop_budget = 3;
    r.hops = 1;
    r.self_index = 1;
    r.entry = "add";
    static const std::string reply_to = "worker-address";
    r.reply_to = as_bytes(reply_to);
    r.peers = {"127.0.0.1:7000", "127.0.0.1:7001"};
    static const std::string args = "0123456789abcdef";
    static const std::string code = "pretend-bundle";
    r.args = as_bytes(args);
    r.code = as_bytes(code);
    return wire::encode_run(42, r);
}

std::span<const std::byte> header_bytes(const wire::Header& h) { return std::as_bytes(std::span(&h, 1)); }

// A file of the wire fuzzer's corpus (test/core/fuzz_corpus): a header and its payload as they
// travel, the header checked.
struct Seed {
    std::vector<std::byte> bytes;
    wire::Header header;
    [[nodiscard]] std::span<const std::byte> payload() const { return std::span(bytes).subspan(sizeof(wire::Header)); }
};
Seed read_seed(const std::string& name) {
    std::ifstream in(std::string(BITSHIP_WIRE_CORPUS) + "/" + name, std::ios::binary);
    std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    REQUIRE(chars.size() > sizeof(wire::Header));
    Seed seed;
    const auto b = std::as_bytes(std::span(chars));
    seed.bytes.assign(b.begin(), b.end());
    auto h = wire::decode_header(std::span(seed.bytes).first(sizeof(wire::Header)), seed.bytes.size() - sizeof(wire::Header));
    REQUIRE(h);
    seed.header = *h;
    return seed;
}

} // namespace

TEST_CASE("a RUN message survives encode and decode", "[unit]") {
    auto e = sample_run();
    auto h = wire::decode_header(header_bytes(e.header), e.payload.size());
    REQUIRE(h);
    CHECK(h->request_id == 42);
    auto m = wire::decode(*h, e.payload);
    REQUIRE(m);
    const auto& r = std::get<wire::Run>(m->body);
    CHECK(r.entry == "add");
    CHECK(r.hop_budget == 3);
    CHECK(r.hash[31] == 7);
    CHECK(r.args.size() == 16);
    CHECK(std::string(reinterpret_cast<const char*>(r.code.data()), r.code.size()) == "pretend-bundle");
    CHECK(r.hops == 1);
    CHECK(r.self_index == 1);
    CHECK(r.reply_to.size() == 14);
    REQUIRE(r.peers.size() == 2);
    CHECK(r.peers[1] == "127.0.0.1:7001");
}

TEST_CASE("RUN arguments start 16-byte aligned in the payload", "[unit]") {
    for (std::string entry : {"a", "ab", "abc", "chase", "a_longer_entry_name"}) {
        wire::Run r;
        r.entry = entry;
        static const std::uint64_t value = 7;
        r.args = std::as_bytes(std::span(&value, 1));
        auto e = wire::encode_run(1, r);
        auto m = wire::decode(e.header, e.payload);
        REQUIRE(m);
        auto offset = static_cast<std::size_t>(std::get<wire::Run>(m->body).args.data() - e.payload.data());
        CHECK(offset % wire::kArgsAlignment == 0);
    }
}

TEST_CASE("a RUN naming itself outside its peer table is refused", "[unit]") {
    wire::Run r;
    r.entry = "chase";
    r.self_index = 2;
    r.peers = {"127.0.0.1:7000", "127.0.0.1:7001"};
    auto e = wire::encode_run(1, r);
    auto m = wire::decode(e.header, e.payload);
    REQUIRE_FALSE(m);
    CHECK(m.error().code == Errc::malformed_message);
}

TEST_CASE("REGION and REGION_INFO round trip", "[unit]") {
    auto e = wire::encode_region(3, "chase");
    auto m = wire::decode(e.header, e.payload);
    REQUIRE(m);
    CHECK(std::get<wire::Region>(m->body).name == "chase");
    static const std::string rkey = "packed-rkey-bytes";
    auto ie = wire::encode_region_info(4, {0x1000, 1 << 20, as_bytes(rkey)});
    auto im = wire::decode(ie.header, ie.payload);
    REQUIRE(im);
    auto info = std::get<wire::RegionInfo>(im->body);
    CHECK(info.base == 0x1000);
    CHECK(info.size == 1u << 20);
    CHECK(info.rkey.size() == rkey.size());
}

TEST_CASE("every truncation of a RUN payload is refused as malformed, never read past", "[unit]") {
    every_truncation_refused(sample_run());
}

TEST_CASE("trailing bytes after a message are refused", "[unit]") {
    auto e = sample_run();
    e.payload.push_back(std::byte{0});
    e.header.payload_size += 1;
    auto m = wire::decode(e.header, e.payload);
    REQUIRE_FALSE(m);
    CHECK(m.error().code == Errc::malformed_message);
}

TEST_CASE("decode_run (the agent's path) gives the RUN decode() gives, and refuses what decode() refuses", "[unit]") {
    auto e = sample_run();
    wire::Run r;
    REQUIRE(wire::decode_run(e.header, e.payload, r));
    CHECK(r.entry == "add");
    CHECK(r.hop_budget == 3);
    CHECK(r.hash[31] == 7);
    CHECK(r.args.size() == 16);
    CHECK(r.args.data() >= e.payload.data()); // views into the payload
    CHECK(r.hops == 1);
    CHECK(r.self_index == 1);
    CHECK(r.reply_to.size() == 14);
    REQUIRE(r.peers.size() == 2);
    CHECK(r.peers[1] == "127.0.0.1:7001");
    // Every truncation, and a byte past the end, are refused as decode() refuses them.
    for (std::size_t n = 0; n < e.payload.size(); ++n) {
        wire::Header h = e.header;
        h.payload_size = static_cast<std::uint32_t>(n);
        auto cut = std::span(e.payload).first(n);
        wire::Run part;
        auto direct = wire::decode_run(h, cut, part);
        auto whole = wire::decode(h, cut);
        REQUIRE(direct.has_value() == whole.has_value());
        if (!direct) CHECK(direct.error().message == whole.error().message);
    }
    e.payload.push_back(std::byte{0});
    e.header.payload_size += 1;
    wire::Run padded;
    auto refused = wire::decode_run(e.header, e.payload, padded);
    REQUIRE_FALSE(refused);
    CHECK(refused.error().code == Errc::malformed_message);
    auto also = wire::decode(e.header, e.payload);
    REQUIRE_FALSE(also);
    CHECK(refused.error().message == also.error().message);
}

TEST_CASE("a direct call goes compact where asked: the same RUN decodes, in fewer bytes", "[unit]") {
    for (std::string entry : {"a", "empty", "chase_step", "a_longer_entry_name_than_most"}) {
        for (std::size_t n : {std::size_t{0}, std::size_t{8}, std::size_t{17}, std::size_t{4096}}) {
            std::vector<std::byte> args(n);
            for (std::size_t i = 0; i < n; ++i) args[i] = std::byte(i + 1);
            wire::Run r;
            r.hash.fill(9);
            r.origin = 77;
            r.entry = entry;
            r.args = args;
            auto compact = wire::encode_run(77, r, true);
            auto full = wire::encode_run(77, r);
            CHECK(compact.header.flags == wire::kFlagCompact);
            CHECK(full.header.flags == 0);
            CHECK(compact.payload.size() < full.payload.size());
            for (const auto* e : {&compact, &full}) {
                wire::Run got;
                REQUIRE(wire::decode_run(e->header, e->payload, got));
                CHECK(got.hash == r.hash);
                CHECK(got.origin == 77);
                CHECK(got.entry == entry);
                CHECK(std::equal(got.args.begin(), got.args.end(), args.begin(), args.end()));
                CHECK(static_cast<std::size_t>(got.args.data() - e->payload.data()) % wire::kArgsAlignment == 0);
                CHECK(got.code.empty());
                CHECK(got.reply_to.empty());
                CHECK(got.peers.empty());
                CHECK(got.hops == 0);
                CHECK(got.hop_budget == 0);
                CHECK_FALSE(got.window);
            }
        }
    }
    // An 8-byte call with a short entry fits UCX's 100-byte short message over shared memory,
    // with bitship's 24-byte header and UCP's 8.
    wire::Run r;
    static const std::uint64_t value = 7;
    r.entry = "empty";
    r.args = std::as_bytes(std::span(&value, 1));
    r.origin = 1;
    CHECK(sizeof(wire::Header) + wire::encode_run(1, r, true).payload.size() + 8 <= 100);
}

TEST_CASE("a RUN that is not a direct call goes in the full form even where compact is asked", "[unit]") {
    static const std::string code = "pretend-bundle";
    auto base = [] {
        wire::Run r;
        r.entry = "add";
        r.origin = 5;
        return r;
    };
    std::vector<wire::Run> runs(8, base());
    runs[0].code = as_bytes(code);
    runs[1].hops = 1;
    runs[2].hop_budget = 2;
    runs[3].peers = {"127.0.0.1:7000"};
    runs[4].reply_to = as_bytes(code);
    runs[5].window = wire::WindowUse{0, 0, 64, 64};
    runs[6].origin = 6; // a forward's origin is not its request id
    runs[7].signatures.resize(1);
    for (const auto& r : runs) {
        auto e = wire::encode_run(5, r, true);
        CHECK((e.header.flags & wire::kFlagCompact) == 0);
        CHECK(wire::decode(e.header, e.payload));
    }
}

TEST_CASE("compact RUNs that are cut, padded, flagged twice or name no entry are refused as malformed", "[unit]") {
    wire::Run r;
    r.hash.fill(3);
    r.entry = "add";
    r.origin = 9;
    static const std::string args = "0123456789";
    r.args = as_bytes(args);
    auto e = wire::encode_run(9, r, true);
    REQUIRE(e.header.flags == wire::kFlagCompact);
    every_truncation_refused(e);
    auto padded = e;
    padded.payload.push_back(std::byte{0});
    padded.header.payload_size += 1;
    auto m = wire::decode(padded.header, padded.payload);
    REQUIRE_FALSE(m);
    CHECK(m.error().code == Errc::malformed_message);
    for (auto other : {wire::kFlagWindow, wire::kFlagGpu, wire::kFlagEach}) {
        auto both = e;
        both.header.flags |= other;
        auto refused = wire::decode(both.header, both.payload);
        REQUIRE_FALSE(refused);
        CHECK(refused.error().code == Errc::malformed_message);
        CHECK_THAT(refused.error().message, Catch::Contains("compact"));
    }
    wire::Run nameless = r;
    nameless.entry = "";
    auto ne = wire::encode_run(9, nameless, true); // no entry: not compact (the full form refuses it too)
    CHECK_FALSE(wire::decode(ne.header, ne.payload));
    // A compact payload whose entry length is 0, written by hand.
    auto hand = e;
    const std::size_t entry_at = 32 + 4;
    hand.payload[entry_at] = std::byte{0};
    hand.payload[entry_at + 1] = std::byte{0};
    auto no_entry = wire::decode(hand.header, hand.payload);
    REQUIRE_FALSE(no_entry);
    CHECK(no_entry.error().code == Errc::malformed_message);
}

TEST_CASE("the fuzz corpus' compact RUN seed is a valid compact RUN", "[unit]") {
    const auto seed = read_seed("run_compact.bin");
    CHECK(seed.header.flags == wire::kFlagCompact);
    auto m = wire::decode(seed.header, seed.payload());
    REQUIRE(m);
    const auto& r = std::get<wire::Run>(m->body);
    CHECK(r.entry == "empty");
    CHECK(r.args.size() == 8);
    CHECK(r.origin == 42);
}

TEST_CASE("WELCOME says whether the agent reads compact RUNs", "[unit]") {
    wire::Welcome w;
    w.triple = "x86_64-pc-linux-gnu";
    auto plain = wire::encode_welcome(w);
    w.reads_compact = true;
    auto compact = wire::encode_welcome(w);
    CHECK(compact.header.flags == wire::kFlagReadsCompact);
    CHECK(compact.payload == plain.payload);
    auto m = wire::decode(compact.header, compact.payload);
    REQUIRE(m);
    CHECK(std::get<wire::Welcome>(m->body).reads_compact);
    auto old = wire::decode(plain.header, plain.payload);
    REQUIRE(old);
    CHECK_FALSE(std::get<wire::Welcome>(old->body).reads_compact);
}

TEST_CASE("a header whose declared size differs from what arrived is refused", "[unit]") {
    auto e = sample_run();
    auto h = wire::decode_header(header_bytes(e.header), e.payload.size() - 1);
    REQUIRE_FALSE(h);
    CHECK(h.error().code == Errc::malformed_message);
    CHECK_THAT(h.error().message, Catch::Contains("truncated"));
}

TEST_CASE("bad magic, wrong version and short headers are refused by code", "[unit]") {
    auto e = sample_run();
    auto bad = e.header;
    bad.magic = 0xdeadbeef;
    CHECK(wire::decode_header(header_bytes(bad), e.payload.size()).error().code == Errc::malformed_message);
    bad = e.header;
    bad.version = 9;
    CHECK(wire::decode_header(header_bytes(bad), e.payload.size()).error().code == Errc::unsupported_version);
    CHECK(wire::decode_header(header_bytes(e.header).first(10), e.payload.size()).error().code == Errc::malformed_message);
}

TEST_CASE("an unknown message type is refused as unknown_message", "[unit]") {
    wire::Header h;
    h.type = static_cast<wire::Type>(99);
    auto m = wire::decode(h, {});
    REQUIRE_FALSE(m);
    CHECK(m.error().code == Errc::unknown_message);
}

TEST_CASE("ERROR, WELCOME and STATS_REPLY round trip", "[unit]") {
    auto e = wire::encode_error(5, Errc::unresolved_symbol, "kernel references 'system'", 0);
    auto m = wire::decode(e.header, e.payload);
    REQUIRE(m);
    auto err = std::get<wire::ErrorMsg>(m->body);
    CHECK(err.code == Errc::unresolved_symbol);
    CHECK(err.message == "kernel references 'system'");

    wire::Welcome w;
    w.agent = "127.0.0.1:7000";
    w.triple = "x86_64-pc-linux-gnu";
    w.cpu = "znver4";
    w.llvm = {19, 1, 7};
    w.cores = 2;
    w.workers = 2;
    w.instance = 0x1234;
    auto we = wire::encode_welcome(w);
    auto wm = wire::decode(we.header, we.payload);
    REQUIRE(wm);
    auto got = std::get<wire::Welcome>(wm->body);
    CHECK(got.triple == "x86_64-pc-linux-gnu");
    CHECK(got.llvm == LlvmVersion{19, 1, 7});
    CHECK(got.instance == 0x1234);
    CHECK(got.limits.max_args == wire::Limits{}.max_args);
    CHECK_FALSE(got.reads_split); // an agent from before split messages: no flags
    CHECK(we.header.flags == 0);
    w.reads_split = true;
    auto split_we = wire::encode_welcome(w);
    CHECK(split_we.header.flags == wire::kFlagReadsSplit);
    CHECK(split_we.payload == we.payload); // a flag in the header, which older clients ignore
    auto split_wm = wire::decode(split_we.header, split_we.payload);
    REQUIRE(split_wm);
    CHECK(std::get<wire::Welcome>(split_wm->body).reads_split);

    std::vector<std::pair<std::string, std::uint64_t>> counters{{"runs", 3}, {"results", 2}};
    auto se = wire::encode_stats_reply(1, counters);
    auto sm = wire::decode(se.header, se.payload);
    REQUIRE(sm);
    auto s = std::get<wire::StatsReply>(sm->body);
    REQUIRE(s.counters.size() == 2);
    CHECK(s.counters[1].first == "results");
    CHECK(s.counters[1].second == 2);
}

TEST_CASE("a STATS_REPLY claiming more counters than bytes is refused", "[unit]") {
    wire::Header h;
    h.type = wire::Type::stats_reply;
    std::vector<std::byte> payload(4);
    std::uint32_t huge = 0xffffffff;
    std::memcpy(payload.data(), &huge, 4);
    auto m = wire::decode(h, payload);
    REQUIRE_FALSE(m);
    CHECK(m.error().code == Errc::malformed_message);
}

TEST_CASE("an error code from a newer peer decodes as internal, not as garbage", "[unit]") {
    auto e = wire::encode_error(5, static_cast<Errc>(9999), "from the future");
    auto m = wire::decode(e.header, e.payload);
    REQUIRE(m);
    CHECK(std::get<wire::ErrorMsg>(m->body).code == Errc::internal);
}

TEST_CASE("a WELCOME whose strings run short is refused (fuzzer find)", "[unit]") {
    // libFuzzer found this: a failed string read consumed its length prefix, later fields
    // decoded from the middle of others, and an unchecked one was used.
    std::ifstream in(BITSHIP_WIRE_CORPUS "/crash_welcome_unchecked_fields", std::ios::binary);
    std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    REQUIRE(chars.size() >= sizeof(wire::Header));
    auto bytes = std::as_bytes(std::span(chars));
    auto payload = bytes.subspan(sizeof(wire::Header));
    auto h = wire::decode_header(bytes.first(sizeof(wire::Header)), payload.size());
    if (h) {
        auto m = wire::decode(*h, payload);
        REQUIRE_FALSE(m);
        CHECK(m.error().code == Errc::malformed_message);
    }
}

namespace {

wire::Welcome welcome_with_caps() {
    wire::Welcome w;
    w.agent = "127.0.0.1:7000";
    w.triple = "aarch64-unknown-linux-gnu";
    w.cpu = "neoverse-n1";
    w.llvm = {19, 1, 7};
    w.cores = 16;
    w.workers = 16;
    w.instance = 7;
    w.caps.kind = NodeKind::dpu;
    w.caps.kind_reason = "BlueField-3 (PCI 15b3:a2dc) on aarch64 cores";
    w.caps.pus = 16;
    w.caps.numa = {{0, 16ull << 30}, {1, 8ull << 30}};
    w.caps.cpu_model = "Cortex-A78AE";
    w.caps.gpus = 0;
    return w;
}

} // namespace

TEST_CASE("WELCOME carries the agent's capabilities: kind, threads, NUMA nodes and their memory, CPU model, GPUs", "[unit]") {
    auto e = wire::encode_welcome(welcome_with_caps());
    auto m = wire::decode(e.header, e.payload);
    REQUIRE(m);
    const auto& got = std::get<wire::Welcome>(m->body);
    CHECK(got.cpu == "neoverse-n1");
    CHECK(got.caps.kind == NodeKind::dpu);
    CHECK(got.caps.kind_reason == "BlueField-3 (PCI 15b3:a2dc) on aarch64 cores");
    CHECK(got.caps.pus == 16);
    REQUIRE(got.caps.numa.size() == 2);
    CHECK(got.caps.numa[1].os_index == 1);
    CHECK(got.caps.numa[1].memory_bytes == 8ull << 30);
    CHECK(got.caps.cpu_model == "Cortex-A78AE");
    CHECK(got.caps.gpus == 0);
    CHECK(std::string(to_string(got.caps.kind)) == "dpu");
}

TEST_CASE("a capabilities block with fields this build does not know decodes: later fields are appended", "[unit]") {
    auto block = wire::encode_capabilities(welcome_with_caps().caps);
    block.insert(block.end(), {std::byte{0xaa}, std::byte{0xbb}, std::byte{0xcc}});
    auto c = wire::decode_capabilities(block);
    REQUIRE(c);
    CHECK(c->gpus == 0);
    CHECK(c->numa.size() == 2);
}

TEST_CASE("a capabilities block cut inside any field is refused, never read past", "[unit]") {
    const auto block = wire::encode_capabilities(welcome_with_caps().caps);
    for (std::size_t n = 0; n < block.size(); ++n) {
        auto c = wire::decode_capabilities(std::span(block).first(n));
        INFO("block cut to " << n << " of " << block.size() << " bytes");
        REQUIRE_FALSE(c);
        CHECK(c.error().code == Errc::malformed_message);
    }
    // A whole WELCOME cut inside its capabilities: the block's length prefix overruns.
    auto e = wire::encode_welcome(welcome_with_caps());
    e.payload.resize(e.payload.size() - 5);
    auto m = wire::decode(e.header, e.payload);
    REQUIRE_FALSE(m);
    CHECK(m.error().code == Errc::malformed_message);
    CHECK_THAT(m.error().message, Catch::Contains("capabilities"));
}

TEST_CASE("a capabilities block claiming more NUMA nodes than bytes, or an unknown node kind, is refused", "[unit]") {
    auto caps = welcome_with_caps().caps;
    caps.numa.clear();
    auto block = wire::encode_capabilities(caps);
    // The NUMA count sits after kind (1), the reason (2 + length) and pus (4).
    const auto count_at = 1 + 2 + caps.kind_reason.size() + 4;
    block[count_at] = std::byte{0xff};
    block[count_at + 1] = std::byte{0xff};
    auto c = wire::decode_capabilities(block);
    REQUIRE_FALSE(c);
    CHECK(c.error().code == Errc::malformed_message);
    CHECK_THAT(c.error().message, Catch::Contains("numa"));

    auto bad_kind = wire::encode_capabilities(caps);
    bad_kind[0] = std::byte{9};
    auto k = wire::decode_capabilities(bad_kind);
    REQUIRE_FALSE(k);
    CHECK(k.error().code == Errc::malformed_message);
    CHECK_THAT(k.error().message, Catch::Contains("node kind 9"));
}

TEST_CASE("the fuzz corpus' WELCOME seed is a valid WELCOME with every capability field", "[unit]") {
    // The seed the wire fuzzer starts from (test/core/fuzz_corpus/seed_welcome_caps): header +
    // payload as they travel, so mutations reach each capability field.
    const auto seed = read_seed("seed_welcome_caps");
    auto m = wire::decode(seed.header, seed.payload());
    REQUIRE(m);
    const auto& w = std::get<wire::Welcome>(m->body);
    CHECK(w.caps.kind == NodeKind::dpu);
    CHECK(w.caps.numa.size() == 2);
    CHECK(w.caps.cpu_model == "Cortex-A78AE");
}

TEST_CASE("a RUN and a RESULT that use the session's bulk window round trip, flagged in the header", "[unit]") {
    wire::Run r;
    r.hash.fill(3);
    r.entry = "echo";
    r.window = wire::WindowUse{2u << 20, 1u << 20, 2u << 20, 2u << 20};
    auto e = wire::encode_run(5, r);
    CHECK((e.header.flags & wire::kFlagWindow) != 0);
    auto m = wire::decode(e.header, e.payload);
    REQUIRE(m);
    const auto& got = std::get<wire::Run>(m->body);
    REQUIRE(got.window);
    CHECK(got.window->args_offset == 2u << 20);
    CHECK(got.window->args_size == 1u << 20);
    CHECK(got.window->result_capacity == 2u << 20);
    CHECK(got.args.empty());
    CHECK(got.entry == "echo");
    // Without the flag the same RUN carries no window.
    CHECK_FALSE(std::get<wire::Run>(wire::decode(sample_run().header, sample_run().payload)->body).window);

    auto re = wire::encode_window_result(6, {4096, 12345});
    CHECK((re.header.flags & wire::kFlagWindow) != 0);
    auto rm = wire::decode(re.header, re.payload);
    REQUIRE(rm);
    const auto& res = std::get<wire::ResultMsg>(rm->body);
    REQUIRE(res.window);
    CHECK(res.window->offset == 4096);
    CHECK(res.window->size == 12345);
    CHECK(res.bytes.empty());
}

TEST_CASE("window RUNs and RESULTs that are cut short, or carry arguments twice, are refused as malformed", "[unit]") {
    wire::Run r;
    r.entry = "echo";
    static const std::uint64_t value = 7;
    r.window = wire::WindowUse{0, 64, 0, 64};
    r.args = std::as_bytes(std::span(&value, 1));
    auto twice = wire::encode_run(1, r);
    auto m = wire::decode(twice.header, twice.payload);
    REQUIRE_FALSE(m);
    CHECK(m.error().code == Errc::malformed_message);
    CHECK_THAT(m.error().message, Catch::Contains("window"));

    for (auto e : {wire::encode_run(2, [] { wire::Run x; x.entry = "echo"; x.window = wire::WindowUse{}; return x; }()),
                   wire::encode_window_result(3, {0, 8})})
        every_truncation_refused(e);
}

TEST_CASE("a BATCH holds whole messages: they split back out as they went in", "[unit]") {
    auto batch = wire::encode_request(wire::Type::batch, 0);
    auto run = sample_run();
    auto result = wire::encode_result(9, std::vector<std::byte>(8, std::byte{3}));
    auto ping = wire::encode_ping(wire::Type::ping, 10, {});
    for (const auto* m : {&run, &result, &ping}) wire::append_to_batch(batch, *m);
    REQUIRE(batch.header.payload_size == batch.payload.size());
    REQUIRE(wire::decode(batch.header, batch.payload));
    auto items = wire::split_batch(batch.payload);
    REQUIRE(items);
    REQUIRE(items->size() == 3);
    std::size_t i = 0;
    for (const auto* m : {&run, &result, &ping}) {
        const auto& item = (*items)[i++];
        CHECK(item.header.type == m->header.type);
        CHECK(item.header.request_id == m->header.request_id);
        CHECK(std::equal(item.payload.begin(), item.payload.end(), m->payload.begin(), m->payload.end()));
        CHECK(wire::decode(item.header, item.payload));
    }
    // Cut anywhere but between two messages, it is refused; cut between, it holds fewer.
    std::size_t boundaries = 0;
    for (std::size_t n = 0; n < batch.payload.size(); ++n) {
        auto cut = std::span<const std::byte>(batch.payload).first(n);
        auto split = wire::split_batch(cut);
        if (split) {
            ++boundaries;
            CHECK(split->size() < 3);
        } else {
            CHECK(split.error().code == Errc::malformed_message);
        }
    }
    CHECK(boundaries == 2);
}

TEST_CASE("BATCHes that are empty, nested, too long or carry a bad header are refused by name", "[unit]") {
    auto empty = wire::split_batch({});
    REQUIRE_FALSE(empty);
    CHECK_THAT(empty.error().message, Catch::Contains("no messages"));

    auto inner = wire::encode_request(wire::Type::batch, 0);
    wire::append_to_batch(inner, sample_run());
    auto outer = wire::encode_request(wire::Type::batch, 0);
    wire::append_to_batch(outer, inner);
    auto nested = wire::split_batch(outer.payload);
    REQUIRE_FALSE(nested);
    CHECK_THAT(nested.error().message, Catch::Contains("inside a BATCH"));

    auto many = wire::encode_request(wire::Type::batch, 0);
    for (std::size_t i = 0; i <= wire::kBatchMaxItems; ++i) wire::append_to_batch(many, wire::encode_request(wire::Type::stats, i));
    auto too_many = wire::split_batch(many.payload);
    REQUIRE_FALSE(too_many);
    CHECK_THAT(too_many.error().message, Catch::Contains("more than"));

    auto bad = sample_run();
    bad.header.version = 99;
    auto with_bad = wire::encode_request(wire::Type::batch, 0);
    wire::append_to_batch(with_bad, wire::encode_request(wire::Type::stats, 1));
    wire::append_to_batch(with_bad, bad);
    auto refused = wire::split_batch(with_bad.payload);
    REQUIRE_FALSE(refused);
    CHECK(refused.error().code == Errc::unsupported_version);
    CHECK_THAT(refused.error().message, Catch::Contains("BATCH message 1"));

    // A message whose header claims more bytes than follow.
    auto overlong = wire::encode_request(wire::Type::batch, 0);
    auto run = sample_run();
    run.header.payload_size += 1;
    wire::append_to_batch(overlong, run);
    auto short_read = wire::split_batch(overlong.payload);
    REQUIRE_FALSE(short_read);
    CHECK_THAT(short_read.error().message, Catch::Contains("follow"));
}

}  // namespace wire_test_cpp
