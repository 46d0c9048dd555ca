// A bundle with a CPU and a GPU slice of the same kernel, shipped to an agent with no GPU (this
// machine has no CUDA driver): the CPU slice serves calls that allow it, a call that asks for
// the GPU is refused before it is sent, naming what the agent has, and a GPU slice forced on the
// agent is refused there with no_matching_slice.

#include <catch2/catch.hpp>

#include <bitship/bundle.hpp>
#include <bitship/client.hpp>
#include <device_kernels.hpp>

#include "launcher.hpp"
#include "test_support.hpp"

using namespace bitship;
using bitship::launch::AgentProcess;
using bitship::test::make_client;

TEST_CASE("a GPU-less agent runs the CPU slice when the call allows either, and refuses the GPU slice by name",
          "[integration][gpu]") {
    AgentProcess agent("tcp");
    auto client = make_client("tcp");
    auto target = client.connect(agent.address());
    INFO(agent.log());
    REQUIRE(target);
    CHECK(target->info().capabilities.gpus == 0);

    for (auto device : {Device::any, Device::cpu}) {
        ShipOptions o;
        o.device = device;
        auto r = client.ship(device_kernels::twice, *target, o, std::uint64_t{21}).get_as<std::uint64_t>();
        REQUIRE(r);
        CHECK(*r == 42);
    }

    ShipOptions gpu;
    gpu.device = Device::gpu;
    auto refused = client.ship(device_kernels::twice, *target, gpu, std::uint64_t{21}).get();
    REQUIRE_FALSE(refused);
    CHECK(refused.error().code == Errc::no_matching_slice);
    CHECK_THAT(refused.error().message, Catch::Contains("asks for a GPU") && Catch::Contains("has an nvptx64 slice") &&
                                            Catch::Contains("0 GPU(s)"));

    // The GPU slice itself, forced on the agent: refused there, naming what it is.
    auto bundle = device_kernels::bundle();
    auto view = BundleView::parse(bundle);
    REQUIRE(view);
    auto gpu_slice = view->find_slice(kGpuTriple);
    REQUIRE(gpu_slice);
    auto forced = client.ship_slice(bundle, *gpu_slice, "twice", *target, Client::pack_args(std::uint64_t{21})).get();
    REQUIRE_FALSE(forced);
    CHECK(forced.error().code == Errc::no_matching_slice);
    CHECK_THAT(forced.error().message, Catch::Contains("is for an NVIDIA GPU (nvptx64-nvidia-cuda)"));

    // And the agent serves on.
    auto again = client.ship(device_kernels::twice, *target, std::uint64_t{50}).get_as<std::uint64_t>();
    REQUIRE(again);
    CHECK(*again == 100);
}
