// The GPU module cache (xagent --gpu-modules, GpuProcess::Options::max_modules) through a real
// xagent on the fake CUDA driver: an agent that keeps one module unloads the other to load a
// second, a later call to the unloaded one is compiled again (by NEED_CODE when it came without
// its code), and a call whose module is unloaded between its routing and its launch is loaded
// again and answered.
#include "gpu_plumbing_support.hpp"

#include <behaviour_kernels.hpp>
#include <bitship/client.hpp>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <device_kernels.hpp>
#include <gpu_ops_kernels.hpp>
#include <string>
#include <thread>
#include <vector>

namespace gpu_module_cache_test_cpp {

using namespace bitship;
using namespace bitship::test::gpu_plumbing;

TEST_CASE("gpu plumbing (fake driver): an agent keeps at most --gpu-modules modules per GPU and "
          "compiles one it unloaded again when it is called",
          "[integration][gpu]") {
    FakeGpuAgent g("tcp", kKernelTimeout, {"--gpu-modules", "1"});
    auto twice = [&](std::uint64_t v) {
        return g.client.ship(device_kernels::twice, g.target, on_gpu(), v).get_as<std::uint64_t>();
    };
    auto sum = [&] {
        return g.client.ship(gpu_ops_kernels::sum_u64, g.target, on_gpu(), kRegionU64s).get();
    };

    auto a = twice(21);
    INFO((a ? std::string() : a.error().describe()) << "\n" << g.agent.log());
    REQUIRE(a);
    CHECK(*a == 42);
    CHECK(g.counter("gpu_module_evictions") == 0);
    // A second module: the first is unloaded to make room.
    auto zero = sum();
    INFO(said(zero));
    REQUIRE(zero);
    CHECK(u64(*zero) == 0);
    CHECK(g.counter("gpu_module_evictions") == 1);
    CHECK(g.counter("gpu_compiles") == 2);
    // The first again: the client sends no code (it sent it before), the agent asks for it
    // (NEED_CODE), compiles it again, and unloads the second.
    const auto asked_before = g.counter("need_code_sent");
    auto again = twice(50);
    INFO((again ? std::string() : again.error().describe()));
    REQUIRE(again);
    CHECK(*again == 100);
    CHECK(g.counter("need_code_sent") == asked_before + 1);
    CHECK(g.counter("gpu_compiles") == 3);
    CHECK(g.counter("gpu_module_evictions") == 2);
    CHECK_THAT(g.agent.log(),
               Catch::Contains("unloaded module") && Catch::Contains("--gpu-modules"));

    // Calls of both in flight at once, so some are routed to a module that is unloaded before
    // they run: each still gets its answer.
    constexpr int kCalls = 24;
    std::vector<Future> futures;
    for (int i = 0; i < kCalls; ++i)
        futures.push_back(
            i % 2 == 0 ? g.client.ship(device_kernels::twice, g.target, on_gpu(), std::uint64_t(i))
                       : g.client.ship(gpu_ops_kernels::sum_u64, g.target, on_gpu(), kRegionU64s));
    for (int i = 0; i < kCalls; ++i) {
        auto r = futures[i].get();
        INFO("call " << i << ": " << said(r) << "\n" << g.agent.log());
        REQUIRE(r);
        CHECK(u64(*r) == (i % 2 == 0 ? 2 * std::uint64_t(i) : 0));
    }
    CHECK(g.stops_cleanly());
}

TEST_CASE("gpu plumbing (fake driver): a GPU call whose module is unloaded after it was routed and "
          "before it ran is loaded again and answered",
          "[integration][gpu]") {
    using namespace std::chrono_literals;
    // One worker, held by a CPU kernel while the calls queue behind it in a known order.
    FakeGpuAgent g("tcp", 10s, {"--gpu-modules", "1", "--workers", "1", "--log-level", "debug"});
    auto twice = g.client.ship(device_kernels::twice, g.target, on_gpu(), std::uint64_t{1})
                     .get_as<std::uint64_t>();
    INFO((twice ? std::string() : twice.error().describe()) << "\n" << g.agent.log());
    REQUIRE(twice);
    CHECK(*twice == 2);
    auto wait_for = [&](const std::string& counter, std::uint64_t at_least) {
        bitship::test::wait_until([&] { return g.counter(counter) >= at_least; }, counter, 20s,
                                  2ms);
    };
    // 1. The worker counts for a while (its code compiled first, on the same worker).
    const auto cpu_compiles = g.counter("compiles");
    auto busy = g.client.ship(behaviour_kernels::busy_count, g.target, std::uint64_t{300'000'000});
    wait_for("compiles", cpu_compiles + 1);
    std::this_thread::sleep_for(50ms);
    REQUIRE_FALSE(busy.ready());
    // 2. A call of a second GPU module: its compile and load queue behind the count.
    const auto received = g.counter("code_received");
    auto sum = g.client.ship(gpu_ops_kernels::sum_u64, g.target, on_gpu(), kRegionU64s);
    wait_for("code_received", received + 1);
    // 3. A call of the loaded module, routed to it now, launched after that load unloads it.
    auto late = g.client.ship(device_kernels::twice, g.target, on_gpu(), std::uint64_t{5});
    auto counted = busy.get_as<std::uint64_t>();
    REQUIRE(counted);
    auto zero = sum.get();
    INFO(said(zero));
    REQUIRE(zero);
    CHECK(u64(*zero) == 0);
    auto ten = late.get_as<std::uint64_t>();
    INFO((ten ? std::string() : ten.error().describe()));
    REQUIRE(ten);
    CHECK(*ten == 10);
    CHECK_THAT(g.agent.log(),
               Catch::Contains("its module was unloaded before it ran; loading it again"));
    CHECK(g.counter("gpu_module_evictions") >= 2);
    CHECK(g.stops_cleanly());
}

}  // namespace gpu_module_cache_test_cpp
