// Shipped GPU kernels through a real xagent on a GPU host: the nvptx64 slice compiled to PTX by
// the agent, loaded through the CUDA driver, launched on data already in GPU memory. Every case
// needs a GPU and its driver; where there is none it says why and exits 77, which ctest reports
// as skipped (SKIP_RETURN_CODE), not passed. The checks that run everywhere (no driver, GPU-less
// agents, PTX that ptxas accepts) live in test/agents and test/jit.
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <bitship/client.hpp>
#include <gpu_ops_kernels.hpp>

#include "cuda_driver.hpp"
#include "launcher.hpp"
#include "test_support.hpp"

namespace gpu_test_cpp {

using namespace bitship;
using bitship::launch::AgentProcess;
using bitship::test::connect;
using bitship::test::make_client;

namespace {

constexpr std::uint64_t kRegionBytes = 64ull << 20;
constexpr std::uint64_t kCount = kRegionBytes / 8;
constexpr std::uint64_t kChunk = 8ull << 20; // a GPU region put or get per call

void skip_without_gpu() {
    auto driver = agent::load_cuda_driver();
    if (driver && !driver->devices.empty()) return;
    std::printf("skipped: this test needs a GPU: %s\n", driver ? "the CUDA driver lists no GPU" : driver.error().message.c_str());
    std::fflush(stdout);
    std::_Exit(77);
}

ShipOptions on_gpu() {
    ShipOptions o;
    o.device = Device::gpu;
    return o;
}

std::uint64_t u64(const Bytes& b, std::size_t i = 0) {
    std::uint64_t v = 0;
    REQUIRE(b.size() >= (i + 1) * 8);
    std::memcpy(&v, b.data() + i * 8, 8);
    return v;
}

struct GpuAgent {
    // GPU kernels run only where the operator lets kernels reach beyond the sfi sandbox.
    AgentProcess agent{"tcp", {"--sandbox", "none", "--region", "data=64M@gpu0", "--kernel-timeout-ms", "2000"}};
    Client client = make_client("tcp", std::chrono::seconds(60));
    Target target = connect(client, agent);
};

} // namespace

TEST_CASE("gpu: the agent lists its GPU and GPU region in WELCOME, and REGION says it is in GPU memory", "[gpu]") {
    skip_without_gpu();
    GpuAgent g;
    const auto& caps = g.target.info().capabilities;
    REQUIRE(caps.gpus >= 1);
    REQUIRE(caps.gpu_devices.size() == caps.gpus);
    CHECK(caps.gpu_devices[0].sm >= 50);
    CHECK(caps.gpu_devices[0].multiprocessors > 0);
    REQUIRE(caps.gpu_regions.size() == 1);
    CHECK(caps.gpu_regions[0].name == "data");
    CHECK(caps.gpu_regions[0].size == kRegionBytes);
    auto r = g.client.region(g.target, "data");
    REQUIRE(r);
    CHECK(r->gpu);
    CHECK(r->gpu_index == 0);
    CHECK(r->size == kRegionBytes);
}

TEST_CASE("gpu: a shipped reduction over a GPU region returns the CPU reference's sum", "[gpu]") {
    skip_without_gpu();
    GpuAgent g;
    struct {
        std::uint64_t count, mul, add;
    } fill{kCount, 3, 1};
    auto filled = g.client.ship_bytes(gpu_ops_kernels::fill_u64, g.target, Client::pack_args(fill.count, fill.mul, fill.add), on_gpu()).get();
    INFO((filled ? std::string() : filled.error().describe()));
    REQUIRE(filled);
    std::uint64_t expected = 0;
    for (std::uint64_t i = 0; i < kCount; ++i) expected += i * 3 + 1;
    auto sum = g.client.ship(gpu_ops_kernels::sum_u64, g.target, on_gpu(), kCount).get();
    INFO((sum ? std::string() : sum.error().describe()) << "\n" << g.agent.log());
    REQUIRE(sum);
    CHECK(u64(*sum) == expected);
    // The same again: the module is loaded once.
    auto again = g.client.ship(gpu_ops_kernels::sum_u64, g.target, on_gpu(), kCount).get();
    REQUIRE(again);
    CHECK(u64(*again) == expected);
}

TEST_CASE("gpu: put and get of a GPU region round trip through the agent, and out-of-range ones are refused", "[gpu]") {
    skip_without_gpu();
    GpuAgent g;
    auto region = g.client.region(g.target, "data");
    REQUIRE(region);
    Bytes pattern(kRegionBytes);
    for (std::size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<std::byte>((i * 131) >> 3);
    std::vector<Future> puts;
    for (std::uint64_t off = 0; off < kRegionBytes; off += kChunk)
        puts.push_back(g.client.put(*region, off, Bytes(pattern.begin() + off, pattern.begin() + off + kChunk)));
    for (auto& f : puts) REQUIRE(f.get());
    std::vector<Future> gets;
    for (std::uint64_t off = 0; off < kRegionBytes; off += kChunk) gets.push_back(g.client.get(*region, off, kChunk));
    Bytes back;
    for (auto& f : gets) {
        auto b = f.get();
        REQUIRE(b);
        back.insert(back.end(), b->begin(), b->end());
    }
    CHECK(back == pattern);
    // The kernel sees what was put.
    std::uint64_t expected = 0;
    for (std::uint64_t i = 0; i < kCount; ++i) {
        std::uint64_t v;
        std::memcpy(&v, pattern.data() + i * 8, 8);
        expected += v;
    }
    auto sum = g.client.ship(gpu_ops_kernels::sum_u64, g.target, on_gpu(), kCount).get();
    REQUIRE(sum);
    CHECK(u64(*sum) == expected);

    auto past = g.client.get(*region, kRegionBytes - 8, 16).get();
    REQUIRE_FALSE(past);
    CHECK(past.error().code == Errc::out_of_bounds);
}

TEST_CASE("gpu: device any takes the CPU slice, device gpu the GPU slice with the geometry asked for", "[gpu]") {
    skip_without_gpu();
    GpuAgent g;
    auto cpu = g.client.ship(gpu_ops_kernels::where, g.target).get();
    REQUIRE(cpu);
    CHECK(u64(*cpu) == 0);
    auto o = on_gpu();
    o.grid = {4, 1, 1};
    o.block = {64, 1, 1};
    o.gpu_result_bytes = 24;
    auto gpu = g.client.ship(gpu_ops_kernels::where, g.target, o).get();
    INFO((gpu ? std::string() : gpu.error().describe()));
    REQUIRE(gpu);
    CHECK(u64(*gpu, 0) == 1);
    CHECK(u64(*gpu, 1) == 4);
    CHECK(u64(*gpu, 2) == 64);
    // Without a geometry the agent's default: 256 threads a block, 8 blocks per multiprocessor.
    o.grid = {};
    o.block = {};
    auto dflt = g.client.ship(gpu_ops_kernels::where, g.target, o).get();
    REQUIRE(dflt);
    CHECK(u64(*dflt, 1) == 8ull * g.target.info().capabilities.gpu_devices[0].multiprocessors);
    CHECK(u64(*dflt, 2) == 256);
    // A kernel that declares its geometry (BS_GPU_GEOMETRY: 128 threads, 2 blocks per SM) gets it.
    auto declared = g.client.ship(gpu_ops_kernels::where_declared, g.target, o).get();
    REQUIRE(declared);
    CHECK(u64(*declared, 1) == 2ull * g.target.info().capabilities.gpu_devices[0].multiprocessors);
    CHECK(u64(*declared, 2) == 128);
}

TEST_CASE("gpu: a CPU kernel on the same agent does not see the GPU region, a GPU kernel does", "[gpu]") {
    skip_without_gpu();
    GpuAgent g;
    auto seen = g.client.ship(gpu_ops_kernels::sees_data, g.target).get();
    REQUIRE(seen);
    CHECK(u64(*seen) == 0);
    auto sum = g.client.ship(gpu_ops_kernels::sum_u64, g.target, kCount).get(); // the CPU slice
    REQUIRE_FALSE(sum);
    CHECK(sum.error().code == Errc::kernel_failed);
    CHECK_THAT(sum.error().message, Catch::Contains("no region 'data' here"));
    auto gpu = g.client.ship(gpu_ops_kernels::sees_data, g.target, on_gpu()).get();
    REQUIRE(gpu);
    CHECK(u64(*gpu) == 1);
}

TEST_CASE("gpu: a faulting kernel is kernel_crashed, the context is recreated, and the agent serves on", "[gpu]") {
    skip_without_gpu();
    GpuAgent g;
    auto o = on_gpu();
    o.grid = {1, 1, 1};
    o.block = {1, 1, 1};
    auto crashed = g.client.ship(gpu_ops_kernels::fault, g.target, o).get();
    REQUIRE_FALSE(crashed);
    INFO(crashed.error().describe());
    CHECK(crashed.error().code == Errc::kernel_crashed);
    CHECK_THAT(crashed.error().message, Catch::Contains("CUDA_ERROR_ILLEGAL_ADDRESS") && Catch::Contains("recreated") &&
                                            Catch::Contains("GPU regions were allocated again"));
    // The region is there again (zeroed) and kernels run on it.
    auto sum = g.client.ship(gpu_ops_kernels::sum_u64, g.target, on_gpu(), kCount).get();
    INFO((sum ? std::string() : sum.error().describe()) << "\n" << g.agent.log());
    REQUIRE(sum);
    CHECK(u64(*sum) == 0);
    auto cpu = g.client.ship(gpu_ops_kernels::where, g.target).get();
    REQUIRE(cpu);
}

TEST_CASE("gpu: a kernel past the agent's kernel timeout is kernel_timeout, and the agent serves on", "[gpu]") {
    skip_without_gpu();
    GpuAgent g;
    auto o = on_gpu();
    o.grid = {1, 1, 1};
    o.block = {1, 1, 1};
    auto began = std::chrono::steady_clock::now();
    auto stopped = g.client.ship(gpu_ops_kernels::spin_forever, g.target, o).get();
    REQUIRE_FALSE(stopped);
    INFO(stopped.error().describe() << "\n" << g.agent.log());
    CHECK(stopped.error().code == Errc::kernel_timeout);
    CHECK(std::chrono::steady_clock::now() - began < std::chrono::seconds(30));
    auto where = g.client.ship(gpu_ops_kernels::where, g.target, on_gpu()).get();
    INFO((where ? std::string() : where.error().describe()));
    REQUIRE(where);
    CHECK(u64(*where) == 1);
}

TEST_CASE("gpu: a kernel the GPU slice does not have is entry_not_found", "[gpu]") {
    skip_without_gpu();
    GpuAgent g;
    auto missing = g.client.ship_bytes(Kernel{gpu_ops_kernels::bundle, "no_such_kernel"}, g.target,
                                       Client::pack_args(std::uint64_t{1}), on_gpu()).get();
    REQUIRE_FALSE(missing);
    CHECK(missing.error().code == Errc::entry_not_found);
}

}  // namespace gpu_test_cpp
