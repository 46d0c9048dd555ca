#include <catch2/catch.hpp>

#include <bitship/client.hpp>

// ship() lays arguments out as a C struct of those members; kernels read them as one.
namespace {
struct Mixed {
    std::uint8_t a;
    std::uint64_t b;
    std::uint32_t c;
};
} // namespace

TEST_CASE("a connect to a malformed address fails with invalid_argument, no network", "[unit]") {
    auto client = bitship::Client::create();
    REQUIRE(client);
    for (auto bad : {"localhost", "127.0.0.1:", ":7000", "127.0.0.1:99999", "127.0.0.1:7x"}) {
        auto t = client->connect(bad);
        REQUIRE_FALSE(t);
        CHECK(t.error().code == bitship::Errc::invalid_argument);
    }
}

TEST_CASE("the C struct layout rule matches the compiler's", "[unit]") {
    // Mirror of Client::append_arg plus tail padding.
    std::vector<std::byte> out;
    auto put = [&](auto v) {
        auto at = (out.size() + alignof(decltype(v)) - 1) / alignof(decltype(v)) * alignof(decltype(v));
        out.resize(at + sizeof v);
        std::memcpy(out.data() + at, &v, sizeof v);
    };
    put(std::uint8_t{1});
    put(std::uint64_t{2});
    put(std::uint32_t{3});
    out.resize((out.size() + 7) / 8 * 8);
    REQUIRE(out.size() == sizeof(Mixed));
    Mixed m;
    std::memcpy(&m, out.data(), sizeof m);
    CHECK(m.a == 1);
    CHECK(m.b == 2);
    CHECK(m.c == 3);
}
