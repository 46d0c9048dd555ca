// A bundle with a CPU and a GPU slice of the same kernel, shipped to an agent with no GPU (this
// machine has no CUDA driver): the CPU slice serves calls that allow it, a call that asks for
// the GPU is refused before it is sent, naming what the agent has, and a GPU slice forced on the
// agent is refused there with no_matching_slice.

#include <catch2/catch.hpp>

#include <bitship/bundle.hpp>
#include <bitship/client.hpp>
#include <device_kernels.hpp>

#include "core/signing.hpp"
#include "core/wire.hpp"
#include "launcher.hpp"
#include "raw_peer.hpp"
#include "test_support.hpp"

namespace gpu_slice_test_cpp {

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

TEST_CASE("a GPU-less agent answers GPU RUNs and GPU region requests with errors that say why, and serves on",
          "[integration][gpu]") {
    AgentProcess agent("tcp");
    test::RawPeer raw("tcp", agent.port());
    auto bundle = device_kernels::bundle();
    auto view = BundleView::parse(bundle);
    REQUIRE(view);
    auto gpu_slice = view->find_slice(kGpuTriple);
    REQUIRE(gpu_slice);
    auto code = extract_slice(*view, *gpu_slice);

    // A RUN that asks for a launch, as a client that believed the agent had a GPU would send it.
    wire::Run run;
    run.hash = view->slices[*gpu_slice].hash;
    run.entry = "twice";
    run.code = code;
    auto author = Identity::load(launch::test_keys().secret); // the agent runs signed code only
    REQUIRE(author);
    run.signatures = {{run.hash, author->public_key(), signing::sign_code(*author, run.hash)}};
    run.gpu = wire::GpuLaunch{};
    raw.send(wire::encode_run(21, run));
    auto [code21, message21] = raw.error_for(21);
    CHECK(code21 == Errc::no_matching_slice);
    CHECK_THAT(message21, Catch::Contains("is a GPU slice and this agent runs no GPU kernels") &&
                              Catch::Contains("no CUDA driver"));

    // A launch of a native kernel (no code) is not a GPU call.
    wire::Run native;
    native.entry = "chase";
    native.gpu = wire::GpuLaunch{};
    raw.send(wire::encode_run(22, native));
    auto [code22, message22] = raw.error_for(22);
    CHECK(code22 == Errc::invalid_argument);
    CHECK_THAT(message22, Catch::Contains("needs shipped code"));

    raw.send(wire::encode_gpu_read(23, {"data", 0, 64}));
    auto [code23, message23] = raw.error_for(23);
    CHECK(code23 == Errc::region_not_found);
    CHECK_THAT(message23, Catch::Contains("no GPU region 'data'"));

    static const std::uint64_t value = 5;
    raw.send(wire::encode_gpu_write(24, {"data", 0, std::as_bytes(std::span(&value, 1))}));
    CHECK(raw.error_for(24).first == Errc::region_not_found);

    auto client = make_client("tcp");
    auto target = client.connect(agent.address());
    REQUIRE(target);
    CHECK(target->info().capabilities.gpu_devices.empty());
    CHECK(target->info().capabilities.gpu_regions.empty());
    auto again = client.ship(device_kernels::twice, *target, std::uint64_t{50}).get_as<std::uint64_t>();
    REQUIRE(again);
    CHECK(*again == 100);
}

TEST_CASE("xagent with a GPU region and no GPU to put it on, or under the sfi sandbox, refuses to start, naming the region and why",
          "[integration][gpu]") {
    auto out = test::run_command(launch::AgentProcess::binary() +
                                 " --transport tcp --listen 127.0.0.1:0 --sandbox none --region data=1M@gpu0 2>&1");
    CHECK(out.status != 0);
    CHECK_THAT(out.text, Catch::Contains("GPU region 'data' is for GPU 0") && Catch::Contains("0 GPU(s)") &&
                             Catch::Contains("no CUDA driver"));
    // Under the sfi sandbox (the default) no GPU kernel runs, GPU or not: it says so first.
    auto confined = test::run_command(launch::AgentProcess::binary() +
                                      " --transport tcp --listen 127.0.0.1:0 --region data=1M@gpu0 2>&1");
    CHECK(confined.status != 0);
    CHECK_THAT(confined.text, Catch::Contains("GPU kernels cannot be confined by --sandbox sfi") &&
                                  Catch::Contains("--sandbox none"));
    auto bad = test::run_command(launch::AgentProcess::binary() + " --transport tcp --listen 127.0.0.1:0 --region data=1M@gpux 2>&1");
    CHECK(bad.status == 2);
    CHECK_THAT(bad.text, Catch::Contains("'@gpux' names no GPU"));
}

}  // namespace gpu_slice_test_cpp
