// The CUDA driver loader (agents/cuda_driver.hpp): the agent finds the driver at run time and
// says plainly when there is none; it is never linked against libcuda.
#include <catch2/catch.hpp>

#include <cstdio>
#include <filesystem>
#include <string>

#include "cuda_driver.hpp"
#include "launcher.hpp"

namespace cuda_driver_test_cpp {

using namespace bitship;
using namespace bitship::agent;

namespace {

std::string run_ldd(const std::filesystem::path& binary) {
    std::string out;
    FILE* pipe = ::popen(("ldd " + binary.string() + " 2>&1").c_str(), "r");
    REQUIRE(pipe != nullptr);
    char buffer[4096];
    while (std::fgets(buffer, sizeof buffer, pipe)) out += buffer;
    CHECK(::pclose(pipe) == 0);
    return out;
}

} // namespace

TEST_CASE("the CUDA driver loader lists GPUs where there is a driver and says no CUDA driver where there is none",
          "[unit]") {
    auto driver = load_cuda_driver();
    if (driver) { // a GPU host
        CHECK(driver->version > 0);
        for (const auto& d : driver->devices) CHECK(d.cc_major > 0);
        CHECK_THAT(describe(driver), Catch::StartsWith("driver "));
    } else {
        CHECK(driver.error().code == Errc::no_device);
        CHECK_THAT(driver.error().message, Catch::StartsWith("no CUDA driver: libcuda.so.1: "));
        CHECK(describe(driver) == driver.error().message);
    }
}

TEST_CASE("a library that is not a working CUDA driver is no_device with the reason", "[unit]") {
    // The toolkit's stub links but refuses cuInit; where the toolkit is absent, dlopen says why.
    const std::string stub = "/usr/local/cuda/lib64/stubs/libcuda.so";
    auto driver = load_cuda_driver(stub);
    REQUIRE_FALSE(driver);
    CHECK(driver.error().code == Errc::no_device);
    CHECK_THAT(driver.error().message, Catch::StartsWith("no CUDA driver: " + stub + ": "));
    if (std::filesystem::exists(stub)) CHECK_THAT(driver.error().message, Catch::Contains("cuInit failed"));

    auto other = load_cuda_driver("libm.so.6"); // loads, but has no driver API
    REQUIRE_FALSE(other);
    CHECK_THAT(other.error().message, Catch::Contains("lacks the driver API"));
}

TEST_CASE("xagent bitship-compiler and bitship-gpu are not linked against libcuda", "[unit]") {
    const std::filesystem::path xagent = launch::AgentProcess::binary();
    for (const auto& binary : {xagent, xagent.parent_path() / "bitship-compiler", xagent.parent_path() / "bitship-gpu"}) {
        INFO(binary);
        auto deps = run_ldd(binary);
        CHECK_THAT(deps, Catch::Contains("libc.so.6")); // ldd read it
        CHECK_THAT(deps, !Catch::Contains("libcuda"));
    }
}

}  // namespace cuda_driver_test_cpp
