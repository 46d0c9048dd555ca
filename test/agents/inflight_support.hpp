#pragma once
// Helpers the tests of what connections may make an agent hold share (inflight_limit_test.cpp,
// total_inflight_test.cpp): a client that sees refusals, a u64 answer, an agent's peak memory,
// and how long a blocker kernel runs before the agent stops it.

#include "test_support.hpp"

#include <bitship/client.hpp>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fmt/format.h>
#include <fstream>
#include <string>
#include <sys/types.h>

namespace bitship::test {

/// A client that sees the agent's refusals (ClientOptions::resend_busy off).
inline Client client_seeing_busy(const std::string& transport) {
    return make_client(transport, std::chrono::seconds(30),
                       [](ClientOptions& o) { o.resend_busy = false; });
}

/// An answer of one u64.
inline std::uint64_t value_of(const Bytes& b) {
    std::uint64_t v = 0;
    REQUIRE(b.size() == sizeof v);
    std::memcpy(&v, b.data(), sizeof v);
    return v;
}

/// A process's peak resident memory (VmHWM), bytes.
inline std::uint64_t peak_rss(pid_t pid) {
    std::ifstream in(fmt::format("/proc/{}/status", pid));
    std::string line;
    while (std::getline(in, line))
        if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6)) << 10;
    FAIL("no VmHWM in /proc/" << pid << "/status");
    return 0;
}

} // namespace bitship::test
