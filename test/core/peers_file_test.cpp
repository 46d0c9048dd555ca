// The peers file a launched job's rank 0 writes and Client::connect_all reads.

#include <catch2/catch.hpp>

#include <bitship/peers.hpp>

namespace peers_file_test_cpp {

using namespace bitship;

TEST_CASE("a peers file survives format and parse, in rank order", "[unit]") {
    std::vector<PeerRecord> peers{{1, "127.0.0.1:7001", "node1", "x86_64-pc-linux-gnu", 0},
                                  {0, "127.0.0.1:7000", "node0", "x86_64-pc-linux-gnu", 2}};
    auto text = format_peers(peers);
    CHECK(text.rfind("# bitship peers 1\n0 127.0.0.1:7000 node0", 0) == 0);
    auto back = parse_peers(text);
    REQUIRE(back);
    REQUIRE(back->size() == 2);
    CHECK((*back)[0] == peers[1]);
    CHECK((*back)[1] == peers[0]);
}

TEST_CASE("a malformed peers file is refused naming the line and the fault", "[unit]") {
    struct Case {
        std::string text;
        std::string says;
    };
    std::vector<Case> cases{
        {"", "empty"},
        {"0 127.0.0.1:7000 h t 0\n", "line 1 is not"},
        {"# bitship peers 1\n", "no agent"},
        {"# bitship peers 1\n0 127.0.0.1:7000 h t\n", "line 2 has 4 fields"},
        {"# bitship peers 1\nx 127.0.0.1:7000 h t 0\n", "rank 'x'"},
        {"# bitship peers 1\n0 127.0.0.1 h t 0\n", "not HOST:PORT"},
        {"# bitship peers 1\n0 127.0.0.1:99999 h t 0\n", "not HOST:PORT"},
        {"# bitship peers 1\n0 127.0.0.1:7000 h t -1\n", "GPU count"},
        {"# bitship peers 1\n0 127.0.0.1:7000 h t 0\n0 127.0.0.1:7001 h t 0\n", "rank 0 appears twice"},
        {"# bitship peers 1\n0 127.0.0.1:7000 h t 0\n2 127.0.0.1:7001 h t 0\n", "rank 1 is missing"},
        {"# bitship peers 2\n0 127.0.0.1:7000 h t 0\n", "line 1 is not"},
    };
    for (const auto& c : cases) {
        INFO(c.text);
        auto r = parse_peers(c.text);
        REQUIRE_FALSE(r);
        CHECK(r.error().code == Errc::invalid_argument);
        CHECK_THAT(r.error().message, Catch::Contains(c.says));
    }
}

TEST_CASE("a missing peers file is an io_error naming it", "[unit]") {
    auto r = read_peers_file("/nonexistent/bitship/peers");
    REQUIRE_FALSE(r);
    CHECK(r.error().code == Errc::io_error);
    CHECK_THAT(r.error().message, Catch::Contains("/nonexistent/bitship/peers"));
}

}  // namespace peers_file_test_cpp
