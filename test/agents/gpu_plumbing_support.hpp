#pragma once
// What the GPU plumbing tests share (gpu_plumbing_test.cpp, gpu_process_restart_test.cpp): a
// real xagent on the fake CUDA driver (fake_cuda/fake_libcuda.cpp) with a GPU region, its
// client, and helpers to read what comes back.
#include "launcher.hpp"
#include "test_support.hpp"

#include <bitship/client.hpp>
#include <catch2/catch.hpp>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <string>
#include <sys/wait.h>
#include <vector>

namespace bitship::test::gpu_plumbing {

using bitship::launch::AgentProcess;

constexpr std::uint64_t kRegionBytes = std::uint64_t{1} << 20; // data=1M@gpu0
constexpr std::uint64_t kRegionU64s = kRegionBytes / sizeof(std::uint64_t);
constexpr std::uint32_t kChunk = 64u << 10; // a put or get per call
constexpr std::uint32_t kFakeMultiprocessors = 132;
constexpr std::uint32_t kFakeSm = 90;
constexpr const char* kFakeName = "Fake GPU (bitship tests)";
constexpr const char* kFakeBusId = "0000:00:00.0";
constexpr auto kKernelTimeout = std::chrono::milliseconds(500);
/// Arguments and results this large go through the bulk window over shared memory.
constexpr std::uint32_t kLargeBytes = 64u << 10;

/// A --sandbox none agent on the fake driver, with a 1 MiB GPU region "data", a client and its
/// connection. `kernel_timeout`: the agent's --kernel-timeout-ms (0: none); `extra`: more of
/// its options.
struct FakeGpuAgent {
    explicit FakeGpuAgent(const std::string& transport = "tcp",
                          std::chrono::milliseconds kernel_timeout = kKernelTimeout,
                          const std::vector<std::string>& extra = {})
        : agent(transport, with(extra, {"--sandbox", "none", "--cuda-library", BITSHIP_FAKE_CUDA, "--region",
                                        "data=1M@gpu0", "--kernel-timeout-ms",
                                        std::to_string(kernel_timeout.count())})),
          client(make_client(transport)), target(connect(client, agent)) {}
    static std::vector<std::string> with(std::vector<std::string> extra, std::vector<std::string> base) {
        base.insert(base.end(), extra.begin(), extra.end());
        return base;
    }
    std::uint64_t counter(const std::string& name) { return agent_counters(client, target)[name]; }
    /// SIGTERM: the agent lets its GPU go (context, memory, the driver's handles) and exits 0.
    bool stops_cleanly() {
        const int status = agent.stop(SIGTERM);
        INFO("exit status " << status << "\n" << agent.log());
        return WIFEXITED(status) && WEXITSTATUS(status) == 0;
    }

    AgentProcess agent;
    Client client;
    Target target;
};

inline ShipOptions on_gpu(std::uint32_t result_bytes = 8) {
    ShipOptions o;
    o.device = Device::gpu;
    o.gpu_result_bytes = result_bytes;
    return o;
}

inline std::uint64_t u64(const Bytes& b, std::size_t i = 0) {
    REQUIRE(b.size() >= (i + 1) * sizeof(std::uint64_t));
    std::uint64_t v = 0;
    std::memcpy(&v, b.data() + i * sizeof v, sizeof v);
    return v;
}

inline std::string said(const Result<Bytes>& r) {
    return r ? std::string() : r.error().describe();
}

/// sum_{i < n} (i * mul + add)
inline std::uint64_t filled_sum(std::uint64_t n, std::uint64_t mul, std::uint64_t add) {
    return mul * (n * (n - 1) / 2) + add * n;
}

} // namespace bitship::test::gpu_plumbing
