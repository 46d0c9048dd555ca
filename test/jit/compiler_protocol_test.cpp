// The agent ⇄ bitship-compiler protocol, and a Jit whose compiles run in real compiler
// processes. The agent-side integration tests (crashes, limits, seccomp) are in
// test/agents/compiler_process_test.cpp.

#include <catch2/catch.hpp>

#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cstring>
#include <limits>
#include <string_view>

#include "compiler_protocol.hpp"
#include "ptx_compile.hpp"
#include "test_runtime.hpp"

namespace compiler_protocol_test_cpp {

using namespace bitship;
namespace proto = bitship::jit::compiler_protocol;
using namespace std::chrono_literals;

namespace {

struct SocketPair {
    int fd[2] = {-1, -1};
    SocketPair() { REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fd) == 0); }
    ~SocketPair() {
        ::close(fd[0]);
        ::close(fd[1]);
    }
};

proto::CompileReply sample_reply() {
    proto::CompileReply r;
    r.id = 7;
    r.made.entries = {"add", "sub"};
    r.made.left_out = {"mul"};
    r.made.object = {std::byte{0x7f}, std::byte{'E'}, std::byte{'L'}, std::byte{'F'}};
    r.made.stats.verify_ms = 0.5;
    r.made.stats.codegen_ms = 1.25;
    r.made.stats.tier = 1;
    return r;
}

/// Where COMPILED's entry count starts: after the type, the id, four stage times and the tier.
constexpr std::size_t kEntryCountAt = 1 + 8 + 4 * 8 + 1;
/// Where COMPILE's target and sm are: after the type, the id and the tier.
constexpr std::size_t kTargetAt = 1 + 8 + 1;
constexpr std::size_t kSmAt = kTargetAt + 1;

proto::CompileRequest ptx_request(std::span<const std::byte> bundle, const CodeHash& hash) {
    proto::CompileRequest r{43, jit::Tier::optimised, hash, bundle, {}};
    r.target = proto::Target::ptx;
    r.sm = 86;
    return r;
}

proto::PtxReply sample_ptx_reply() {
    proto::PtxReply r;
    r.id = 8;
    r.made.ptx = "//\n.version 8.5\n.target sm_86\n";
    r.made.slice_bundle = {std::byte{1}, std::byte{2}};
    r.made.stats.verify_ms = 0.25;
    r.made.stats.codegen_ms = 30.5;
    return r;
}

/// `what` refused as malformed_message, its message naming `field`.
template <class T> void refused_naming(const Result<T>& what, std::string_view field) {
    REQUIRE_FALSE(what);
    CHECK(what.error().code == Errc::malformed_message);
    CHECK_THAT(what.error().message, Catch::Contains(std::string(field)));
}

} // namespace

TEST_CASE("every compiler protocol message decodes to what was encoded", "[unit]") {
    CHECK(proto::kVersion == 5);
    const std::vector<std::byte> libdevice(1000, std::byte{0xbc});
    auto hello = proto::decode_hello(
        proto::encode(proto::Hello{proto::kVersion, 3, jit::Sandbox::sfi, {"memcpy", "bs_args"}, libdevice}));
    REQUIRE(hello);
    CHECK(hello->opt_level == 3);
    CHECK(hello->sandbox == jit::Sandbox::sfi);
    CHECK(hello->allowed == std::vector<std::string>{"memcpy", "bs_args"});
    CHECK(hello->libdevice == libdevice);
    auto no_libdevice = proto::decode_hello(proto::encode(proto::Hello{proto::kVersion, 2, jit::Sandbox::none, {}, {}}));
    REQUIRE(no_libdevice);
    CHECK(no_libdevice->libdevice.empty());

    CodeHash h{};
    h.fill(0xab);
    const std::vector<std::byte> bundle(100, std::byte{1});
    auto request_bytes = proto::encode(proto::CompileRequest{42, jit::Tier::optimised, h, bundle, "add"});
    auto request = proto::decode_compile(request_bytes);
    REQUIRE(request);
    CHECK(request->id == 42);
    CHECK(request->only == "add");
    CHECK(request->tier == jit::Tier::optimised);
    CHECK(request->expected == h);
    CHECK(std::equal(request->bundle.begin(), request->bundle.end(), bundle.begin(), bundle.end()));
    CHECK(request->target == proto::Target::object);
    CHECK(request->sm == 0);

    const auto ptx_bytes = proto::encode(ptx_request(bundle, h)); // the decoded request views into it
    auto ptx = proto::decode_compile(ptx_bytes);
    REQUIRE(ptx);
    CHECK(ptx->id == 43);
    CHECK(ptx->target == proto::Target::ptx);
    CHECK(ptx->sm == 86);
    CHECK(ptx->tier == jit::Tier::optimised);
    CHECK(ptx->only.empty());
    CHECK(ptx->expected == h);
    CHECK(std::equal(ptx->bundle.begin(), ptx->bundle.end(), bundle.begin(), bundle.end()));

    const auto ptx_reply_bytes = proto::encode(sample_ptx_reply());
    auto ptx_reply = proto::decode_compiled_ptx(ptx_reply_bytes);
    REQUIRE(ptx_reply);
    CHECK(ptx_reply->id == 8);
    CHECK(ptx_reply->made.ptx == sample_ptx_reply().made.ptx);
    CHECK(ptx_reply->made.slice_bundle.size() == 2);
    CHECK(ptx_reply->made.stats.verify_ms == 0.25);
    CHECK(ptx_reply->made.stats.codegen_ms == 30.5);
    CHECK(proto::type_of(proto::encode(sample_ptx_reply())) == proto::Type::compiled_ptx);

    auto reply = proto::decode_compiled(proto::encode(sample_reply()));
    REQUIRE(reply);
    CHECK(reply->id == 7);
    CHECK(reply->made.entries == std::vector<std::string>{"add", "sub"});
    CHECK(reply->made.left_out == std::vector<std::string>{"mul"});
    CHECK(reply->made.object.size() == 4);
    CHECK(reply->made.stats.codegen_ms == 1.25);
    CHECK(reply->made.stats.tier == 1);

    auto failed = proto::decode_failed(proto::encode(proto::CompileFailure{9, {Errc::invalid_bitcode, "bad"}, true}));
    REQUIRE(failed);
    CHECK(failed->error.code == Errc::invalid_bitcode);
    CHECK(failed->fatal);
}

TEST_CASE("a hostile compiler reply is refused as malformed, whatever part of it lies", "[unit]") {
    auto good = proto::encode(sample_reply());
    SECTION("cut short anywhere") {
        for (std::size_t n = 0; n < good.size(); ++n) {
            INFO(n);
            auto r = proto::decode_compiled(std::span(good.data(), n));
            REQUIRE_FALSE(r);
            CHECK(r.error().code == Errc::malformed_message);
        }
    }
    SECTION("an entry count the payload cannot hold (refused before anything is reserved)") {
        auto bad = good;
        const std::uint32_t huge = 0xffffffffu;
        std::memcpy(bad.data() + kEntryCountAt, &huge, sizeof huge);
        auto r = proto::decode_compiled(bad);
        REQUIRE_FALSE(r);
        CHECK(r.error().code == Errc::malformed_message);
    }
    SECTION("a left-out count the payload cannot hold") {
        auto bad = good;
        const std::uint32_t huge = 0xffffffffu;
        // After the entry count and the two entries ("add", "sub": 2 + 3 bytes each).
        std::memcpy(bad.data() + kEntryCountAt + 4 + 2 * (2 + 3), &huge, sizeof huge);
        auto r = proto::decode_compiled(bad);
        REQUIRE_FALSE(r);
        CHECK(r.error().code == Errc::malformed_message);
    }
    SECTION("an empty left-out name") {
        auto reply = sample_reply();
        reply.made.left_out = {""};
        CHECK_FALSE(proto::decode_compiled(proto::encode(reply)));
    }
    SECTION("a stage time that is not a finite, sane number") {
        auto bad = good;
        const double nan = std::numeric_limits<double>::quiet_NaN();
        std::memcpy(bad.data() + 1 + 8, &nan, sizeof nan);
        CHECK_FALSE(proto::decode_compiled(bad));
    }
    SECTION("a tier this build does not know") {
        auto bad = good;
        bad[kEntryCountAt - 1] = std::byte{2};
        auto r = proto::decode_compiled(bad);
        REQUIRE_FALSE(r);
        CHECK(r.error().message.find("tier") != std::string::npos);
    }
    SECTION("trailing bytes") {
        auto bad = good;
        bad.push_back(std::byte{0});
        CHECK_FALSE(proto::decode_compiled(bad));
    }
    SECTION("a failure code this build does not know becomes compile_failed") {
        auto bytes = proto::encode(proto::CompileFailure{1, {Errc::invalid_bitcode, "x"}, false});
        const std::uint32_t unknown = 9999;
        std::memcpy(bytes.data() + 1 + 8, &unknown, sizeof unknown);
        auto f = proto::decode_failed(bytes);
        REQUIRE(f);
        CHECK(f->error.code == Errc::compile_failed);
    }
}

TEST_CASE("a HELLO of another protocol version is refused naming both versions", "[unit]") {
    auto bytes = proto::encode(proto::Hello{proto::kVersion, 2, jit::Sandbox::none, {"memcpy"}, {}});
    const std::uint32_t v4 = 4;
    std::memcpy(bytes.data() + 1, &v4, sizeof v4);
    auto refused = proto::decode_hello(bytes);
    REQUIRE_FALSE(refused);
    CHECK(refused.error().code == Errc::unsupported_version);
    CHECK_THAT(refused.error().message, Catch::Contains("version 4") && Catch::Contains("speaks 5"));

    SECTION("and a libdevice cut short or over its cap is malformed") {
        auto cut = proto::encode(proto::Hello{proto::kVersion, 2, jit::Sandbox::none, {}, std::vector<std::byte>(10)});
        cut.pop_back();
        refused_naming(proto::decode_hello(cut), "libdevice");
        auto huge = proto::encode(proto::Hello{proto::kVersion, 2, jit::Sandbox::none, {}, {}});
        const auto claimed = static_cast<std::uint32_t>(proto::kMaxLibdeviceBytes + 1);
        std::memcpy(huge.data() + huge.size() - sizeof claimed, &claimed, sizeof claimed);
        huge.resize(huge.size() + claimed);
        refused_naming(proto::decode_hello(huge), "libdevice");
    }
}

TEST_CASE("a COMPILE's target and sm are refused when out of range - naming the field", "[unit]") {
    CodeHash h{};
    const std::vector<std::byte> bundle(16, std::byte{3});
    const auto object = proto::encode(proto::CompileRequest{1, jit::Tier::fast, h, bundle, "add"});
    const auto ptx = proto::encode(ptx_request(bundle, h));
    auto with_sm = [](std::vector<std::byte> bytes, std::uint16_t sm) {
        std::memcpy(bytes.data() + kSmAt, &sm, sizeof sm);
        return bytes;
    };
    SECTION("a target this build does not know") {
        auto bad = ptx;
        bad[kTargetAt] = std::byte{2};
        refused_naming(proto::decode_compile(bad), "target 2");
    }
    SECTION("an sm for object code") { refused_naming(proto::decode_compile(with_sm(object, 90)), "sm 90"); }
    SECTION("PTX for an sm LLVM does not make") {
        refused_naming(proto::decode_compile(with_sm(ptx, 0)), "sm 0");
        refused_naming(proto::decode_compile(with_sm(ptx, jit::kMinPtxSm - 1)), "sm 19");
        refused_naming(proto::decode_compile(with_sm(ptx, jit::kMaxPtxSm + 1)), "sm 91");
        CHECK(proto::decode_compile(with_sm(ptx, jit::kMinPtxSm)));
        CHECK(proto::decode_compile(with_sm(ptx, jit::kMaxPtxSm)));
    }
    SECTION("PTX at tier 0") {
        auto r = ptx_request(bundle, h);
        r.tier = jit::Tier::fast;
        refused_naming(proto::decode_compile(proto::encode(r)), "tier 0");
    }
    SECTION("PTX for one entry") {
        auto r = ptx_request(bundle, h);
        r.only = "add";
        refused_naming(proto::decode_compile(proto::encode(r)), "only");
    }
    SECTION("cut short anywhere") {
        for (std::size_t n = 0; n < ptx.size(); ++n) {
            INFO(n);
            auto r = proto::decode_compile(std::span(ptx.data(), n));
            REQUIRE_FALSE(r);
            CHECK(r.error().code == Errc::malformed_message);
        }
    }
}

TEST_CASE("a hostile PTX_COMPILED is refused as malformed - whatever part of it lies", "[unit]") {
    auto good = proto::encode(sample_ptx_reply());
    SECTION("cut short anywhere") {
        for (std::size_t n = 0; n < good.size(); ++n) {
            INFO(n);
            auto r = proto::decode_compiled_ptx(std::span(good.data(), n));
            REQUIRE_FALSE(r);
            CHECK(r.error().code == Errc::malformed_message);
        }
    }
    SECTION("no PTX") {
        auto reply = sample_ptx_reply();
        reply.made.ptx.clear();
        refused_naming(proto::decode_compiled_ptx(proto::encode(reply)), "no PTX");
    }
    SECTION("a NUL inside the PTX (the driver would read less than was checked)") {
        auto reply = sample_ptx_reply();
        reply.made.ptx[3] = '\0';
        refused_naming(proto::decode_compiled_ptx(proto::encode(reply)), "NUL");
    }
    SECTION("a stage time that is not a finite, sane number") {
        auto bad = good;
        const double nan = std::numeric_limits<double>::quiet_NaN();
        std::memcpy(bad.data() + 1 + 8 + 8, &nan, sizeof nan);
        refused_naming(proto::decode_compiled_ptx(bad), "stage times");
    }
    SECTION("trailing bytes") {
        auto bad = good;
        bad.push_back(std::byte{0});
        refused_naming(proto::decode_compiled_ptx(bad), "trailing");
    }
    SECTION("a COMPILED is not a PTX_COMPILED") {
        refused_naming(proto::decode_compiled_ptx(proto::encode(sample_reply())), "unexpected message type");
    }
}

TEST_CASE("a frame longer than the cap is refused before it is read, and a silent peer times out", "[unit]") {
    SocketPair s;
    const std::uint32_t length = proto::kMaxReplyFrame + 1;
    REQUIRE(::write(s.fd[1], &length, sizeof length) == sizeof length);
    auto big = proto::read_frame(s.fd[0], proto::kMaxReplyFrame, std::chrono::steady_clock::now() + 5s);
    REQUIRE_FALSE(big);
    CHECK(big.error().code == Errc::too_large);

    auto silent = proto::read_frame(s.fd[0], proto::kMaxReplyFrame, std::chrono::steady_clock::now() + 20ms);
    REQUIRE_FALSE(silent);
    CHECK(silent.error().code == Errc::timeout);

    ::close(s.fd[1]);
    s.fd[1] = -1;
    auto closed = proto::read_frame(s.fd[0], proto::kMaxReplyFrame);
    REQUIRE_FALSE(closed);
    CHECK(closed.error().code == Errc::disconnected);
}

TEST_CASE("a Jit compiling in bitship-compiler processes runs the kernel it links", "[integration]") {
    jit::JitOptions o;
    o.exports = jit_test::runtime_exports();
    o.compiler.mode = jit::CompilerMode::process;
    o.compiler.path = BITSHIP_COMPILER_PROGRAM;
    o.compiler.processes = 1;
    auto j = jit::Jit::create(o);
    REQUIRE(j);
    auto bundle = jit_test::make_bundle(jit_test::kernel_bitcode("add"), {"add"});
    auto code = (*j)->compile(bundle.bytes, bundle.hash);
    REQUIRE(code);
    auto add = (*code)->entry("add");
    REQUIRE(add);
    std::array<std::uint64_t, 2> args{40, 2};
    auto ctx = jit_test::call(*add, std::as_bytes(std::span(args)));
    CHECK(jit_test::reply_u64(ctx) == 42);
    CHECK((*code)->stats().codegen_ms > 0);

    SECTION("and refuses what the policy refuses, with the same error as in-process") {
        auto bad = jit_test::make_bundle(jit_test::kernel_bitcode("calls_system"), {"escape"});
        auto refused = (*j)->compile(bad.bytes, bad.hash);
        REQUIRE_FALSE(refused);
        CHECK(refused.error().code == Errc::unresolved_symbol);
        CHECK(refused.error().message == "kernel references 'system', which this agent does not export");
    }
    SECTION("and the tier-1 recompile also goes through it") {
        (*j)->drain_tier_ups();
        auto best = (*j)->find(bundle.hash);
        REQUIRE(best);
        CHECK(best->stats().tier == 1);
    }
}

TEST_CASE("a missing compiler program is a clear error at start, naming where it looked", "[unit]") {
    jit::JitOptions o;
    o.compiler.mode = jit::CompilerMode::process;
    o.compiler.path = "/nonexistent/bitship-compiler";
    auto j = jit::Jit::create(o);
    REQUIRE_FALSE(j);
    CHECK(j.error().code == Errc::io_error);
    CHECK_THAT(j.error().message, Catch::Contains("/nonexistent/bitship-compiler") && Catch::Contains("--compiler=in-process"));
}

}  // namespace compiler_protocol_test_cpp
