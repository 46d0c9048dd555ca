// The agent's CUDA runtime against the real driver where it runs everywhere: the driver loader
// where there is no working driver, and the GPU test kernels (gpu_test_ptx.hpp) checked by
// ptxas where the toolkit is. GpuDevice on a real GPU: test/gpu/gpu_device_real_test.cpp.
#include "cuda_api.hpp"
#include "gpu_device.hpp"
#include "gpu_test_ptx.hpp"
#include "gpu_test_support.hpp"

#include <bitship/bundle.hpp>
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fmt/format.h>
#include <fstream>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

namespace gpu_real_test_cpp {

using namespace bitship;
using namespace bitship::agent;
using namespace bitship::test;
using namespace std::chrono_literals;

// ---------------------------------------------------------------------------------------------
// Where there is no working driver.

TEST_CASE("the CUDA driver API loads where there is a driver and is no_device naming the reason "
          "where there is none",
          "[unit]") {
    auto api = CudaApi::load();
    if (api) { // a GPU host
        CHECK((*api)->said(cuda::kErrorIllegalAddress) == "CUDA_ERROR_ILLEGAL_ADDRESS (700)");
        int version = 0;
        CHECK((*api)->cuDriverGetVersion(&version) == cuda::kSuccess);
        CHECK(version > 0);
    } else {
        CHECK(api.error().code == Errc::no_device);
        CHECK_THAT(api.error().message, Catch::StartsWith("no CUDA driver: libcuda.so.1: "));
    }

    // The toolkit's stub exports every entry point and refuses cuInit: reaching cuInit proves
    // each symbol load() resolves (the `_v2` names included) is one the driver exports.
    const std::string stub = "/usr/local/cuda/lib64/stubs/libcuda.so";
    auto stubbed = CudaApi::load(stub);
    REQUIRE_FALSE(stubbed);
    CHECK(stubbed.error().code == Errc::no_device);
    CHECK_THAT(stubbed.error().message, Catch::StartsWith("no CUDA driver: " + stub + ": "));
    if (std::filesystem::exists(stub)) {
        CHECK_THAT(stubbed.error().message, Catch::Contains("cuInit failed: "));
        CHECK_THAT(stubbed.error().message, !Catch::Contains("lacks"));
    }

    auto libm = CudaApi::load("libm.so.6"); // loads, but has no driver API
    REQUIRE_FALSE(libm);
    CHECK(libm.error().code == Errc::no_device);
    CHECK_THAT(
        libm.error().message,
        Catch::StartsWith("no CUDA driver: libm.so.6: it lacks the driver API: no cuInit, "));
    CHECK_THAT(libm.error().message, Catch::EndsWith(" more"));

    auto none = CudaApi::load("libbitship-no-such-driver.so");
    REQUIRE_FALSE(none);
    CHECK(none.error().code == Errc::no_device);
    CHECK_THAT(none.error().message,
               Catch::StartsWith("no CUDA driver: libbitship-no-such-driver.so: "));

    auto device = GpuDevice::open(nullptr, 0);
    REQUIRE_FALSE(device);
    CHECK(device.error().code == Errc::no_device);
}

TEST_CASE("the GPU test kernels are valid PTX for sm_90", "[unit]") {
    const std::filesystem::path ptxas = "/usr/local/cuda/bin/ptxas";
    if (!std::filesystem::exists(ptxas)) {
        WARN("not checked: no " << ptxas << " (CUDA toolkit not installed)");
        return;
    }
    const auto dir =
        std::filesystem::temp_directory_path() / fmt::format("bitship-ptx-{}", ::getpid());
    std::filesystem::create_directories(dir);
    std::ofstream(dir / "kernels.ptx") << kTestPtx;
    const auto command = fmt::format("{} -arch=sm_90 {} -o {} 2>&1", ptxas.string(),
                                     (dir / "kernels.ptx").string(), (dir / "k.cubin").string());
    std::string said;
    FILE* p = ::popen(command.c_str(), "r");
    REQUIRE(p != nullptr);
    char buffer[4096];
    while (auto n = std::fread(buffer, 1, sizeof buffer, p))
        said.append(buffer, n);
    const int status = ::pclose(p);
    std::filesystem::remove_all(dir);
    INFO(said);
    CHECK(status == 0);
}

}  // namespace gpu_real_test_cpp
