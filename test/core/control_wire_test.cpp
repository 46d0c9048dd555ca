// The operator's control messages (xctl): encode and decode round trips, and hostile payloads
// refused by code.

#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "core/wire.hpp"

namespace control_wire_test_cpp {

using namespace bitship;

namespace {
wire::KernelStatsReply sample_stats() {
    wire::KernelStatsReply s;
    wire::KernelStat k;
    k.hash.fill(9);
    k.entry = "chase";
    k.calls = 7;
    k.bytes_in = 168;
    k.bytes_out = 96;
    k.runs = 7;
    k.run_p50_ns = 1500;
    k.run_p99_ns = 9000;
    k.compile_ns_first = 4'000'000;
    k.errors = {{static_cast<std::uint32_t>(Errc::kernel_failed), 2}, {static_cast<std::uint32_t>(Errc::too_large), 1}};
    s.kernels.push_back(k);
    wire::ClientStat c;
    c.client = "bitship-client 1234";
    c.calls = 7;
    c.errors = {{static_cast<std::uint32_t>(Errc::kernel_failed), 2}};
    s.clients.push_back(c);
    return s;
}
} // namespace

TEST_CASE("control requests and their replies survive encode and decode", "[unit]") {
    for (auto t : {wire::Type::info, wire::Type::kernel_stats, wire::Type::cache_list, wire::Type::drain}) {
        auto e = wire::encode_request(t, 3);
        auto m = wire::decode(e.header, e.payload);
        REQUIRE(m);
        CHECK(std::holds_alternative<wire::Empty>(m->body));
    }

    wire::Fields f;
    f.fields = {{"triple", "x86_64-pc-linux-gnu"}, {"gpus", "n/a"}};
    auto fe = wire::encode_info_reply(4, f);
    auto fm = wire::decode(fe.header, fe.payload);
    REQUIRE(fm);
    auto got_f = std::get<wire::Fields>(fm->body);
    REQUIRE(got_f.fields.size() == 2);
    CHECK(got_f.fields[1].first == "gpus");
    CHECK(got_f.fields[1].second == "n/a");

    auto se = wire::encode_kernel_stats_reply(5, sample_stats());
    auto sm = wire::decode(se.header, se.payload);
    REQUIRE(sm);
    const auto& s = std::get<wire::KernelStatsReply>(sm->body);
    REQUIRE(s.kernels.size() == 1);
    CHECK(s.kernels[0].entry == "chase");
    CHECK(s.kernels[0].hash[31] == 9);
    CHECK(s.kernels[0].calls == 7);
    CHECK(s.kernels[0].run_p99_ns == 9000);
    CHECK(s.kernels[0].compile_ns_first == 4'000'000);
    CHECK(s.kernels[0].errors == sample_stats().kernels[0].errors);
    REQUIRE(s.clients.size() == 1);
    CHECK(s.clients[0].client == "bitship-client 1234");
    CHECK(s.clients[0].errors.size() == 1);

    wire::CacheList c;
    wire::CacheEntry entry;
    entry.hash.fill(1);
    entry.memory_bytes = 4096;
    entry.in_use = true;
    c.entries.push_back(entry);
    auto ce = wire::encode_cache_list_reply(6, c);
    auto cm = wire::decode(ce.header, ce.payload);
    REQUIRE(cm);
    const auto& list = std::get<wire::CacheList>(cm->body);
    REQUIRE(list.entries.size() == 1);
    CHECK(list.entries[0].memory_bytes == 4096);
    CHECK(list.entries[0].in_use);

    CodeHash h;
    h.fill(0xab);
    auto ee = wire::encode_cache_evict(7, h);
    auto em = wire::decode(ee.header, ee.payload);
    REQUIRE(em);
    CHECK(std::get<wire::CacheEvict>(em->body).hash == h);

    auto ae = wire::encode_ack(8, true, "draining");
    auto am = wire::decode(ae.header, ae.payload);
    REQUIRE(am);
    CHECK(std::get<wire::Ack>(am->body).done);
    CHECK(std::get<wire::Ack>(am->body).note == "draining");
}

TEST_CASE("every truncation of a control reply is refused as malformed", "[unit]") {
    wire::Fields f;
    f.fields = {{"cpu", "znver4"}};
    wire::CacheList c;
    c.entries.resize(2);
    for (auto e : {wire::encode_kernel_stats_reply(1, sample_stats()), wire::encode_info_reply(1, f),
                   wire::encode_cache_list_reply(1, c), wire::encode_ack(1, false, "no"), wire::encode_cache_evict(1, {})}) {
        INFO(wire::to_string(e.header.type));
        for (std::size_t cut = 0; cut < e.payload.size(); ++cut) {
            auto h = e.header;
            h.payload_size = static_cast<std::uint32_t>(cut);
            auto m = wire::decode(h, std::span(e.payload).first(cut));
            REQUIRE_FALSE(m);
            CHECK(m.error().code == Errc::malformed_message);
        }
        // One byte too many is refused too.
        auto padded = e.payload;
        padded.push_back(std::byte{0});
        auto m = wire::decode(e.header, padded);
        REQUIRE_FALSE(m);
        CHECK(m.error().code == Errc::malformed_message);
    }
}

TEST_CASE("control replies claiming more elements than bytes are refused before allocating", "[unit]") {
    for (auto t : {wire::Type::kernel_stats_reply, wire::Type::info_reply, wire::Type::cache_list_reply}) {
        wire::Header h;
        h.type = t;
        std::vector<std::byte> payload(4, std::byte{0xff}); // count 0xffffffff, nothing after it
        auto m = wire::decode(h, payload);
        INFO(wire::to_string(t));
        REQUIRE_FALSE(m);
        CHECK(m.error().code == Errc::malformed_message);
    }
}

TEST_CASE("an ACK or cache entry flag other than 0 or 1 is refused", "[unit]") {
    auto a = wire::encode_ack(1, true, "x");
    a.payload[0] = std::byte{2};
    auto m = wire::decode(a.header, a.payload);
    REQUIRE_FALSE(m);
    CHECK(m.error().code == Errc::malformed_message);
}

TEST_CASE("a message type past this build's last is unknown_message", "[unit]") {
    wire::Header h;
    h.type = static_cast<wire::Type>(static_cast<unsigned>(wire::kLastType) + 1);
    auto m = wire::decode(h, {});
    REQUIRE_FALSE(m);
    CHECK(m.error().code == Errc::unknown_message);
}

TEST_CASE("the wire fuzz corpus seeds of the control messages decode", "[unit]") {
    unsigned seeds = 0;
    for (const auto& f : std::filesystem::directory_iterator(BITSHIP_WIRE_CORPUS)) {
        if (f.path().filename().string().rfind("seed_", 0) != 0) continue;
        std::ifstream in(f.path(), std::ios::binary);
        std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        INFO(f.path().string());
        REQUIRE(chars.size() >= sizeof(wire::Header));
        auto bytes = std::as_bytes(std::span(chars));
        auto payload = bytes.subspan(sizeof(wire::Header));
        auto h = wire::decode_header(bytes.first(sizeof(wire::Header)), payload.size());
        REQUIRE(h);
        CHECK(wire::decode(*h, payload));
        ++seeds;
    }
    CHECK(seeds >= 6);
}

}  // namespace control_wire_test_cpp
