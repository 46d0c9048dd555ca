// The wire's trust fields: WELCOME's access mode and challenge, AUTH, and the code signatures a
// RUN carries with its code.
#include <catch2/catch.hpp>

#include <cstring>
#include <fstream>
#include <iterator>

#include "core/wire.hpp"
#include "wire_checks.hpp"

namespace auth_wire_test_cpp {

using namespace bitship;
using bitship::test::as_bytes;

namespace {

wire::Welcome keyed_welcome() {
    wire::Welcome w;
    w.agent = "127.0.0.1:7000";
    w.triple = "x86_64-pc-linux-gnu";
    w.cpu = "znver4";
    w.llvm = {19, 1, 7};
    w.instance = 99;
    w.caps.pus = 4;
    w.access = AgentAccess::keys;
    for (std::size_t i = 0; i < w.challenge.size(); ++i) w.challenge[i] = static_cast<std::uint8_t>(200 + i);
    return w;
}

wire::CodeSignature signature(std::uint8_t seed) {
    wire::CodeSignature s;
    s.hash.fill(seed);
    s.signer.fill(static_cast<std::uint8_t>(seed + 1));
    s.signature.fill(static_cast<std::uint8_t>(seed + 2));
    return s;
}

wire::Encoded signed_run(std::size_t signatures) {
    wire::Run r;
    r.hash.fill(1);
    r.entry = "add";
    static const std::string args = "0123456789abcdef", code = "pretend-bundle";
    r.args = as_bytes(args);
    r.code = as_bytes(code);
    r.peers = {"127.0.0.1:7000"};
    for (std::size_t i = 0; i < signatures; ++i) r.signatures.push_back(signature(static_cast<std::uint8_t>(10 * i)));
    return wire::encode_run(3, r);
}

} // namespace

TEST_CASE("WELCOME carries the access mode and the connection's challenge after the capabilities", "[unit]") {
    auto e = wire::encode_welcome(keyed_welcome());
    auto m = wire::decode(e.header, e.payload);
    REQUIRE(m);
    const auto& w = std::get<wire::Welcome>(m->body);
    CHECK(w.access == AgentAccess::keys);
    CHECK(w.challenge == keyed_welcome().challenge);
    CHECK(w.caps.pus == 4);
    CHECK(w.instance == 99);
    CHECK(w.sandbox == SandboxMode::none);
}

TEST_CASE("WELCOME carries the sandbox mode last, and an agent from before it reads as none", "[unit]") {
    auto w = keyed_welcome();
    w.sandbox = SandboxMode::sfi;
    auto e = wire::encode_welcome(w);
    auto m = wire::decode(e.header, e.payload);
    REQUIRE(m);
    CHECK(std::get<wire::Welcome>(m->body).sandbox == SandboxMode::sfi);
    CHECK(std::get<wire::Welcome>(m->body).access == AgentAccess::keys);

    e.payload.back() = std::byte{9};
    auto unknown = wire::decode(e.header, e.payload);
    REQUIRE_FALSE(unknown);
    CHECK(unknown.error().code == Errc::malformed_message);
    CHECK_THAT(unknown.error().message, Catch::Contains("sandbox mode 9"));

    // Without the sandbox byte: the access mode and challenge still read, the sandbox is none.
    auto caps_size = wire::encode_capabilities(w.caps).size();
    auto payload = wire::encode_welcome(w).payload;
    payload.resize(payload.size() - 1);
    std::uint32_t block = static_cast<std::uint32_t>(caps_size + 33);
    std::memcpy(payload.data() + payload.size() - (caps_size + 33) - 4, &block, 4);
    e.header.payload_size = static_cast<std::uint32_t>(payload.size());
    auto older = wire::decode(e.header, payload);
    REQUIRE(older);
    CHECK(std::get<wire::Welcome>(older->body).sandbox == SandboxMode::none);
    CHECK(std::get<wire::Welcome>(older->body).access == AgentAccess::keys);
}

TEST_CASE("a WELCOME without session fields (an older agent) reads as open access", "[unit]") {
    auto w = keyed_welcome();
    auto e = wire::encode_welcome(w);
    // Cut the 34 session bytes off the end of the block, and shorten its length prefix.
    auto caps_size = wire::encode_capabilities(w.caps).size();
    auto payload = e.payload;
    payload.resize(payload.size() - 34);
    std::uint32_t block = static_cast<std::uint32_t>(caps_size);
    std::memcpy(payload.data() + payload.size() - caps_size - 4, &block, 4);
    e.header.payload_size = static_cast<std::uint32_t>(payload.size());
    auto m = wire::decode(e.header, payload);
    REQUIRE(m);
    CHECK(std::get<wire::Welcome>(m->body).access == AgentAccess::open);
    CHECK(std::get<wire::Welcome>(m->body).challenge == std::array<std::uint8_t, 32>{});
}

TEST_CASE("WELCOME session fields cut short or naming an unknown access mode are refused", "[unit]") {
    auto w = keyed_welcome();
    auto caps_size = wire::encode_capabilities(w.caps).size();
    // Cutting 1 leaves a whole pre-sandbox block (above); 34 leaves none (an older agent).
    for (std::size_t cut = 2; cut < 34; ++cut) {
        auto e = wire::encode_welcome(w);
        auto payload = e.payload;
        payload.resize(payload.size() - cut);
        std::uint32_t block = static_cast<std::uint32_t>(caps_size + 34 - cut);
        std::memcpy(payload.data() + payload.size() - (caps_size + 34 - cut) - 4, &block, 4);
        e.header.payload_size = static_cast<std::uint32_t>(payload.size());
        auto m = wire::decode(e.header, payload);
        INFO("cut " << cut);
        REQUIRE_FALSE(m);
        CHECK(m.error().code == Errc::malformed_message);
    }
    auto e = wire::encode_welcome(w);
    e.payload[e.payload.size() - 34] = std::byte{7}; // the access byte
    auto m = wire::decode(e.header, e.payload);
    REQUIRE_FALSE(m);
    CHECK_THAT(m.error().message, Catch::Contains("access mode 7"));
}

TEST_CASE("AUTH round trips its key and signature, and any truncation is refused", "[unit]") {
    wire::Auth a;
    a.key.fill(5);
    a.signature.fill(6);
    auto e = wire::encode_auth(17, a);
    CHECK(e.payload.size() == 96);
    auto m = wire::decode(e.header, e.payload);
    REQUIRE(m);
    CHECK(m->header.request_id == 17);
    CHECK(std::get<wire::Auth>(m->body).key == a.key);
    CHECK(std::get<wire::Auth>(m->body).signature == a.signature);
    for (std::size_t n = 0; n < e.payload.size(); ++n) {
        auto h = e.header;
        h.payload_size = static_cast<std::uint32_t>(n);
        auto cut = wire::decode(h, std::span(e.payload).first(n));
        REQUIRE_FALSE(cut);
        CHECK(cut.error().code == Errc::malformed_message);
    }
    CHECK(wire::to_string(wire::Type::auth) == "AUTH");
}

TEST_CASE("a RUN carries its code's signatures, and one without them decodes with none", "[unit]") {
    for (std::size_t n : {0u, 1u, 3u}) {
        auto e = signed_run(n);
        auto m = wire::decode(e.header, e.payload);
        REQUIRE(m);
        const auto& r = std::get<wire::Run>(m->body);
        REQUIRE(r.signatures.size() == n);
        for (std::size_t i = 0; i < n; ++i) CHECK(r.signatures[i] == signature(static_cast<std::uint8_t>(10 * i)));
        CHECK(r.entry == "add");
    }
}

TEST_CASE("a RUN's signature list cut short or claiming more than its bytes is refused", "[unit]") {
    auto unsigned_size = signed_run(0).payload.size();
    auto e = signed_run(2);
    // Every cut inside the list is refused; a cut right after the peers is a RUN with none.
    for (std::size_t n = unsigned_size + 1; n < e.payload.size(); ++n) {
        auto h = e.header;
        h.payload_size = static_cast<std::uint32_t>(n);
        auto cut = wire::decode(h, std::span(e.payload).first(n));
        INFO("cut at " << n);
        REQUIRE_FALSE(cut);
        CHECK(cut.error().code == Errc::malformed_message);
    }
    auto claims = e.payload;
    std::uint16_t many = 0xffff;
    std::memcpy(claims.data() + unsigned_size, &many, 2);
    auto m = wire::decode(e.header, claims);
    REQUIRE_FALSE(m);
    CHECK_THAT(m.error().message, Catch::Contains("signatures"));
}

TEST_CASE("the wire fuzz corpus seeds of the trust messages decode", "[unit]") {
    for (const char* name : {"seed_auth", "seed_welcome_keys", "seed_run_signed"}) {
        INFO(name);
        std::ifstream in(std::string(BITSHIP_WIRE_CORPUS) + "/" + name, std::ios::binary);
        std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        REQUIRE(chars.size() >= sizeof(wire::Header));
        auto bytes = std::as_bytes(std::span(chars));
        auto payload = bytes.subspan(sizeof(wire::Header));
        auto h = wire::decode_header(bytes.first(sizeof(wire::Header)), payload.size());
        REQUIRE(h);
        auto m = wire::decode(*h, payload);
        REQUIRE(m);
    }
}

}  // namespace auth_wire_test_cpp
