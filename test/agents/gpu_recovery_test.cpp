// GpuDevice (agents/gpu_device.hpp) on the in-process fake driver, when a kernel faults or never
// returns: the call's error, the context recreated, and the device working afterwards; and a
// context that cannot be recreated.
#include "cuda_api.hpp"
#include "gpu_device.hpp"
#include "gpu_test_support.hpp"

#include <atomic>
#include <bitship/bundle.hpp>
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <fmt/format.h>
#include <string>
#include <thread>
#include <vector>

using namespace bitship;
using namespace bitship::agent;
using namespace bitship::test;
using namespace std::chrono_literals;

TEST_CASE("a faulting GPU kernel is kernel_crashed, and the device recreates its context and works "
          "after it",
          "[unit]") {
    fake::Scope fake;
    {
        auto gpu = open_fake(fake);
        const auto hash = load_fake_kernels(*gpu);
        REQUIRE(gpu->add_region("data", 8000));
        const auto data = pattern(8000, 3);
        REQUIRE(gpu->write("data", 0, data));

        auto crashed = gpu->launch(hash, "bad_address", {}, 8, GpuGeometry{}, 1s);
        REQUIRE_FALSE(crashed);
        CHECK(crashed.error().code == Errc::kernel_crashed);
        CHECK_THAT(
            crashed.error().message,
            Catch::Contains("kernel 'bad_address'") &&
                Catch::Contains("CUDA_ERROR_ILLEGAL_ADDRESS (700)") &&
                Catch::Contains("the context was recreated") &&
                Catch::Contains("GPU regions were allocated again (their contents are lost)"));
        CHECK(gpu->context_resets() == 1);
        CHECK(fake.state.resets == 1);

        // The region is there again, zeroed; the module reloads from its PTX when next used; the
        // regions table names the new allocation.
        std::vector<std::byte> back(8000);
        REQUIRE(gpu->read("data", 0, back));
        CHECK(all_zero(back));
        CHECK(gpu->has_module(hash));
        check_sum(*gpu, hash, 40, 2);
        CHECK(fake.state.module_loads == 2);
        CHECK(gpu->modules_loaded() == 1);
        std::vector<std::uint64_t> fill = {10, 100};
        REQUIRE(gpu->launch(hash, "fill_region", bytes_of(fill), 0,
                            GpuGeometry{{1, 1, 1}, {32, 1, 1}}, 1s));
        std::vector<std::uint64_t> values(10);
        REQUIRE(gpu->read("data", 0, std::as_writable_bytes(std::span(values))));
        CHECK(values[9] == 109);
    }
    fake.check_closed_cleanly();
}

TEST_CASE("a GPU kernel past its time is kernel_timeout, and the device recreates its context and "
          "works after it",
          "[unit]") {
    fake::Scope fake;
    {
        auto gpu = open_fake(fake);
        const auto hash = load_fake_kernels(*gpu);

        const auto start = std::chrono::steady_clock::now();
        auto stuck = gpu->launch(hash, "spin_forever", {}, 8, GpuGeometry{}, 20ms);
        const auto waited = std::chrono::steady_clock::now() - start;
        REQUIRE_FALSE(stuck);
        CHECK(stuck.error().code == Errc::kernel_timeout);
        CHECK_THAT(stuck.error().message,
                   Catch::Contains("kernel 'spin_forever' still running after 20 ms") &&
                       Catch::Contains("the context was recreated") &&
                       !Catch::Contains("GPU regions"));
        CHECK(waited >= 20ms);
        CHECK(waited < 5s);
        CHECK(gpu->context_resets() == 1);

        check_sum(*gpu, hash, 2, 3);
    }
    fake.check_closed_cleanly();
}

TEST_CASE(
    "a GPU whose context cannot be recreated says so, and recovers on a later call when it can",
    "[unit]") {
    fake::Scope fake;
    {
        auto gpu = open_fake(fake);
        const auto hash = load_fake_kernels(*gpu);
        REQUIRE(gpu->add_region("data", 64));

        fake.state.refuse_retain = true;
        auto crashed = gpu->launch(hash, "bad_address", {}, 8, GpuGeometry{}, 1s);
        REQUIRE_FALSE(crashed);
        CHECK(crashed.error().code == Errc::kernel_crashed);
        CHECK_THAT(crashed.error().message, Catch::Contains("recreating the context failed"));
        CHECK(gpu->context_resets() == 0);

        std::vector<std::byte> back(64);
        auto unusable = gpu->read("data", 0, back);
        REQUIRE_FALSE(unusable);
        CHECK(unusable.error().code == Errc::no_device);
        CHECK_THAT(unusable.error().message, Catch::Contains("GPU 0 is unusable"));

        fake.state.refuse_retain = false;
        REQUIRE(gpu->read("data", 0, back));
        CHECK(all_zero(back));
        CHECK(gpu->context_resets() == 1);
        check_sum(*gpu, hash, 2, 3);
    }
    fake.check_closed_cleanly();
}
