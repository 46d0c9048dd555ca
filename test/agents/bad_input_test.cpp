// Bad input reaches the agent as a caller would send it: corrupt code through the client, and
// hand-made wire messages through a raw UCX peer. Each gets a clear error naming what was
// wrong, and the agent keeps serving.

#include <catch2/catch.hpp>

#include <condition_variable>
#include <cstring>
#include <fstream>
#include <iterator>
#include <mutex>

#include <bitship/client.hpp>
#include <behaviour_kernels.hpp>

#include "launcher.hpp"
#include "core/engine.hpp"
#include "core/wire.hpp"
#include "raw_peer.hpp"

namespace bad_input_test_cpp {

using namespace bitship;
using bitship::launch::AgentProcess;
using bitship::test::RawPeer;
using namespace std::chrono_literals;

namespace {

Client make_client(const std::string& transport) {
    ClientOptions o;
    o.transport = *parse_transport(transport);
    o.loopback_only = true;
    o.call_timeout = 20s;
    auto c = Client::create(o);
    REQUIRE(c);
    return std::move(*c);
}

std::vector<std::byte> read_bitcode() {
    std::ifstream in(BITSHIP_BEHAVIOUR_BC, std::ios::binary);
    std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    REQUIRE(!chars.empty());
    std::vector<std::byte> out(chars.size());
    std::memcpy(out.data(), chars.data(), chars.size());
    return out;
}

wire::Encoded valid_run(std::uint64_t id) {
    wire::Run r;
    r.hash.fill(1);
    r.entry = "add";
    return wire::encode_run(id, r);
}

void agent_still_serves(const std::string& transport, const AgentProcess& agent) {
    auto client = make_client(transport);
    auto t = client.connect(agent.address());
    REQUIRE(t);
    auto r = client.ship(behaviour_kernels::add, *t, std::uint64_t{3}, std::uint64_t{4}).get_as<std::uint64_t>();
    INFO(agent.log());
    REQUIRE(r);
    CHECK(*r == 7);
}

} // namespace

TEST_CASE("corrupt bitcode is refused as invalid_bitcode", "[integration]") {
    AgentProcess agent("tcp");
    auto client = make_client("tcp");
    auto target = client.connect(agent.address());
    REQUIRE(target);
    auto good = read_bitcode();
    std::vector<std::string> entries{"add"};
    for (int variant = 0; variant < 3; ++variant) {
        auto bad = good;
        if (variant == 0) bad.resize(bad.size() / 2);                                    // truncated
        if (variant == 1) for (std::size_t i = 64; i < bad.size(); i += 7) bad[i] = std::byte{0xa5}; // scribbled
        if (variant == 2) bad.assign(bad.size(), std::byte{0x42});                       // not bitcode at all
        SliceInput slice{target->info().triple, "x86-64", "clang 19.1.7", {19, 1, 7}, bad};
        auto bundle = write_bundle(entries, std::span(&slice, 1));
        auto r = client.ship_slice(bundle, 0, "add", *target, {}).get();
        INFO("variant " << variant);
        REQUIRE_FALSE(r);
        CHECK(r.error().code == Errc::invalid_bitcode);
    }
    agent_still_serves("tcp", agent);
}

TEST_CASE("a slice made by a newer LLVM is refused, naming both versions", "[integration]") {
    AgentProcess agent("tcp");
    auto client = make_client("tcp");
    auto target = client.connect(agent.address());
    REQUIRE(target);
    auto bitcode = read_bitcode();
    std::vector<std::string> entries{"add"};
    SliceInput slice{target->info().triple, "x86-64", "clang 99.0.0", {99, 0, 0}, bitcode};
    auto bundle = write_bundle(entries, std::span(&slice, 1));
    auto r = client.ship_slice(bundle, 0, "add", *target, {}).get();
    REQUIRE_FALSE(r);
    CHECK(r.error().code == Errc::producer_too_new);
    CHECK_THAT(r.error().message, Catch::Contains("99.0.0") && Catch::Contains(to_string(target->info().llvm)));
}

TEST_CASE("hand-made bad messages each get an error naming the problem", "[integration]") {
    auto transport = GENERATE(as<std::string>{}, "tcp", "shm");
    AgentProcess agent(transport, {"--max-message", "65536"});
    RawPeer raw(transport, agent.port());

    SECTION("a payload shorter than its header declares") {
        auto e = valid_run(11);
        e.header.payload_size += 100;
        raw.send(std::move(e));
        auto [code, message] = raw.error_for(11);
        CHECK(code == Errc::malformed_message);
        CHECK_THAT(message, Catch::Contains("truncated"));
    }
    SECTION("a RUN whose argument length runs past the payload") {
        auto e = valid_run(12);
        // The args length field follows hash (32), origin (8), hop budget, hops, self index
        // (2 each), entry (2 + 3).
        std::uint32_t lie = 1u << 30;
        std::memcpy(e.payload.data() + 32 + 8 + 6 + 2 + 3, &lie, sizeof lie);
        raw.send(std::move(e));
        auto [code, message] = raw.error_for(12);
        CHECK(code == Errc::malformed_message);
        CHECK_THAT(message, Catch::Contains("args"));
    }
    SECTION("an oversized message") {
        wire::Run r;
        r.hash.fill(2);
        r.entry = "add";
        std::vector<std::byte> big(100000);
        r.args = big;
        raw.send(wire::encode_run(13, r));
        auto [code, message] = raw.error_for(13);
        CHECK(code == Errc::too_large);
        CHECK_THAT(message, Catch::Contains("65536"));
    }
    SECTION("an unknown message type") {
        auto e = valid_run(14);
        e.header.type = static_cast<wire::Type>(77);
        raw.send(std::move(e));
        auto [code, message] = raw.error_for(14);
        CHECK(code == Errc::unknown_message);
        CHECK_THAT(message, Catch::Contains("77"));
    }
    SECTION("a message type only agents send") {
        raw.send(wire::encode_result(15, {}));
        auto [code, message] = raw.error_for(15);
        CHECK(code == Errc::unknown_message);
        CHECK_THAT(message, Catch::Contains("RESULT"));
    }
    SECTION("a wire version this agent does not speak") {
        auto e = valid_run(16);
        e.header.version = 9;
        raw.send(std::move(e));
        auto [code, message] = raw.error_for(16);
        CHECK(code == Errc::unsupported_version);
    }
    SECTION("a RUN for code the agent lacks, without code, asks for it") {
        raw.send(valid_run(17));
        REQUIRE(raw.wait(wire::Type::need_code, 17));
    }
    agent_still_serves(transport, agent);
}

}  // namespace bad_input_test_cpp
