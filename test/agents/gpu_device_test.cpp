// GpuDevice (agents/gpu_device.hpp) on the in-process fake driver (fake_cuda/recording_driver.hpp):
// opening and closing, region buffers, a launch's arguments, result, regions and geometry, what
// a bad launch is told, and calls from many threads. Recovery from a faulting or hung kernel is
// gpu_recovery_test.cpp; the same device on a real GPU is gpu_real_test.cpp.
#include "cuda_api.hpp"
#include "gpu_device.hpp"
#include "gpu_test_support.hpp"

#include <algorithm>
#include <atomic>
#include <bitship/bundle.hpp>
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fmt/format.h>
#include <span>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

namespace gpu_device_test_cpp {

using namespace bitship;
using namespace bitship::agent;
using namespace bitship::test;
using namespace std::chrono_literals;

TEST_CASE("a GPU device opens with the driver's limits and leaves nothing behind when closed",
          "[unit]") {
    fake::Scope fake;
    CHECK(fake.table->said(cuda::kErrorIllegalAddress) == "CUDA_ERROR_ILLEGAL_ADDRESS (700)");
    CHECK(fake.table->said(12345) == "CUDA error 12345");
    {
        auto gpu = open_fake(fake);
        CHECK(gpu->ordinal() == 0);
        CHECK(gpu->name() == "Fake GPU");
        CHECK(gpu->sm() == 90);
        CHECK(gpu->multiprocessors() == 132);
        CHECK(gpu->memory_bytes() == std::uint64_t{80} << 30);
        const auto g = gpu->default_geometry();
        CHECK(g.grid[0] == 8 * 132);
        CHECK(g.block[0] == 256);
        CHECK((g.grid[1] == 1 && g.grid[2] == 1 && g.block[1] == 1 && g.block[2] == 1));
        REQUIRE(gpu->add_region("data", 4096));
        REQUIRE(gpu->load_module(hash_of(fake::kFakePtx), fake::kFakePtx));
        REQUIRE(
            gpu->launch(hash_of(fake::kFakePtx), "sum_u64", bytes_of(sum_args(1, 2)), 8, g, 1s));
        auto l = fake::lock();
        CHECK(fake.state.retains == 1);
        CHECK(fake.state.pinned.size() == 2); // the two staging buffers
    }
    fake.check_closed_cleanly();

    auto missing = GpuDevice::open(fake.table, 1);
    REQUIRE_FALSE(missing);
    CHECK(missing.error().code == Errc::no_device);
    CHECK_THAT(missing.error().message,
               Catch::Contains("GPU 1") && Catch::Contains("CUDA_ERROR_INVALID_DEVICE (101)"));

    fake.state.refuse_retain = true;
    auto refused = GpuDevice::open(fake.table, 0);
    REQUIRE_FALSE(refused);
    CHECK(refused.error().code == Errc::no_device);
    CHECK_THAT(refused.error().message,
               Catch::Contains("cuDevicePrimaryCtxRetain failed: CUDA_ERROR_OUT_OF_MEMORY"));
}

TEST_CASE(
    "GPU regions start zeroed, and reads and writes of any size cross the staging buffers intact",
    "[unit]") {
    fake::Scope fake;
    {
        auto gpu = open_fake(fake);
        const std::uint64_t size =
            (std::uint64_t{20} << 20) + 4096 + 123; // two and a half staging buffers
        REQUIRE(gpu->add_region("data", size));
        REQUIRE(gpu->add_region("small", 64));
        CHECK(gpu->region("small")->index == 1);
        CHECK(gpu->region("data")->size == size);
        CHECK_FALSE(gpu->region("other"));
        REQUIRE(gpu->regions().size() == 2);
        CHECK(gpu->regions()[0].name == "data");

        std::vector<std::byte> all(size, std::byte{0xFF});
        REQUIRE(gpu->read("data", 0, all));
        CHECK(all_zero(all));

        // Writes and reads of many sizes, each at an odd offset: one byte, under a staging buffer,
        // exactly one, and several with a remainder.
        for (std::size_t n : {std::size_t{1}, std::size_t{1000}, std::size_t{8} << 20,
                              (std::size_t{17} << 20) + 5}) {
            INFO("bytes " << n);
            const std::uint64_t offset = 4097;
            const auto data = pattern(n, static_cast<unsigned>(n));
            REQUIRE(gpu->write("data", offset, data));
            std::vector<std::byte> back(n);
            REQUIRE(gpu->read("data", offset, back));
            CHECK((back == data)); // a bool: Catch would print every byte
        }
        REQUIRE(gpu->read("data", 0, all));
        CHECK(all_zero(std::span(all).first(4097)));

        std::vector<std::byte> two(2);
        auto past = gpu->read("data", size - 1, two);
        REQUIRE_FALSE(past);
        CHECK(past.error().code == Errc::invalid_argument);
        CHECK_THAT(past.error().message, Catch::Contains("outside region 'data'"));
        auto wrapped = gpu->write("data", ~std::uint64_t{0}, two); // offset + size overflows
        REQUIRE_FALSE(wrapped);
        CHECK(wrapped.error().code == Errc::invalid_argument);
        CHECK(gpu->read("data", size, std::span<std::byte>()).has_value()); // nothing, at the end
        auto unknown = gpu->read("nope", 0, two);
        REQUIRE_FALSE(unknown);
        CHECK(unknown.error().code == Errc::invalid_argument);

        auto duplicate = gpu->add_region("data", 16);
        REQUIRE_FALSE(duplicate);
        CHECK(duplicate.error().code == Errc::invalid_argument);
        auto empty = gpu->add_region("empty", 0);
        REQUIRE_FALSE(empty);
        CHECK(empty.error().code == Errc::invalid_argument);
        auto huge = gpu->add_region("huge", std::uint64_t{1} << 40);
        REQUIRE_FALSE(huge);
        CHECK(huge.error().code == Errc::no_device);
        CHECK_THAT(huge.error().message, Catch::Contains("CUDA_ERROR_OUT_OF_MEMORY (2)"));
        CHECK_FALSE(gpu->region("huge"));
    }
    fake.check_closed_cleanly();
}

TEST_CASE("reads and writes and launch arguments in memory pin() registered go by one DMA "
          "straight there intact and the pin is let go with the device",
          "[unit]") {
    fake::Scope fake;
    {
        // Made before the device, so it outlives the device's pin.
        const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
        const std::size_t size = std::size_t{20} << 20; // more than two staging buffers
        struct Free {
            void operator()(std::byte* p) const noexcept { std::free(p); }
        };
        std::unique_ptr<std::byte, Free> memory(static_cast<std::byte*>(std::aligned_alloc(page, size)));
        REQUIRE(memory);
        auto gpu = open_fake(fake);
        const std::span<std::byte> window(memory.get(), size);
        REQUIRE(gpu->pin(window));
        REQUIRE(gpu->add_region("data", size));
        const auto data = pattern(size - 4096, 7);
        std::memcpy(window.data() + 4096, data.data(), data.size());
        auto count = [&] {
            auto l = fake::lock();
            return fake.state.host_copies.size();
        };
        auto last_copy = [&] {
            auto l = fake::lock();
            return fake.state.host_copies.back();
        };
        std::size_t before = count();
        REQUIRE(gpu->write("data", 1, window.subspan(4096)));
        CHECK(count() == before + 1); // one DMA, not one per staging buffer
        CHECK(last_copy() == window.data() + 4096);
        std::memset(window.data(), 0, size);
        before = count();
        REQUIRE(gpu->read("data", 1, window.first(data.size())));
        CHECK(count() == before + 1);
        CHECK(last_copy() == window.data());
        CHECK(std::memcmp(window.data(), data.data(), data.size()) == 0);
        // Memory outside the pin still goes through the staging buffers, intact.
        std::vector<std::byte> back(data.size());
        before = count();
        REQUIRE(gpu->read("data", 1, back));
        CHECK(count() == before + 3); // 8 + 8 + the rest of 20 MiB
        CHECK((back == data));
        // A launch's arguments in the pin go straight from it.
        const auto hash = hash_of(fake::kFakePtx);
        REQUIRE(gpu->load_module(hash, fake::kFakePtx));
        const std::vector<std::uint64_t> args{3, 4};
        std::memcpy(window.data(), args.data(), 16);
        before = count();
        REQUIRE(gpu->launch(hash, "sum_u64", window.first(16), 8, GpuGeometry{}, 1s));
        auto l = fake::lock(); // after the regions table's upload, the arguments' from the pin
        const auto& copies = fake.state.host_copies;
        CHECK(std::find(copies.begin() + static_cast<std::ptrdiff_t>(before), copies.end(),
                        static_cast<const void*>(window.data())) != copies.end());
    }
    fake.check_closed_cleanly(); // the pin too
}

TEST_CASE("a GPU kernel gets its arguments, a zeroed result, the regions table and its geometry",
          "[unit]") {
    fake::Scope fake;
    {
        auto gpu = open_fake(fake);
        const auto hash = hash_of(fake::kFakePtx);
        CHECK_FALSE(gpu->has_module(hash));
        REQUIRE(gpu->load_module(hash, fake::kFakePtx));
        REQUIRE(gpu->load_module(hash, fake::kFakePtx)); // loaded already: nothing to do
        CHECK(gpu->has_module(hash));
        CHECK(gpu->modules_loaded() == 1);
        CHECK(fake.state.module_loads == 1);
        const auto one = GpuGeometry{};

        auto sum = gpu->launch(hash, "sum_u64", bytes_of(sum_args(40, 2)), 8, one, 1s);
        REQUIRE(sum);
        REQUIRE(sum->size() == 8);
        CHECK(u64_at(*sum) == 42);

        // A region added after launches is in the next launch's table.
        REQUIRE(gpu->add_region("data", 8000));
        std::vector<std::uint64_t> fill = {1000, 7};
        auto filled = gpu->launch(hash, "fill_region", bytes_of(fill), 0,
                                  GpuGeometry{{4, 1, 1}, {256, 1, 1}}, 1s);
        REQUIRE(filled);
        CHECK(filled->empty());
        std::vector<std::uint64_t> values(1000);
        REQUIRE(gpu->read("data", 0, std::as_writable_bytes(std::span(values))));
        CHECK(values[0] == 7);
        CHECK(values[999] == 1006);

        GpuGeometry g{{3, 5, 7}, {32, 4, 2}};
        auto geometry = gpu->launch(hash, "geometry", {}, 48, g, 1s);
        REQUIRE(geometry);
        CHECK(u64_at(*geometry, 0) == 3);
        CHECK(u64_at(*geometry, 2) == 7);
        CHECK(u64_at(*geometry, 3) == 32);
        CHECK(u64_at(*geometry, 5) == 2);

        // A result over a staging buffer comes back whole, and zeroed where the kernel wrote
        // nothing (new device memory is not zeros in the fake).
        auto big = gpu->launch(hash, "sum_u64", bytes_of(sum_args(1, 1)), 9u << 20, one, 1s);
        REQUIRE(big);
        REQUIRE(big->size() == 9u << 20);
        CHECK(u64_at(*big) == 2);
        CHECK(all_zero(std::span(*big).subspan(8)));

        // A kernel the stream needs many polls for is waited for.
        auto slow = gpu->launch(hash, "slow", {}, 8, one, 10s);
        REQUIRE(slow);
        CHECK(u64_at(*slow) == 7);
        CHECK(gpu->launches() == 5);
        CHECK(gpu->poisoned().empty());
    }
    fake.check_closed_cleanly();
}

TEST_CASE("a GPU launch names what is wrong: an unknown kernel or module, a geometry over the "
          "limits, bad PTX",
          "[unit]") {
    fake::Scope fake;
    auto gpu = open_fake(fake);
    const auto hash = hash_of(fake::kFakePtx);
    REQUIRE(gpu->load_module(hash, fake::kFakePtx));
    const auto args = sum_args(1, 2);

    auto unknown = gpu->launch(hash, "nope", bytes_of(args), 8, GpuGeometry{}, 1s);
    REQUIRE_FALSE(unknown);
    CHECK(unknown.error().code == Errc::entry_not_found);
    CHECK_THAT(unknown.error().message, Catch::Contains("has no kernel 'nope'"));

    auto not_loaded =
        gpu->launch(hash_of("other"), "sum_u64", bytes_of(args), 8, GpuGeometry{}, 1s);
    REQUIRE_FALSE(not_loaded);
    CHECK(not_loaded.error().code == Errc::entry_not_found);
    CHECK_THAT(not_loaded.error().message, Catch::Contains("is not loaded"));

    for (const auto& g :
         {GpuGeometry{{0, 1, 1}, {1, 1, 1}}, GpuGeometry{{1, 1, 1}, {1, 0, 1}},
          GpuGeometry{{1, 1, 1}, {2048, 1, 1}}, GpuGeometry{{1, 1, 1}, {32, 32, 2}},
          GpuGeometry{{1, 65536, 1}, {1, 1, 1}}, GpuGeometry{{1, 1, 1}, {1, 1, 65}}}) {
        auto refused = gpu->launch(hash, "sum_u64", bytes_of(args), 8, g, 1s);
        INFO(g.grid[0] << "x" << g.grid[1] << "x" << g.grid[2] << " by " << g.block[0] << "x"
                       << g.block[1] << "x" << g.block[2]);
        REQUIRE_FALSE(refused);
        CHECK(refused.error().code == Errc::invalid_argument);
    }

    auto heavy = gpu->launch(hash, "heavy", {}, 0, GpuGeometry{{1, 1, 1}, {512, 1, 1}}, 1s);
    REQUIRE_FALSE(heavy);
    CHECK(heavy.error().code == Errc::invalid_argument);
    CHECK_THAT(heavy.error().message, Catch::Contains("CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES (701)"));
    CHECK(gpu->launch(hash, "heavy", {}, 0, GpuGeometry{{1, 1, 1}, {256, 1, 1}}, 1s).has_value());

    const std::string bad = "// a syntax error\n.visible .entry broken(...)\n";
    auto refused = gpu->load_module(hash_of(bad), bad);
    REQUIRE_FALSE(refused);
    CHECK(refused.error().code == Errc::compile_failed);
    CHECK_THAT(refused.error().message, Catch::Contains("CUDA_ERROR_INVALID_PTX (218)") &&
                                            Catch::Contains("line 3; error   : syntax error"));
    CHECK_FALSE(gpu->has_module(hash_of(bad)));
    CHECK(gpu->modules_loaded() == 1);
    CHECK(gpu->poisoned().empty());

    // Unloaded, a module is gone (its driver module with it); unloading twice is no error.
    REQUIRE(gpu->unload_module(hash));
    CHECK_FALSE(gpu->has_module(hash));
    {
        auto l = fake::lock();
        CHECK(fake.state.modules.empty());
    }
    auto gone = gpu->launch(hash, "sum_u64", bytes_of(args), 8, GpuGeometry{}, 1s);
    REQUIRE_FALSE(gone);
    CHECK(gone.error().code == Errc::entry_not_found);
    CHECK(gpu->unload_module(hash));
    REQUIRE(gpu->load_module(hash, fake::kFakePtx)); // and loads again
    CHECK(gpu->launch(hash, "sum_u64", bytes_of(args), 8, GpuGeometry{}, 1s).has_value());
    CHECK(fake.violations().empty());
}

TEST_CASE("GPU calls from many threads take turns on the stream, each making the context current "
          "on its thread",
          "[unit]") {
    fake::Scope fake;
    {
        auto gpu = open_fake(fake);
        const auto hash = load_fake_kernels(*gpu);
        REQUIRE(gpu->add_region("data", std::uint64_t{1} << 20));
        constexpr int kThreads = 6, kCalls = 40;
        std::atomic<int> wrong{0};
        std::vector<std::thread> threads;
        for (int t = 0; t < kThreads; ++t) {
            threads.emplace_back([&, t] {
                const auto mine = pattern(4096, static_cast<unsigned>(t) + 100);
                std::vector<std::byte> back(4096);
                for (int i = 0; i < kCalls; ++i) {
                    auto sum = gpu->launch(hash, "sum_u64", bytes_of(sum_args(t, i)), 8,
                                           GpuGeometry{}, 1s);
                    if (!sum || u64_at(*sum) != static_cast<std::uint64_t>(t + i)) ++wrong;
                    const std::uint64_t offset = static_cast<std::uint64_t>(t) * 8192 + 1;
                    if (!gpu->write("data", offset, mine) || !gpu->read("data", offset, back) ||
                        back != mine)
                        ++wrong;
                }
            });
        }
        for (auto& t : threads)
            t.join();
        CHECK(wrong == 0);
        CHECK(gpu->launches() == kThreads * kCalls);
    }
    fake.check_closed_cleanly();
}

}  // namespace gpu_device_test_cpp
