// The agent's CUDA runtime against the real driver: the driver loader where there is no working
// driver (always runs), the test kernels checked by ptxas where the toolkit is, and GpuDevice on
// a real GPU with hand-written PTX ([needs-gpu]: skipped, exit status 77, where the driver does
// not load).
#include "cuda_api.hpp"
#include "gpu_device.hpp"
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

using namespace bitship;
using namespace bitship::agent;
using namespace bitship::test;
using namespace std::chrono_literals;

namespace {

// The test kernels, each with the parameters every GPU kernel gets: (args, result, regions).
// Assembled by ptxas below where the toolkit is, run on a GPU by the [needs-gpu] cases.
constexpr const char* kTestPtx = R"(.version 8.0
.target sm_90
.address_size 64

// result[0] = args[0] + args[1], by thread 0 of block 0.
.visible .entry sum_u64(.param .u64 sum_args, .param .u64 sum_result, .param .u64 sum_regions)
{
    .reg .pred %p<2>;
    .reg .b32 %r<4>;
    .reg .b64 %rd<8>;
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, %ctaid.x;
    or.b32 %r3, %r1, %r2;
    setp.ne.u32 %p1, %r3, 0;
    @%p1 bra SUM_DONE;
    ld.param.u64 %rd1, [sum_args];
    ld.param.u64 %rd2, [sum_result];
    cvta.to.global.u64 %rd3, %rd1;
    cvta.to.global.u64 %rd4, %rd2;
    ld.global.u64 %rd5, [%rd3];
    ld.global.u64 %rd6, [%rd3+8];
    add.s64 %rd7, %rd5, %rd6;
    st.global.u64 [%rd4], %rd7;
SUM_DONE:
    ret;
}

// Region 0's u64 number i = args[1] + i, for i < args[0]: one thread each.
.visible .entry fill_region(.param .u64 fill_args, .param .u64 fill_result, .param .u64 fill_regions)
{
    .reg .pred %p<2>;
    .reg .b32 %r<5>;
    .reg .b64 %rd<12>;
    ld.param.u64 %rd1, [fill_args];
    ld.param.u64 %rd2, [fill_regions];
    cvta.to.global.u64 %rd3, %rd1;
    cvta.to.global.u64 %rd4, %rd2;
    ld.global.u64 %rd5, [%rd3];
    ld.global.u64 %rd6, [%rd3+8];
    ld.global.u64 %rd7, [%rd4];
    mov.u32 %r1, %ctaid.x;
    mov.u32 %r2, %ntid.x;
    mov.u32 %r3, %tid.x;
    mad.lo.u32 %r4, %r1, %r2, %r3;
    cvt.u64.u32 %rd8, %r4;
    setp.ge.u64 %p1, %rd8, %rd5;
    @%p1 bra FILL_DONE;
    add.s64 %rd9, %rd6, %rd8;
    shl.b64 %rd10, %rd8, 3;
    add.s64 %rd11, %rd7, %rd10;
    st.global.u64 [%rd11], %rd9;
FILL_DONE:
    ret;
}

// Stores to address 8, which no allocation holds: CUDA_ERROR_ILLEGAL_ADDRESS.
.visible .entry bad_address(.param .u64 bad_args, .param .u64 bad_result, .param .u64 bad_regions)
{
    .reg .b64 %rd<3>;
    mov.u64 %rd1, 8;
    mov.u64 %rd2, 42;
    st.global.u64 [%rd1], %rd2;
    ret;
}

// Waits for a value nobody writes: never returns.
.visible .entry spin_forever(.param .u64 spin_args, .param .u64 spin_result, .param .u64 spin_regions)
{
    .reg .pred %p<2>;
    .reg .b64 %rd<4>;
    ld.param.u64 %rd1, [spin_result];
    cvta.to.global.u64 %rd2, %rd1;
SPIN:
    ld.volatile.global.u64 %rd3, [%rd2];
    setp.ne.u64 %p1, %rd3, 12345;
    @%p1 bra SPIN;
    ret;
}
)";

} // namespace

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

// ---------------------------------------------------------------------------------------------
// On a real GPU.

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

TEST_CASE("on a GPU, a PTX kernel runs with its arguments, result and regions, and region reads "
          "and writes round-trip",
          "[gpu][needs-gpu]") {
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

TEST_CASE("on a GPU, an illegal address is kernel_crashed and poisons the device for good",
          "[gpu][needs-gpu]") {
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

TEST_CASE("on a GPU, a kernel that never returns is kernel_timeout after its time",
          "[gpu][needs-gpu]") {
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
