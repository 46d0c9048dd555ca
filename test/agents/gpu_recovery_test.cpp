// GpuDevice (agents/gpu_device.hpp) on the in-process fake driver, when a kernel faults or never
// returns: the call's error, and the device poisoned for good afterwards (no reset, no retain:
// on a real driver only a new process recovers, which the agent's GpuProcess does; see
// gpu_plumbing_test.cpp and test/gpu).
#include "cuda_api.hpp"
#include "gpu_device.hpp"
#include "gpu_test_support.hpp"

#include <bitship/bundle.hpp>
#include <catch2/catch.hpp>
#include <cstdint>
#include <string>
#include <vector>

namespace gpu_recovery_test_cpp {

using namespace bitship;
using namespace bitship::agent;
using namespace bitship::test;
using namespace std::chrono_literals;

namespace {

/// Every call that needs the driver now fails with no_device naming why.
void check_unusable(GpuDevice& gpu, const CodeHash& hash, std::string_view why) {
    CHECK_THAT(gpu.poisoned(), Catch::Contains(std::string(why)));
    std::vector<std::byte> back(64);
    auto read = gpu.read("data", 0, back);
    REQUIRE_FALSE(read);
    CHECK(read.error().code == Errc::no_device);
    CHECK_THAT(read.error().message,
               Catch::Contains("GPU 0 is unusable") && Catch::Contains(std::string(why)));
    auto again =
        gpu.launch(hash, "sum_u64", bytes_of(std::vector<std::uint64_t>{1}), 8, GpuGeometry{}, 1s);
    REQUIRE_FALSE(again);
    CHECK(again.error().code == Errc::no_device);
    auto region = gpu.add_region("more", 64);
    REQUIRE_FALSE(region);
    CHECK(region.error().code == Errc::no_device);
}

} // namespace

TEST_CASE("a faulting GPU kernel is kernel_crashed and poisons the device for good, which does not "
          "try to reset its context",
          "[unit]") {
    fake::Scope fake;
    {
        auto gpu = open_fake(fake);
        const auto hash = load_fake_kernels(*gpu);
        REQUIRE(gpu->add_region("data", 8000));
        REQUIRE(gpu->write("data", 0, pattern(8000, 3)));
        CHECK(gpu->poisoned().empty());

        auto crashed = gpu->launch(hash, "bad_address", {}, 8, GpuGeometry{}, 1s);
        REQUIRE_FALSE(crashed);
        CHECK(crashed.error().code == Errc::kernel_crashed);
        CHECK_THAT(crashed.error().message,
                   Catch::Contains("kernel 'bad_address'") &&
                       Catch::Contains("CUDA_ERROR_ILLEGAL_ADDRESS (700)") &&
                       Catch::Contains("the GPU context is poisoned"));
        check_unusable(*gpu, hash, "CUDA_ERROR_ILLEGAL_ADDRESS");
        CHECK(fake.state.resets == 0);
        CHECK(fake.state.retains == 1);
    }
    CHECK(fake.violations().empty());
}

TEST_CASE("a GPU kernel past its time is kernel_timeout and poisons the device: only the end of "
          "the process stops it",
          "[unit]") {
    fake::Scope fake;
    {
        auto gpu = open_fake(fake);
        const auto hash = load_fake_kernels(*gpu);
        REQUIRE(gpu->add_region("data", 64));

        const auto start = std::chrono::steady_clock::now();
        auto stuck = gpu->launch(hash, "spin_forever", {}, 8, GpuGeometry{}, 20ms);
        const auto waited = std::chrono::steady_clock::now() - start;
        REQUIRE_FALSE(stuck);
        CHECK(stuck.error().code == Errc::kernel_timeout);
        CHECK_THAT(stuck.error().message,
                   Catch::Contains("kernel 'spin_forever' still running after 20 ms") &&
                       Catch::Contains("the GPU context is poisoned"));
        CHECK(waited >= 20ms);
        CHECK(waited < 5s);
        check_unusable(*gpu, hash, "kernel 'spin_forever' still runs");
        CHECK(fake.state.resets == 0);
    }
    CHECK(fake.violations().empty());
}

}  // namespace gpu_recovery_test_cpp
