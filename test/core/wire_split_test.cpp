#include <catch2/catch.hpp>

#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "core/wire.hpp"
#include "core/wire_split.hpp"
#include "wire_checks.hpp"

namespace wire_split_test_cpp {

using namespace bitship;
using bitship::test::as_bytes;

namespace {

wire::Run sample_run(std::span<const std::byte> args) {
    wire::Run r;
    r.hash.fill(3);
    r.origin = 9;
    r.entry = "xor_bytes";
    static const std::string reply_to = "worker-address";
    r.reply_to = as_bytes(reply_to);
    r.peers = {"127.0.0.1:7000"};
    r.args = args;
    return r;
}

std::vector<std::byte> pattern(std::size_t n) {
    std::vector<std::byte> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = std::byte(i * 7 + 1);
    return v;
}

// What the engine sends for split message `e`: its AM header and its AM data.
struct OnTheWire {
    std::vector<std::byte> am;
    std::span<const std::byte> data;
};
OnTheWire sent(const wire::Encoded& e) {
    OnTheWire w;
    wire::write_split_header(e, w.am);
    w.data = e.borrowed;
    return w;
}

// The payload the receiver lays out from what arrived.
std::vector<std::byte> received(const wire::AmHeader& h, std::span<const std::byte> data) {
    std::vector<std::byte> out(h.prefix.begin(), h.prefix.end());
    out.insert(out.end(), data.begin(), data.end());
    out.insert(out.end(), h.suffix.begin(), h.suffix.end());
    return out;
}

void put_u32(std::vector<std::byte>& v, std::size_t at, std::uint32_t x) { std::memcpy(v.data() + at, &x, sizeof x); }

} // namespace

TEST_CASE("a RUN with borrowed arguments arrives as the same bytes as one that copies them", "[unit]") {
    const auto args = pattern(100000);
    const auto run = sample_run(args);
    auto owner = std::make_shared<int>(1);
    auto split = wire::encode_run_borrowing_args(42, run, owner);
    const auto whole = wire::encode_run(42, run);
    REQUIRE(split.split());
    CHECK(split.borrowed.data() == args.data()); // not copied
    CHECK(split.payload.size() + args.size() == whole.payload.size());
    CHECK(owner.use_count() == 2); // the message holds what keeps the arguments
    CHECK(std::memcmp(&split.header, &whole.header, sizeof(wire::Header)) == 0);

    auto w = sent(split);
    auto h = wire::decode_am_header(w.am, w.data.size());
    REQUIRE(h);
    CHECK(h->header.type == wire::Type::run);
    CHECK(h->header.request_id == 42);
    CHECK(received(*h, w.data) == whole.payload);

    // Decoded, the arguments are where an unsplit RUN has them (16-byte aligned) and intact.
    const auto payload = received(*h, w.data);
    auto m = wire::decode(h->header, payload);
    REQUIRE(m);
    const auto& r = std::get<wire::Run>(m->body);
    CHECK(r.entry == "xor_bytes");
    CHECK(std::vector<std::byte>(r.args.begin(), r.args.end()) == args);
    CHECK((r.args.data() - payload.data()) % wire::kArgsAlignment == 0);

    wire::join_split(split);
    CHECK_FALSE(split.split());
    CHECK(split.payload == whole.payload);
    CHECK(owner.use_count() == 1);
}

TEST_CASE("a RUN whose arguments landed apart from its fields decodes with them where they landed", "[unit]") {
    const auto args = pattern(100000);
    const auto run = sample_run(args);
    auto split = wire::encode_run_borrowing_args(42, run, nullptr);
    auto w = sent(split);
    auto h = wire::decode_am_header(w.am, w.data.size());
    REQUIRE(h);
    // What the engine hands on when the arguments land elsewhere: the fields before and after them.
    std::vector<std::byte> fields(h->prefix.begin(), h->prefix.end());
    fields.insert(fields.end(), h->suffix.begin(), h->suffix.end());
    const std::vector<std::byte> landed(w.data.begin(), w.data.end());
    wire::OutsideArgs outside{landed, h->prefix.size()};
    wire::Run got;
    REQUIRE(wire::decode_run(h->header, fields, got, &outside));
    CHECK(got.args.data() == landed.data()); // read where they landed, not copied
    CHECK(got.args.size() == args.size());
    CHECK(got.entry == "xor_bytes");
    CHECK(got.origin == 9);
    CHECK(got.hash == run.hash);
    REQUIRE(got.peers.size() == 1);
    CHECK(got.peers[0] == "127.0.0.1:7000");

    SECTION("arguments said to lie elsewhere, or of another size, are refused by name") {
        for (auto bad : {wire::OutsideArgs{landed, outside.at + 16}, wire::OutsideArgs{landed, outside.at - 16},
                         wire::OutsideArgs{std::span(landed).first(landed.size() - 1), outside.at}}) {
            wire::Run r;
            auto refused = wire::decode_run(h->header, fields, r, &bad);
            REQUIRE_FALSE(refused);
            CHECK(refused.error().code == Errc::malformed_message);
            CHECK_THAT(refused.error().message, Catch::Contains("bytes of arguments"));
        }
    }
    SECTION("the fields alone, read as a whole payload, are refused") {
        wire::Run r;
        CHECK_FALSE(wire::decode_run(h->header, fields, r));
    }
}

TEST_CASE("a RUN with no arguments to borrow is an ordinary message", "[unit]") {
    const auto run = sample_run({});
    auto e = wire::encode_run_borrowing_args(1, run, std::make_shared<int>(0));
    CHECK_FALSE(e.split());
    CHECK(e.payload == wire::encode_run(1, run).payload);
}

TEST_CASE("a plain 24-byte AM header still reads as before", "[unit]") {
    auto e = wire::encode_result(5, std::vector<std::byte>(10));
    auto h = wire::decode_am_header(std::as_bytes(std::span(&e.header, 1)), 10);
    REQUIRE(h);
    CHECK(h->prefix.empty());
    CHECK(h->suffix.empty());
    CHECK_FALSE(wire::decode_am_header(std::as_bytes(std::span(&e.header, 1)), 11));
}

TEST_CASE("split AM headers whose lengths disagree with what arrived are refused by name", "[unit]") {
    const auto args = pattern(5000);
    auto e = wire::encode_run_borrowing_args(7, sample_run(args), nullptr);
    auto w = sent(e);
    REQUIRE(wire::decode_am_header(w.am, args.size()));

    auto refused = [](std::span<const std::byte> am, std::size_t data) {
        auto h = wire::decode_am_header(am, data);
        REQUIRE_FALSE(h);
        CHECK(h.error().code == Errc::malformed_message);
        return h.error().message;
    };
    // The data comes a byte short or long: the header's payload_size no longer adds up.
    CHECK_THAT(refused(w.am, args.size() - 1), Catch::Contains("payload bytes"));
    CHECK_THAT(refused(w.am, args.size() + 1), Catch::Contains("payload bytes"));
    // Prefix and suffix lengths that claim more or fewer bytes than the header carries.
    auto longer = w.am;
    put_u32(longer, sizeof(wire::Header), static_cast<std::uint32_t>(e.split_at + 1));
    CHECK_THAT(refused(longer, args.size()), Catch::Contains("around its data"));
    auto huge = w.am;
    put_u32(huge, sizeof(wire::Header) + 4, 0xffffffffu);
    CHECK_THAT(refused(huge, args.size()), Catch::Contains("around its data"));
    // Every cut of the AM header, down to nothing: refused, never read past.
    for (std::size_t n = 0; n < w.am.size(); ++n)
        if (n != sizeof(wire::Header)) CHECK_FALSE(wire::decode_am_header(std::span(w.am).first(n), args.size()));
    // A BATCH's items are whole messages: a split BATCH is refused.
    auto batch = w.am;
    wire::Header h;
    std::memcpy(&h, batch.data(), sizeof h);
    h.type = wire::Type::batch;
    std::memcpy(batch.data(), &h, sizeof h);
    CHECK_THAT(refused(batch, args.size()), Catch::Contains("BATCH"));
}

TEST_CASE("the fuzz corpus' split seed is a split RUN whose parts make a RUN that decodes", "[unit]") {
    // fuzz_wire_decode reads each input as a split AM header too, with data of 97 × its last
    // byte (0 here): this seed starts it inside a valid one.
    std::ifstream in(BITSHIP_WIRE_CORPUS "/run_split.bin", std::ios::binary);
    std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    REQUIRE(chars.size() > wire::kSplitFrameBytes);
    REQUIRE(chars.back() == 0);
    auto h = wire::decode_am_header(std::as_bytes(std::span(chars)), 0);
    REQUIRE(h);
    CHECK_FALSE(h->prefix.empty());
    CHECK_FALSE(h->suffix.empty());
    std::vector<std::byte> payload(h->prefix.begin(), h->prefix.end());
    payload.insert(payload.end(), h->suffix.begin(), h->suffix.end());
    auto m = wire::decode(h->header, payload);
    INFO((m ? std::string() : m.error().message));
    REQUIRE(m);
    CHECK(m->header.type == wire::Type::run);
}

} // namespace wire_split_test_cpp
