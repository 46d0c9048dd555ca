#include <catch2/catch.hpp>

#include <bitship/client.hpp>

namespace client_args_test_cpp {

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

TEST_CASE("arguments are packed exactly as the C struct of them", "[unit]") {
    auto packed = bitship::Client::pack_args(std::uint8_t{1}, std::uint64_t{2}, std::uint32_t{3});
    REQUIRE(packed.size() == sizeof(Mixed)); // tail padding included
    Mixed m;
    std::memcpy(&m, packed.data(), sizeof m);
    CHECK(m.a == 1);
    CHECK(m.b == 2);
    CHECK(m.c == 3);
    CHECK(bitship::Client::pack_args().empty());
    CHECK(bitship::Client::pack_args(3.0, 4.0).size() == 16);
}

struct Padded {
    char a;
    std::uint16_t b;
    double c;
    char d;
};

TEST_CASE("packed arguments put each member where the C struct does, padding zeroed", "[unit]") {
    auto packed = bitship::Client::pack_args('x', std::uint16_t{0x1234}, 2.5, 'y');
    REQUIRE(packed.size() == sizeof(Padded));
    Padded p{};
    std::memcpy(&p, packed.data(), sizeof p);
    CHECK(p.a == 'x');
    CHECK(p.b == 0x1234);
    CHECK(p.c == 2.5);
    CHECK(p.d == 'y');
    // The bytes between and after the members are zero, as the old growth by resize left them.
    for (std::size_t i : {std::size_t{1}, std::size_t{4}, std::size_t{5}, std::size_t{6}, std::size_t{7}})
        CHECK(packed[i] == std::byte{0});
    for (std::size_t i = offsetof(Padded, d) + 1; i < sizeof(Padded); ++i) CHECK(packed[i] == std::byte{0});
}

}  // namespace client_args_test_cpp
