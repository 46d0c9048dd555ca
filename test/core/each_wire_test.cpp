// Groups of calls on the wire (RUN's kFlagEach, a group's answers in its RESULT): what decodes,
// what is refused, and that the fuzz seeds are real groups.

#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "core/wire.hpp"
#include "wire_checks.hpp"

namespace each_wire_test_cpp {

using namespace bitship;

namespace {

wire::Run group_run(std::uint32_t count, std::uint32_t size, std::vector<std::byte>& args) {
    args.assign(count * wire::each_stride(size), std::byte{0});
    for (std::uint32_t i = 0; i < count && size > 0; ++i)
        std::memset(args.data() + i * wire::each_stride(size), static_cast<int>(i + 1), size);
    wire::Run r;
    r.hash[0] = 7;
    r.origin = 9;
    r.entry = "echo";
    r.args = args;
    r.each = wire::Each{count, size};
    return r;
}

Result<wire::Message> round_trip(const wire::Encoded& e) { return wire::decode(e.header, e.payload); }

std::vector<std::byte> read_seed(const char* name) {
    std::ifstream in(std::filesystem::path(BITSHIP_WIRE_CORPUS) / name, std::ios::binary);
    std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    auto bytes = std::as_bytes(std::span(chars));
    return {bytes.begin(), bytes.end()};
}

} // namespace

TEST_CASE("a group RUN carries its count and argument size, and its sets at a stride", "[unit]") {
    CHECK(wire::each_stride(0) == 0);
    CHECK(wire::each_stride(8) == 16);
    CHECK(wire::each_stride(16) == 16);
    CHECK(wire::each_stride(24) == 32);
    for (std::uint32_t size : {0u, 8u, 24u}) {
        INFO(size);
        std::vector<std::byte> args;
        auto e = wire::encode_run(3, group_run(5, size, args));
        CHECK(e.header.flags == wire::kFlagEach);
        auto m = round_trip(e);
        REQUIRE(m);
        const auto& r = std::get<wire::Run>(m->body);
        REQUIRE(r.each);
        CHECK(*r.each == wire::Each{5, size});
        CHECK(r.args.size() == 5 * wire::each_stride(size));
        CHECK(std::equal(r.args.begin(), r.args.end(), args.begin(), args.end()));
        bitship::test::every_truncation_refused(e);
    }
}

TEST_CASE("a group RUN is refused when its count, arguments or flags do not hold together", "[unit]") {
    std::vector<std::byte> args;
    auto refused = [](const wire::Encoded& e, const char* says) {
        auto m = round_trip(e);
        REQUIRE_FALSE(m);
        CHECK(m.error().code == Errc::malformed_message);
        CHECK_THAT(m.error().message, Catch::Contains(says));
    };
    SECTION("no calls, or more than kMaxEachCalls") {
        auto r = group_run(1, 8, args);
        r.each->count = 0;
        r.args = {};
        refused(wire::encode_run(1, r), "group of 0 calls");
        r.each->count = wire::kMaxEachCalls + 1;
        refused(wire::encode_run(1, r), "group of 65537 calls");
    }
    SECTION("arguments that are not count sets at the stride") {
        auto r = group_run(4, 8, args);
        r.args = std::span<const std::byte>(args).first(3 * 16);
        refused(wire::encode_run(1, r), "which take 64 bytes, not 48");
        r.args = std::span<const std::byte>(args).first(4 * 8); // unpadded
        refused(wire::encode_run(1, r), "not 32");
    }
    SECTION("with a GPU launch or a bulk window") {
        auto r = group_run(2, 8, args);
        r.gpu = wire::GpuLaunch{};
        refused(wire::encode_run(1, r), "no bulk window and runs on no GPU");
        r.gpu.reset();
        r.window = wire::WindowUse{0, 0, 0, 64};
        refused(wire::encode_run(1, r), "no bulk window and runs on no GPU");
    }
    SECTION("with peers, a reply-to or hops: its calls cannot forward") {
        auto r = group_run(2, 8, args);
        r.peers = {"127.0.0.1:1"};
        refused(wire::encode_run(1, r), "cannot forward");
        r.peers.clear();
        const std::byte address[4]{};
        r.reply_to = address;
        refused(wire::encode_run(1, r), "cannot forward");
        r.reply_to = {};
        r.hops = 1;
        refused(wire::encode_run(1, r), "cannot forward");
    }
    SECTION("an unknown flag beside it") {
        auto e = wire::encode_run(1, group_run(2, 8, args));
        e.header.flags |= 1u << 3;
        refused(e, "unknown flags");
    }
}

TEST_CASE("a group's answers index back to each call's result or error", "[unit]") {
    wire::EachResultsWriter w(4, 64);
    const std::uint64_t v = 0x1122334455667788;
    w.result(std::as_bytes(std::span(&v, 1)));
    w.error(Errc::kernel_failed, 42, "kernel 'x' failed with code 42: no");
    w.result({});
    w.error(Errc::kernel_crashed, 0, "");
    auto bytes = std::move(w).take();
    auto at = wire::index_each_results(bytes, 4);
    REQUIRE(at);
    REQUIRE(at->size() == 4);
    auto a0 = wire::read_each_answer(bytes, (*at)[0]);
    CHECK_FALSE(a0.error);
    REQUIRE(a0.bytes.size() == 8);
    std::uint64_t got;
    std::memcpy(&got, a0.bytes.data(), 8);
    CHECK(got == v);
    auto a1 = wire::read_each_answer(bytes, (*at)[1]);
    REQUIRE(a1.error);
    CHECK(a1.error->code == Errc::kernel_failed);
    CHECK(a1.error->kernel_code == 42);
    CHECK(a1.error->message == "kernel 'x' failed with code 42: no");
    CHECK(wire::read_each_answer(bytes, (*at)[2]).bytes.empty());
    CHECK(wire::read_each_answer(bytes, (*at)[3]).error->code == Errc::kernel_crashed);

    SECTION("another count than the group's is refused") {
        auto wrong = wire::index_each_results(bytes, 5);
        REQUIRE_FALSE(wrong);
        CHECK_THAT(wrong.error().message, Catch::Contains("answers 4 calls; the group had 5"));
    }
    SECTION("every cut short of the end is refused") {
        for (std::size_t n = 0; n < bytes.size(); ++n) {
            INFO(n);
            auto cut = wire::index_each_results(std::span<const std::byte>(bytes).first(n), 4);
            REQUIRE_FALSE(cut);
            CHECK(cut.error().code == Errc::malformed_message);
        }
    }
    SECTION("bytes after the last answer, or an unknown outcome, are refused") {
        auto longer = bytes;
        longer.push_back(std::byte{0});
        auto extra = wire::index_each_results(longer, 4);
        REQUIRE_FALSE(extra);
        CHECK_THAT(extra.error().message, Catch::Contains("1 bytes after its 4 answers"));
        auto odd = bytes;
        odd[4] = std::byte{9}; // call 0's outcome
        auto unknown = wire::index_each_results(odd, 4);
        REQUIRE_FALSE(unknown);
        CHECK_THAT(unknown.error().message, Catch::Contains("unknown outcome 9 for call 0"));
    }
    SECTION("a count the bytes cannot hold is refused before anything is reserved") {
        std::vector<std::byte> huge(4);
        const std::uint32_t n = 0xffffffffu;
        std::memcpy(huge.data(), &n, 4);
        CHECK_FALSE(wire::index_each_results(huge, n));
    }
}

TEST_CASE("the fuzz seeds of a group RUN and a group's RESULT are what they say", "[unit]") {
    auto run = read_seed("seed_run_each");
    REQUIRE(run.size() > sizeof(wire::Header));
    auto payload = std::span<const std::byte>(run).subspan(sizeof(wire::Header));
    auto h = wire::decode_header(std::span<const std::byte>(run).first(sizeof(wire::Header)), payload.size());
    REQUIRE(h);
    auto m = wire::decode(*h, payload);
    REQUIRE(m);
    REQUIRE(std::get<wire::Run>(m->body).each);
    CHECK(std::get<wire::Run>(m->body).each->count == 3);

    auto result = read_seed("seed_result_each");
    REQUIRE(result.size() > sizeof(wire::Header));
    auto answers = wire::index_each_results(std::span<const std::byte>(result).subspan(sizeof(wire::Header)), 3);
    REQUIRE(answers);
    CHECK(answers->size() == 3);
}

}  // namespace each_wire_test_cpp
