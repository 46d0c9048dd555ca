// A kernel held at a gate, for tests that need the agent busy until they say so:
// load_kernels::hold_until_released counts itself into word 0 of the agent's region "gate"
// (xagent --region gate=4K) and spins until word 1 is set. A blocker that ends on a timer
// (spin_forever, busy_count) ends when the machine lets it: on two loaded cores it once ended
// before the calls meant to arrive while it ran had arrived, and it may not have started when
// they come. A gate removes both: the test waits until the kernel holds the worker, and lets
// it go when it is done.
#pragma once

#include "test_support.hpp"

#include <bitship/client.hpp>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace bitship::test {

inline constexpr auto kGateWaitLimit = std::chrono::seconds(20); // a missing step fails, never hangs

/// The agent arguments `own`, and what a gate needs: the region, and a kernel time limit past
/// any of a test's waits (a held kernel is released, not stopped).
inline std::vector<std::string> with_gate(std::vector<std::string> own) {
    own.insert(own.end(), {"--region", "gate=4K", "--kernel-timeout-ms", "60000"});
    return own;
}

inline std::uint64_t read_word(Client& client, const RemoteRegion& gate, std::uint64_t index) {
    auto bytes = client.get(gate, index * sizeof(std::uint64_t), sizeof(std::uint64_t)).get();
    REQUIRE(bytes);
    std::uint64_t v = 0;
    std::memcpy(&v, bytes->data(), sizeof v);
    return v;
}

inline void write_word(Client& client, const RemoteRegion& gate, std::uint64_t index, std::uint64_t value) {
    Bytes data(sizeof value);
    std::memcpy(data.data(), &value, sizeof value);
    REQUIRE(client.put(gate, index * sizeof(std::uint64_t), std::move(data)).get());
}

/// The gate region of `target`, read and written through `client` (one-sided: no call, so
/// no place in a connection's in-flight limit, and no worker).
class Gate {
public:
    Gate(Client& client, const Target& target) : client_(client) {
        auto region = client.region(target, "gate");
        REQUIRE(region);
        region_ = *region;
    }
    /// Until `kernels` hold_until_released calls in all have entered the gate.
    void wait_held(std::uint64_t kernels = 1) {
        wait_until([&] { return read_word(client_, region_, 0) >= kernels; },
                   "kernels to enter the gate", kGateWaitLimit);
    }
    void release() { write_word(client_, region_, 1, 1); }
    [[nodiscard]] const RemoteRegion& region() const { return region_; }

private:
    Client& client_;
    RemoteRegion region_;
};

} // namespace bitship::test
