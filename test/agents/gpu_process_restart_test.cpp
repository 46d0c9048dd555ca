// The agent's GPU processes (agents/gpu_process.hpp) through a real xagent on the fake CUDA
// driver: a fault, a kernel past its time, or the bitship-gpu process's death ends that process
// and starts another (the fake keeps a sticky error for the process's life, as the real driver
// does), the failed call says so, and the agent serves on.
#include "gpu_plumbing_support.hpp"

#include <bitship/client.hpp>
#include <catch2/catch.hpp>
#include <cctype>
#include <chrono>
#include <csignal>
#include <device_kernels.hpp>
#include <filesystem>
#include <fstream>
#include <gpu_ops_kernels.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace gpu_process_restart_test_cpp {

using namespace bitship;
using namespace bitship::test::gpu_plumbing;

namespace {

/// The pids of `parent`'s children named `name` (/proc/PID/stat: "pid (comm) state ppid ...").
std::vector<pid_t> children_named(pid_t parent, const std::string& name) {
    std::vector<pid_t> out;
    for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
        const std::string pid = entry.path().filename().string();
        if (pid.empty() || !std::isdigit(static_cast<unsigned char>(pid[0]))) continue;
        std::ifstream in(entry.path() / "stat");
        std::string line;
        if (!std::getline(in, line)) continue;
        const auto open = line.find('('), close = line.rfind(')');
        if (open == std::string::npos || close == std::string::npos || close + 4 > line.size()) continue;
        std::istringstream rest(line.substr(close + 2));
        char state = 0;
        pid_t ppid = 0;
        if (rest >> state >> ppid && ppid == parent && line.substr(open + 1, close - open - 1) == name)
            out.push_back(static_cast<pid_t>(std::stoi(pid)));
    }
    return out;
}

} // namespace

TEST_CASE("gpu plumbing (fake driver): a fault is kernel_crashed and recreates the context, a "
          "kernel past its time "
          "is kernel_timeout, and the agent serves on",
          "[integration][gpu]") {
    FakeGpuAgent g;
    auto filled = g.client
                      .ship(gpu_ops_kernels::fill_u64, g.target, on_gpu(), kRegionU64s,
                            std::uint64_t{1}, std::uint64_t{1})
                      .get();
    INFO(said(filled) << "\n" << g.agent.log());
    REQUIRE(filled);
    auto sum = g.client.ship(gpu_ops_kernels::sum_u64, g.target, on_gpu(), kRegionU64s).get();
    REQUIRE(sum);
    CHECK(u64(*sum) == filled_sum(kRegionU64s, 1, 1));

    auto o = on_gpu();
    o.grid = {1, 1, 1};
    o.block = {1, 1, 1};
    auto crashed = g.client.ship(gpu_ops_kernels::fault, g.target, o).get();
    REQUIRE_FALSE(crashed);
    INFO(crashed.error().describe());
    CHECK(crashed.error().code == Errc::kernel_crashed);
    CHECK_THAT(crashed.error().message, Catch::Contains("GPU kernel 'fault'") &&
                                            Catch::Contains("CUDA_ERROR_ILLEGAL_ADDRESS") &&
                                            Catch::Contains("recreated") &&
                                            Catch::Contains("GPU regions were allocated again"));
    CHECK(g.counter("gpu_context_resets") == 1);
    CHECK(g.counter("kernel_crashes") == 1);

    // The region is there again, zeroed, and the module reloads from its kept PTX.
    auto zero = g.client.ship(gpu_ops_kernels::sum_u64, g.target, on_gpu(), kRegionU64s).get();
    INFO(said(zero) << "\n" << g.agent.log());
    REQUIRE(zero);
    CHECK(u64(*zero) == 0);
    CHECK(g.counter("gpu_context_resets") == 1);

    // A kernel that never returns: stopped at the agent's kernel timeout.
    const auto began = std::chrono::steady_clock::now();
    auto stopped = g.client.ship(gpu_ops_kernels::spin_forever, g.target, o).get();
    const auto took = std::chrono::steady_clock::now() - began;
    REQUIRE_FALSE(stopped);
    INFO(stopped.error().describe() << "\n" << g.agent.log());
    CHECK(stopped.error().code == Errc::kernel_timeout);
    CHECK_THAT(stopped.error().message, Catch::Contains("GPU kernel 'spin_forever'") &&
                                            Catch::Contains("still running after 500 ms") &&
                                            Catch::Contains("recreated"));
    CHECK(took >= kKernelTimeout);
    CHECK(took < std::chrono::seconds(5));
    CHECK(g.counter("gpu_context_resets") == 2);
    CHECK(g.counter("kernel_timeouts") == 1);

    // The agent serves on: GPU kernels, GPU region transfers and CPU kernels.
    auto twice = g.client.ship(device_kernels::twice, g.target, on_gpu(), std::uint64_t{4})
                     .get_as<std::uint64_t>();
    REQUIRE(twice);
    CHECK(*twice == 8);
    auto region = g.client.region(g.target, "data");
    REQUIRE(region);
    Bytes ones(kChunk, std::byte{1});
    REQUIRE(g.client.put(*region, 0, ones).get());
    auto back = g.client.get(*region, 0, kChunk).get();
    REQUIRE(back);
    CHECK(*back == ones);
    auto cpu =
        g.client.ship(device_kernels::twice, g.target, std::uint64_t{5}).get_as<std::uint64_t>();
    REQUIRE(cpu);
    CHECK(*cpu == 10);
    CHECK(g.stops_cleanly());
}

TEST_CASE("gpu plumbing (fake driver): each GPU is held by a bitship-gpu process, and one that dies "
          "is replaced: the next call says so and the agent serves on",
          "[integration][gpu]") {
    FakeGpuAgent g;
    auto first = g.client.ship(gpu_ops_kernels::sum_u64, g.target, on_gpu(), kRegionU64s).get();
    INFO(said(first) << "\n" << g.agent.log());
    REQUIRE(first);
    const auto processes = children_named(g.agent.pid(), "bitship-gpu");
    REQUIRE(processes.size() == 1);
    REQUIRE(::kill(processes[0], SIGKILL) == 0);

    // The call that finds it gone fails, naming how it ended; a new process takes its place.
    auto lost = g.client.ship(gpu_ops_kernels::sum_u64, g.target, on_gpu(), kRegionU64s).get();
    REQUIRE_FALSE(lost);
    INFO(lost.error().describe() << "\n" << g.agent.log());
    CHECK(lost.error().code == Errc::internal);
    CHECK_THAT(lost.error().message, Catch::Contains("GPU process") && Catch::Contains("SIGKILL") &&
                                         Catch::Contains("the context was recreated in a new GPU process") &&
                                         Catch::Contains("GPU regions were allocated again"));
    CHECK(g.counter("gpu_context_resets") == 1);
    const auto replaced = children_named(g.agent.pid(), "bitship-gpu");
    REQUIRE(replaced.size() == 1);
    CHECK(replaced[0] != processes[0]);

    // The module reloads from the PTX the agent kept; the region is there, zeroed.
    auto zero = g.client.ship(gpu_ops_kernels::sum_u64, g.target, on_gpu(), kRegionU64s).get();
    INFO(said(zero));
    REQUIRE(zero);
    CHECK(u64(*zero) == 0);
    CHECK(g.counter("gpu_compiles") == 1);
    // The agent ends its GPU process when it stops (and reaps it: the pid is gone).
    CHECK(g.stops_cleanly());
    CHECK(::kill(replaced[0], 0) != 0);
}

TEST_CASE("gpu plumbing (fake driver): SIGTERM stops an agent whose GPU kernel never returns and "
          "that has no kernel timeout: the GPU process is ended and the call answered",
          "[integration][gpu]") {
    FakeGpuAgent g("tcp", std::chrono::milliseconds(0));
    auto o = on_gpu();
    o.grid = {1, 1, 1};
    o.block = {1, 1, 1};
    auto spinning = g.client.ship(gpu_ops_kernels::spin_forever, g.target, o);
    // Loaded on the GPU, so launched next (the launch is not counted until it returns).
    bitship::test::wait_until([&] { return g.counter("gpu_compiles") >= 1; }, "the GPU compile",
                              std::chrono::seconds(20), std::chrono::milliseconds(5));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    CHECK_FALSE(spinning.ready());
    const auto processes = children_named(g.agent.pid(), "bitship-gpu");
    REQUIRE(processes.size() == 1);
    const auto began = std::chrono::steady_clock::now();
    REQUIRE(::kill(g.agent.pid(), SIGTERM) == 0);
    auto status = bitship::test::wait_for_exit(g.agent, std::chrono::seconds(10));
    INFO(g.agent.log());
    REQUIRE(status);
    CHECK(WIFEXITED(*status));
    CHECK(std::chrono::steady_clock::now() - began < std::chrono::seconds(5));
    CHECK(::kill(processes[0], 0) != 0); // ended and reaped, not orphaned
    CHECK_THAT(g.agent.log(), !Catch::Contains("the context was recreated")); // no new process
    REQUIRE(spinning.wait_for(std::chrono::seconds(10)));
    auto r = spinning.get();
    REQUIRE_FALSE(r);
    INFO(r.error().describe());
    CHECK((r.error().code == Errc::shutting_down || r.error().code == Errc::disconnected));
}

}  // namespace gpu_process_restart_test_cpp
