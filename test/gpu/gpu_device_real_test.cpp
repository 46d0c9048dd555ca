// GpuDevice (agents/gpu_device.hpp) in this process on a real GPU, with hand-written PTX
// (gpu_test_ptx.hpp): kernels with their arguments, result and regions, region reads and writes,
// and what a fault or a kernel that never returns leaves (the device poisoned for good: the
// agent's GpuProcess then starts a new process, gpu_test.cpp). Each case needs a GPU and runs
// alone (a poisoned process stays so): without a GPU it exits 77.
#include "cuda_api.hpp"
#include "gpu_device.hpp"
#include "gpu_test_ptx.hpp"
#include "gpu_test_support.hpp"

#include <bitship/bundle.hpp>
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace gpu_device_real_test_cpp {

using namespace bitship;
using namespace bitship::agent;
using namespace bitship::test;
using namespace std::chrono_literals;

namespace {

/// Whether this process runs this one test case alone, as ctest runs each: then a skip is the
/// exit status 77 (SKIP_RETURN_CODE); in a run of many it is a warning, and the others go on.
bool runs_alone() {
    const auto& config = Catch::getCurrentContext().getConfig();
    return Catch::filterTests(Catch::getAllTestCasesSorted(*config), config->testSpec(), *config)
               .size() == 1;
}

/// The driver, or null after skipping the test (no driver, or no GPU).
std::shared_ptr<const CudaApi> driver_or_skip() {
    std::string why;
    auto api = CudaApi::load();
    if (api) {
        int count = 0;
        if (int r = (*api)->cuDeviceGetCount(&count); r != cuda::kSuccess)
            why = "cuDeviceGetCount: " + (*api)->said(r);
        else if (count == 0)
            why = "the CUDA driver sees no GPU";
        else
            return *api;
    } else {
        why = api.error().message;
    }
    if (runs_alone()) {
        std::printf("skipped: %s\n", why.c_str());
        std::fflush(stdout);
        std::exit(77);
    }
    WARN("skipped: " << why);
    return nullptr;
}

std::unique_ptr<GpuDevice> open_gpu(const std::shared_ptr<const CudaApi>& api) {
    auto gpu = GpuDevice::open(api, 0);
    INFO((gpu ? std::string() : gpu.error().describe()));
    REQUIRE(gpu);
    INFO((*gpu)->name() << " sm_" << (*gpu)->sm());
    REQUIRE((*gpu)->load_module(hash_of(kTestPtx), kTestPtx));
    return std::move(*gpu);
}

} // namespace

TEST_CASE("gpu device (in process): a PTX kernel runs with its arguments, result and regions, and "
          "region reads "
          "and writes round-trip",
          "[gpu]") {
    auto api = driver_or_skip();
    if (!api) return;
    auto gpu = open_gpu(api);
    const auto hash = hash_of(kTestPtx);
    REQUIRE(gpu->add_region("data", 1 << 20));
    REQUIRE(gpu->add_region("big", std::uint64_t{20} << 20));

    auto sum =
        gpu->launch(hash, "sum_u64", bytes_of(sum_args(40, 2)), 8, gpu->default_geometry(), 10s);
    INFO((sum ? std::string() : sum.error().describe()));
    REQUIRE(sum);
    CHECK(u64_at(*sum) == 42);

    std::vector<std::uint64_t> fill = {1000, 7};
    REQUIRE(gpu->launch(hash, "fill_region", bytes_of(fill), 0, GpuGeometry{{4, 1, 1}, {256, 1, 1}},
                        10s));
    std::vector<std::uint64_t> values(1001);
    REQUIRE(gpu->read("data", 0, std::as_writable_bytes(std::span(values))));
    CHECK(values[0] == 7);
    CHECK(values[999] == 1006);
    CHECK(values[1000] == 0);

    const auto data = pattern((std::size_t{17} << 20) + 5, 9);
    REQUIRE(gpu->write("big", 4097, data));
    std::vector<std::byte> back(data.size());
    REQUIRE(gpu->read("big", 4097, back));
    CHECK((back == data));

    std::vector<std::byte> two(2);
    auto past = gpu->read("data", (1 << 20) - 1, two);
    REQUIRE_FALSE(past);
    CHECK(past.error().code == Errc::invalid_argument);
    auto unknown = gpu->launch(hash, "nope", {}, 8, GpuGeometry{}, 10s);
    REQUIRE_FALSE(unknown);
    CHECK(unknown.error().code == Errc::entry_not_found);
    CHECK(gpu->poisoned().empty());
}

TEST_CASE(
    "gpu device (in process): an illegal address is kernel_crashed and poisons the device for good",
    "[gpu]") {
    auto api = driver_or_skip();
    if (!api) return;
    auto gpu = open_gpu(api);
    const auto hash = hash_of(kTestPtx);
    REQUIRE(gpu->add_region("data", 4096));
    REQUIRE(gpu->write("data", 0, pattern(4096, 1)));

    auto crashed = gpu->launch(hash, "bad_address", {}, 8, GpuGeometry{}, 10s);
    REQUIRE_FALSE(crashed);
    INFO(crashed.error().describe());
    CHECK(crashed.error().code == Errc::kernel_crashed);
    CHECK_THAT(crashed.error().message, Catch::Contains("CUDA_ERROR_ILLEGAL_ADDRESS") &&
                                            Catch::Contains("the GPU context is poisoned"));
    CHECK_THAT(gpu->poisoned(), Catch::Contains("CUDA_ERROR_ILLEGAL_ADDRESS"));

    // The driver lets this process do nothing more with the GPU (a new process recovers: the
    // agent's GpuProcess, test/gpu).
    auto sum = gpu->launch(hash, "sum_u64", bytes_of(sum_args(40, 2)), 8, GpuGeometry{}, 10s);
    REQUIRE_FALSE(sum);
    CHECK(sum.error().code == Errc::no_device);
}

TEST_CASE("gpu device (in process): a kernel that never returns is kernel_timeout after its time",
          "[gpu]") {
    auto api = driver_or_skip();
    if (!api) return;
    auto gpu = open_gpu(api);
    const auto hash = hash_of(kTestPtx);

    const auto start = std::chrono::steady_clock::now();
    auto stuck = gpu->launch(hash, "spin_forever", {}, 8, GpuGeometry{}, 200ms);
    const auto waited = std::chrono::steady_clock::now() - start;
    REQUIRE_FALSE(stuck);
    INFO(stuck.error().describe());
    CHECK(stuck.error().code == Errc::kernel_timeout);
    CHECK(waited >= 200ms);
    INFO("returned after " << std::chrono::duration_cast<std::chrono::milliseconds>(waited).count()
                           << " ms");
    CHECK(waited < 10s);
    CHECK_THAT(gpu->poisoned(), Catch::Contains("still runs"));
    // The device is left as it is (a release could wait for the kernel); the process's end
    // stops it.
}

}  // namespace gpu_device_real_test_cpp
