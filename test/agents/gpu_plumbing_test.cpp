// GPU plumbing tests: real xagent processes started with `--cuda-library` pointing at a fake CUDA
// driver (fake_cuda/fake_libcuda.cpp), so the GPU path runs end to end where there is no GPU.
//
// THE FAKE EXECUTES NO PTX. It checks that what reaches it is PTX text with the entry asked for
// and the bitship kernel ABI, and "runs" a few kernels by name from a built-in table (its header
// lists them). What these tests prove is the path between the client and the driver: the
// client's slice choice for a GPU agent, the RUN's launch block reaching cuLaunchKernel, PTX made
// by the confined compiler process reaching cuModuleLoadDataEx, GPU_READ and GPU_WRITE through a
// live agent, WELCOME's GPU list, and one compile for concurrent first calls. What happens after
// a fault, a timeout or the GPU process's death: gpu_process_restart_test.cpp. test/gpu runs
// the real thing on a GPU.
#include "core/wire.hpp"
#include "cuda_api.hpp"
#include "gpu_plumbing_support.hpp"
#include "launcher.hpp"
#include "raw_peer.hpp"
#include "test_support.hpp"

#include <algorithm>
#include <behaviour_kernels.hpp>
#include <bitship/bundle.hpp>
#include <bitship/client.hpp>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <device_kernels.hpp>
#include <dlfcn.h>
#include <fstream>
#include <gpu_ops_kernels.hpp>
#include <latch>
#include <thread>
#include <vector>

namespace gpu_plumbing_test_cpp {

using namespace bitship;
using bitship::launch::AgentProcess;
using bitship::test::agent_counters;
using bitship::test::connect;
using bitship::test::make_client;
using namespace bitship::test::gpu_plumbing;

namespace {

/// The NUMA node sysfs gives the fake GPU's PCI address, as the agent reads it; -1 when none.
std::int32_t sysfs_numa_node() {
    std::ifstream in(std::string("/sys/bus/pci/devices/") + kFakeBusId + "/numa_node");
    int node = -1;
    if (!(in >> node)) return -1;
    return node;
}

} // namespace

TEST_CASE("gpu plumbing (fake driver): WELCOME lists the driver's GPU and the GPU region, and "
          "REGION says GPU 0",
          "[integration][gpu]") {
    const std::string transport = GENERATE(as<std::string>{}, "tcp", "shm");
    INFO(transport);
    FakeGpuAgent g(transport);
    const auto& caps = g.target.info().capabilities;
    REQUIRE(caps.gpus == 1);
    REQUIRE(caps.gpu_devices.size() == 1);
    const auto& gpu = caps.gpu_devices[0];
    CHECK(gpu.name == kFakeName);
    CHECK(gpu.sm == kFakeSm);
    CHECK(gpu.multiprocessors == kFakeMultiprocessors);
    CHECK(gpu.memory_bytes == std::uint64_t{1} << 30);
    CHECK(gpu.numa_node == sysfs_numa_node());
    REQUIRE(caps.gpu_regions.size() == 1);
    CHECK(caps.gpu_regions[0].name == "data");
    CHECK(caps.gpu_regions[0].size == kRegionBytes);
    CHECK(caps.gpu_regions[0].device == 0);

    auto region = g.client.region(g.target, "data");
    REQUIRE(region);
    CHECK(region->gpu);
    CHECK(region->gpu_index == 0);
    CHECK(region->size == kRegionBytes);
    CHECK((region->packed_rkey == nullptr || region->packed_rkey->empty())); // no RDMA reaches it
}

TEST_CASE("gpu plumbing (fake driver): Device::gpu runs the nvptx64 slice compiled once to PTX, "
          "Device::any the CPU "
          "slice",
          "[integration][gpu]") {
    const std::string transport = GENERATE(as<std::string>{}, "tcp", "shm");
    INFO(transport);
    FakeGpuAgent g(transport);

    // The RUN carried the launch, the compiler process made PTX and the fake found `.entry twice`
    // with the ABI's three parameters, and read the argument through the first one.
    auto first = g.client.ship(device_kernels::twice, g.target, on_gpu(), std::uint64_t{21})
                     .get_as<std::uint64_t>();
    INFO((first ? std::string() : first.error().describe()) << "\n" << g.agent.log());
    REQUIRE(first);
    CHECK(*first == 42);
    auto counters = agent_counters(g.client, g.target);
    CHECK(counters["gpu_runs"] == 1);
    CHECK(counters["gpu_compiles"] == 1);
    CHECK(counters["gpu_compile_failures"] == 0);
    CHECK(counters["last_gpu_ptx_ns"] > 0);
    CHECK(counters["runs"] == 1);

    // Device::any takes the CPU slice on an agent with both: a RUN, and no GPU launch.
    ShipOptions any;
    any.device = Device::any;
    auto cpu = g.client.ship(device_kernels::twice, g.target, any, std::uint64_t{50})
                   .get_as<std::uint64_t>();
    REQUIRE(cpu);
    CHECK(*cpu == 100);
    counters = agent_counters(g.client, g.target);
    CHECK(counters["runs"] == 2);
    CHECK(counters["gpu_runs"] == 1);

    // The module is loaded: a second GPU call compiles nothing.
    auto again = g.client.ship(device_kernels::twice, g.target, on_gpu(), std::uint64_t{1000})
                     .get_as<std::uint64_t>();
    REQUIRE(again);
    CHECK(*again == 2000);
    counters = agent_counters(g.client, g.target);
    CHECK(counters["gpu_runs"] == 2);
    CHECK(counters["gpu_compiles"] == 1);

    // Large arguments and results (through the bulk window, over shared memory) reach the kernel
    // and come back whole.
    for (int i = 0; i < 3; ++i) {
        Bytes args(kLargeBytes);
        const std::uint64_t x = 7 + i;
        std::memcpy(args.data(), &x, sizeof x);
        auto big_args = g.client.ship_bytes(device_kernels::twice, g.target, args, on_gpu()).get();
        INFO(said(big_args));
        REQUIRE(big_args);
        CHECK(u64(*big_args) == 2 * x);
        auto big_result =
            g.client.ship(gpu_ops_kernels::where, g.target, on_gpu(kLargeBytes)).get();
        INFO(said(big_result));
        REQUIRE(big_result);
        REQUIRE(big_result->size() == kLargeBytes);
        CHECK(u64(*big_result, 0) == 1);
        CHECK(std::all_of(big_result->begin() + 24, big_result->end(),
                          [](std::byte b) { return b == std::byte{0}; }));
    }
    if (transport == "shm") {
        counters = agent_counters(g.client, g.target);
        CHECK(counters["window_args"] >= 1);
        CHECK(counters["window_results"] >= 1);
    }
    CHECK(g.stops_cleanly());
}

TEST_CASE("gpu plumbing (fake driver): the launch geometry asked for reaches the driver, the "
          "default is the "
          "device's, and one over its limits is refused",
          "[integration][gpu]") {
    FakeGpuAgent g;
    auto o = on_gpu(3 * sizeof(std::uint64_t));
    o.grid = {4, 1, 1};
    o.block = {64, 1, 1};
    auto asked = g.client.ship(gpu_ops_kernels::where, g.target, o).get();
    INFO(said(asked) << "\n" << g.agent.log());
    REQUIRE(asked);
    CHECK(u64(*asked, 0) == 1);
    CHECK(u64(*asked, 1) == 4);
    CHECK(u64(*asked, 2) == 64);

    // No geometry: 256 threads a block, 8 blocks per multiprocessor.
    o.grid = {};
    o.block = {};
    auto dflt = g.client.ship(gpu_ops_kernels::where, g.target, o).get();
    REQUIRE(dflt);
    CHECK(u64(*dflt, 0) == 1);
    CHECK(u64(*dflt, 1) == 8ull * kFakeMultiprocessors);
    CHECK(u64(*dflt, 2) == 256);
    // A kernel that declares its geometry (BS_GPU_GEOMETRY(where_declared, 128, 2)): the agent
    // read it from the PTX its compiler made.
    auto declared = g.client.ship(gpu_ops_kernels::where_declared, g.target, o).get();
    INFO((declared ? std::string() : declared.error().describe()));
    REQUIRE(declared);
    CHECK(u64(*declared, 1) == 2ull * kFakeMultiprocessors);
    CHECK(u64(*declared, 2) == 128);

    // 2048 threads a block: over the block's x limit, and over the threads a block.
    o.block = {2048, 1, 1};
    auto wide = g.client.ship(gpu_ops_kernels::where, g.target, o).get();
    REQUIRE_FALSE(wide);
    CHECK(wide.error().code == Errc::invalid_argument);
    CHECK_THAT(wide.error().message,
               Catch::Contains("block 2048x1x1 is over the device's limits") &&
                   Catch::Contains("block 1024x1024x64"));
    o.block = {64, 32, 1};
    auto many = g.client.ship(gpu_ops_kernels::where, g.target, o).get();
    REQUIRE_FALSE(many);
    CHECK(many.error().code == Errc::invalid_argument);
    CHECK_THAT(many.error().message,
               Catch::Contains("has 2048 threads a block, over the device's 1024"));
    // The y and z dimensions travel too.
    o.grid = {1, 65536, 1};
    o.block = {1, 1, 1};
    auto tall = g.client.ship(gpu_ops_kernels::where, g.target, o).get();
    REQUIRE_FALSE(tall);
    CHECK(tall.error().code == Errc::invalid_argument);
    CHECK_THAT(tall.error().message,
               Catch::Contains("grid 1x65536x1, block 1x1x1 is over the device's limits"));
    o.grid = {1, 1, 1};
    o.block = {1, 1, 65};
    auto deep = g.client.ship(gpu_ops_kernels::where, g.target, o).get();
    REQUIRE_FALSE(deep);
    CHECK(deep.error().code == Errc::invalid_argument);
    CHECK_THAT(deep.error().message, Catch::Contains("block 1x1x65 is over the device's limits"));

    // Refused by the client before anything is sent: a GPU the agent does not have, a result over
    // its limit, a bundle without a GPU slice.
    const auto runs = g.counter("runs");
    auto second_gpu = on_gpu();
    second_gpu.gpu_device = 1;
    auto no_gpu1 = g.client.ship(gpu_ops_kernels::where, g.target, second_gpu).get();
    REQUIRE_FALSE(no_gpu1);
    CHECK(no_gpu1.error().code == Errc::no_device);
    auto huge =
        g.client.ship(gpu_ops_kernels::where, g.target, on_gpu(g.target.info().max_result + 1))
            .get();
    REQUIRE_FALSE(huge);
    CHECK(huge.error().code == Errc::too_large);
    auto cpu_only =
        g.client
            .ship(behaviour_kernels::add, g.target, on_gpu(), std::uint64_t{2}, std::uint64_t{3})
            .get();
    REQUIRE_FALSE(cpu_only);
    CHECK(cpu_only.error().code == Errc::no_matching_slice);
    CHECK_THAT(cpu_only.error().message,
               Catch::Contains("the bundle has no nvptx64 slice") && Catch::Contains("1 GPU(s)"));
    CHECK(g.counter("runs") == runs);

    // A kernel the PTX does not have: the driver's CUDA_ERROR_NOT_FOUND, as entry_not_found.
    auto missing = g.client
                       .ship_bytes(Kernel{gpu_ops_kernels::bundle, "no_such_kernel"}, g.target,
                                   Client::pack_args(std::uint64_t{1}), on_gpu())
                       .get();
    REQUIRE_FALSE(missing);
    CHECK(missing.error().code == Errc::entry_not_found);
    CHECK_THAT(missing.error().message, Catch::Contains("has no kernel 'no_such_kernel'"));

    // And the agent serves on.
    auto after = g.client.ship(gpu_ops_kernels::where, g.target, on_gpu(24)).get();
    REQUIRE(after);
    CHECK(u64(*after, 0) == 1);
}

TEST_CASE("gpu plumbing (fake driver): GPU region puts and gets round trip through the agent, "
          "kernels see them, and "
          "out-of-range ones are refused",
          "[integration][gpu]") {
    FakeGpuAgent g;
    auto region = g.client.region(g.target, "data");
    REQUIRE(region);

    // GPU memory is never mapped into the client (its key is empty: unpacking it crashed).
    auto mapped = g.client.mapped(*region);
    REQUIRE(mapped);
    CHECK_FALSE(*mapped);

    // Several chunks in flight each way.
    Bytes pattern(kRegionBytes);
    for (std::size_t i = 0; i < pattern.size(); ++i)
        pattern[i] = static_cast<std::byte>((i * 131 + (i >> 12)) >> 3);
    std::vector<Future> puts;
    for (std::uint64_t off = 0; off < kRegionBytes; off += kChunk)
        puts.push_back(g.client.put(*region, off,
                                    Bytes(pattern.begin() + off, pattern.begin() + off + kChunk)));
    for (auto& f : puts) {
        auto r = f.get();
        INFO(said(r));
        REQUIRE(r);
    }
    std::vector<Future> gets;
    for (std::uint64_t off = 0; off < kRegionBytes; off += kChunk)
        gets.push_back(g.client.get(*region, off, kChunk));
    Bytes back;
    for (auto& f : gets) {
        auto b = f.get();
        INFO(said(b));
        REQUIRE(b);
        back.insert(back.end(), b->begin(), b->end());
    }
    CHECK(back == pattern);
    CHECK(g.counter("gpu_writes") == kRegionBytes / kChunk);
    CHECK(g.counter("gpu_reads") == kRegionBytes / kChunk);
    // 64 KiB reads are answered from the GPU process's window while a read slot is free.
    CHECK(g.counter("gpu_window_reads") >= 1);
    CHECK(g.counter("gpu_window_reads") <= kRegionBytes / kChunk);

    // A kernel's regions[0] is the memory the puts wrote.
    std::uint64_t expected = 0;
    for (std::uint64_t i = 0; i < kRegionU64s; ++i) {
        std::uint64_t v = 0;
        std::memcpy(&v, pattern.data() + i * sizeof v, sizeof v);
        expected += v;
    }
    auto sum = g.client.ship(gpu_ops_kernels::sum_u64, g.target, on_gpu(), kRegionU64s).get();
    INFO(said(sum) << "\n" << g.agent.log());
    REQUIRE(sum);
    CHECK(u64(*sum) == expected);

    // And a get sees what a kernel wrote.
    auto filled = g.client
                      .ship(gpu_ops_kernels::fill_u64, g.target, on_gpu(), kRegionU64s,
                            std::uint64_t{3}, std::uint64_t{1})
                      .get();
    INFO(said(filled));
    REQUIRE(filled);
    sum = g.client.ship(gpu_ops_kernels::sum_u64, g.target, on_gpu(), kRegionU64s).get();
    REQUIRE(sum);
    CHECK(u64(*sum) == filled_sum(kRegionU64s, 3, 1));
    auto tail = g.client.get(*region, kRegionBytes - 16, 16).get();
    REQUIRE(tail);
    CHECK(u64(*tail, 0) == (kRegionU64s - 2) * 3 + 1);
    CHECK(u64(*tail, 1) == (kRegionU64s - 1) * 3 + 1);

    // Out of range: the client refuses it before sending...
    auto past = g.client.get(*region, kRegionBytes - 8, 16).get();
    REQUIRE_FALSE(past);
    CHECK(past.error().code == Errc::out_of_bounds);
    auto put_past = g.client.put(*region, kRegionBytes, Bytes(8)).get();
    REQUIRE_FALSE(put_past);
    CHECK(put_past.error().code == Errc::out_of_bounds);

    // ...and the agent refuses one sent anyway (GPU_READ needs no signature).
    test::RawPeer raw("tcp", g.agent.port());
    raw.send(wire::encode_gpu_read(41, {"data", kRegionBytes - 8, 16}));
    auto [code, message] = raw.error_for(41);
    CHECK(code == Errc::invalid_argument);
    CHECK_THAT(message, Catch::Contains("outside region 'data'"));
    static const std::uint64_t value = 7;
    raw.send(wire::encode_gpu_write(
        42, {"data", ~std::uint64_t{0} - 3, std::as_bytes(std::span(&value, 1))}));
    auto [write_code, write_message] = raw.error_for(42);
    CHECK(write_code == Errc::invalid_argument);
    CHECK_THAT(write_message, Catch::Contains("outside region 'data'"));

    // Nothing of that reached the memory.
    auto still = g.client.ship(gpu_ops_kernels::sum_u64, g.target, on_gpu(), kRegionU64s).get();
    REQUIRE(still);
    CHECK(u64(*still) == filled_sum(kRegionU64s, 3, 1));
}

TEST_CASE("gpu plumbing (fake driver): reads answered from the GPU process's window arrive whole with more in "
          "flight than it has read slots, and a client that leaves mid-read gives its slots back",
          "[integration][gpu]") {
    constexpr std::uint64_t kBig = std::uint64_t{32} << 20, kPiece = std::uint64_t{2} << 20, kMax = std::uint64_t{16} << 20;
    auto transport = GENERATE(as<std::string>{}, "tcp", "shm");
    INFO("transport " << transport);
    FakeGpuAgent g(transport, kKernelTimeout, {"--region", "big=32M@gpu0"});
    auto big = g.client.region(g.target, "big");
    REQUIRE(big);
    Bytes pattern(kBig);
    for (std::size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<std::byte>((i * 7919) ^ (i >> 16));
    std::vector<Future> puts;
    for (std::uint64_t off = 0; off < kBig; off += kPiece)
        puts.push_back(g.client.put(*big, off, Bytes(pattern.begin() + off, pattern.begin() + off + kPiece)));
    for (auto& f : puts) REQUIRE(f.get());

    // Sixteen 2 MiB reads and two of the largest size at once: four slots, so some are copied.
    const auto reads_before = g.counter("gpu_reads");
    std::vector<std::pair<std::uint64_t, Future>> gets;
    for (std::uint64_t off = 0; off < kBig; off += kPiece)
        gets.emplace_back(off, g.client.get(*big, off, static_cast<std::uint32_t>(kPiece)));
    for (std::uint64_t off = 0; off < kBig; off += kMax)
        gets.emplace_back(off, g.client.get(*big, off, static_cast<std::uint32_t>(kMax)));
    for (auto& [off, f] : gets) {
        auto b = std::move(f).get();
        INFO("read at " << off << ": " << said(b));
        REQUIRE(b);
        REQUIRE(std::equal(b->begin(), b->end(), pattern.begin() + static_cast<std::ptrdiff_t>(off)));
    }
    CHECK(g.counter("gpu_reads") - reads_before == gets.size());
    CHECK(g.counter("gpu_window_reads") >= 1);

    // A client that asks for eight of the largest reads and goes without taking them.
    {
        auto leaving = make_client(transport);
        auto t = connect(leaving, g.agent);
        auto r = leaving.region(t, "big");
        REQUIRE(r);
        for (int i = 0; i < 8; ++i) (void)leaving.get(*r, (i % 2) * kMax, static_cast<std::uint32_t>(kMax));
    }
    // Every slot comes back: four reads at once are then all answered from the window (the
    // leaver's sends end when UCX sees it gone, which may take a moment on shared memory).
    bool all_back = false;
    for (int attempt = 0; attempt < 50 && !all_back; ++attempt) {
        if (attempt) std::this_thread::sleep_for(std::chrono::milliseconds(200));
        const auto before = g.counter("gpu_window_reads");
        std::vector<Future> four;
        for (int i = 0; i < 4; ++i) four.push_back(g.client.get(*big, (i % 2) * kMax, static_cast<std::uint32_t>(kMax)));
        for (auto& f : four) REQUIRE(f.get());
        all_back = g.counter("gpu_window_reads") - before == four.size();
    }
    CHECK(all_back);
    CHECK(g.stops_cleanly());
}

TEST_CASE("gpu plumbing (fake driver): a GPU call to a restarted agent that lacks the code is "
          "resent with it",
          "[integration][gpu]") {
    const std::uint16_t port = launch::free_port();
    const std::vector<std::string> args = {"--sandbox",       "none",     "--cuda-library",
                                           BITSHIP_FAKE_CUDA, "--region", "data=1M@gpu0"};
    auto client = make_client("tcp");
    {
        AgentProcess first("tcp", args, port);
        auto target = connect(client, first);
        auto r = client.ship(device_kernels::twice, target, on_gpu(), std::uint64_t{3})
                     .get_as<std::uint64_t>();
        INFO((r ? std::string() : r.error().describe()));
        REQUIRE(r);
        CHECK(*r == 6);
    }
    // The client still believes the address holds the code: the new agent asks for it (NEED_CODE),
    // and the resent RUN still carries the launch.
    AgentProcess second("tcp", args, port);
    Target target = [&] {
        for (int i = 0;; ++i) { // the old connection's end may be noticed first
            auto t = client.connect(second.address());
            if (t || i == 20) {
                INFO((t ? std::string() : t.error().describe()));
                REQUIRE(t);
                return *t;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
    }();
    auto r = client.ship(gpu_ops_kernels::where, target, on_gpu(24)).get();
    INFO(said(r) << "\n" << second.log());
    REQUIRE(r);
    CHECK(u64(*r, 0) == 1);
    auto again = client.ship(device_kernels::twice, target, on_gpu(), std::uint64_t{5})
                     .get_as<std::uint64_t>();
    INFO((again ? std::string() : again.error().describe()) << "\n" << second.log());
    REQUIRE(again);
    CHECK(*again == 10);
    auto counters = agent_counters(client, target);
    CHECK(counters["need_code_sent"] == 1); // twice's hash, which the client thought it held
    CHECK(counters["gpu_compiles"] == 2);
}

TEST_CASE("gpu plumbing (fake driver): concurrent first calls of one GPU kernel compile it once",
          "[integration][gpu]") {
    FakeGpuAgent g;
    constexpr int kThreads = 8;
    std::latch start(kThreads);
    std::vector<Result<std::uint64_t>> answers(
        kThreads, tl::make_unexpected(Error{Errc::internal, "not run"}));
    std::vector<std::thread> threads;
    for (int i = 0; i < kThreads; ++i)
        threads.emplace_back([&, i] {
            start.arrive_and_wait();
            answers[i] =
                g.client.ship(device_kernels::twice, g.target, on_gpu(), std::uint64_t(100 + i))
                    .get_as<std::uint64_t>();
        });
    for (auto& t : threads)
        t.join();
    for (int i = 0; i < kThreads; ++i) {
        INFO("thread " << i << ": "
                       << (answers[i] ? std::string() : answers[i].error().describe()));
        REQUIRE(answers[i]);
        CHECK(*answers[i] == 2 * std::uint64_t(100 + i));
    }
    auto counters = agent_counters(g.client, g.target);
    CHECK(counters["gpu_compiles"] == 1);
    CHECK(counters["gpu_runs"] == kThreads);

    // A batch of GPU and CPU calls, sent as one message, each answered by its own slice.
    constexpr int kBatch = 16;
    auto batch = g.client.batch();
    for (int i = 0; i < kBatch; ++i) {
        ShipOptions o = i % 2 == 0 ? on_gpu() : ShipOptions{};
        batch.add_bytes(device_kernels::twice, g.target, Client::pack_args(std::uint64_t(i)), o);
    }
    auto futures = batch.submit();
    for (int i = 0; i < kBatch; ++i) {
        auto r = futures[i].get_as<std::uint64_t>();
        INFO("call " << i << ": " << (r ? std::string() : r.error().describe()));
        REQUIRE(r);
        CHECK(*r == 2 * std::uint64_t(i));
    }
    CHECK(g.counter("gpu_runs") == kThreads + kBatch / 2);

    // A walk of dependent GPU calls.
    int steps = 0;
    auto walk = g.client
                    .ship_chain(device_kernels::twice, on_gpu(),
                                [&](std::span<const std::byte> last,
                                    Bytes& result) -> Result<std::optional<ShipStep>> {
                                    std::uint64_t v = 1;
                                    if (!last.empty()) std::memcpy(&v, last.data(), sizeof v);
                                    if (steps++ == 5) {
                                        result = Client::pack_args(v);
                                        return std::nullopt;
                                    }
                                    return ShipStep{&g.target, Client::pack_args(v)};
                                })
                    .get_as<std::uint64_t>();
    INFO((walk ? std::string() : walk.error().describe()));
    REQUIRE(walk);
    CHECK(*walk == 32);
    CHECK(g.counter("gpu_compiles") == 1);
}

TEST_CASE("gpu plumbing (fake driver): an sfi agent runs no GPU kernels on a working driver, and "
          "refuses a GPU "
          "region naming --sandbox sfi",
          "[integration][gpu]") {
    AgentProcess agent("tcp", {"--cuda-library", BITSHIP_FAKE_CUDA}); // --sandbox sfi, the default
    auto client = make_client("tcp");
    auto target = client.connect(agent.address());
    INFO(agent.log());
    REQUIRE(target);
    CHECK(target->info().capabilities.gpus == 0);
    CHECK(target->info().capabilities.gpu_devices.empty());

    auto refused = client.ship(device_kernels::twice, *target, on_gpu(), std::uint64_t{21}).get();
    REQUIRE_FALSE(refused);
    CHECK(refused.error().code == Errc::no_matching_slice);
    CHECK_THAT(refused.error().message,
               Catch::Contains("asks for a GPU") && Catch::Contains("0 GPU(s)"));
    CHECK(agent_counters(client, *target)["runs"] == 0); // refused before it was sent
    auto cpu =
        client.ship(device_kernels::twice, *target, std::uint64_t{21}).get_as<std::uint64_t>();
    REQUIRE(cpu);
    CHECK(*cpu == 42);

    auto out = test::run_command(AgentProcess::binary() +
                                 " --transport tcp --listen 127.0.0.1:0 --cuda-library " +
                                 BITSHIP_FAKE_CUDA + " --region data=1M@gpu0 2>&1");
    CHECK(out.status != 0);
    CHECK_THAT(out.text, Catch::Contains("GPU region 'data'") && Catch::Contains("--sandbox sfi") &&
                             Catch::Contains("--sandbox none"));
}

// The fake itself, opened in this process through CudaApi as the agent opens it: what the cases
// above rely on it to refuse, it refuses.
TEST_CASE("gpu plumbing (fake driver): the fake refuses text that is not PTX, finds entries by "
          "name, and keeps a fault sticky for the process's life as a real driver does",
          "[unit][gpu]") {
    namespace cuda = agent::cuda;
    auto loaded = agent::CudaApi::load(BITSHIP_FAKE_CUDA);
    INFO((loaded ? std::string() : loaded.error().describe()));
    REQUIRE(loaded);
    const agent::CudaApi& cu = **loaded;
    using Stats = int (*)(unsigned long long*, unsigned long long*);
    void* library = ::dlopen(BITSHIP_FAKE_CUDA, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    REQUIRE(library != nullptr);
    auto stats = reinterpret_cast<Stats>(::dlsym(library, "bitship_fake_cuda_stats"));
    REQUIRE(stats != nullptr);
    unsigned long long resets_before = 0, loads_before = 0;
    stats(&resets_before, &loads_before);

    cuda::CUcontext context = nullptr;
    REQUIRE(cu.cuDevicePrimaryCtxRetain(&context, 0) == cuda::kSuccess);
    // Nothing is made without a current context.
    cuda::CUstream stream = nullptr;
    CHECK(cu.cuStreamCreate(&stream, 0) == 201); // CUDA_ERROR_INVALID_CONTEXT
    REQUIRE(cu.cuCtxSetCurrent(context) == cuda::kSuccess);
    REQUIRE(cu.cuStreamCreate(&stream, cuda::kStreamNonBlocking) == cuda::kSuccess);

    // Not PTX: CUDA_ERROR_INVALID_PTX, saying why in the JIT log.
    char log[256] = {};
    int options[] = {cuda::kJitErrorLogBuffer, cuda::kJitErrorLogBufferSizeBytes};
    void* values[] = {log, reinterpret_cast<void*>(std::uintptr_t{sizeof log})};
    cuda::CUmodule module = nullptr;
    CHECK(cu.cuModuleLoadDataEx(&module, "BC\xc0\xde not text", 2, options, values) == 218);
    CHECK_THAT(std::string(log), Catch::Contains("not PTX"));
    const char* future_ptx = ".version 9.0\n.target sm_100\n.address_size 64\n.visible .entry "
                             "k(.param .u64 a)\n{ ret; }\n";
    CHECK(cu.cuModuleLoadDataEx(&module, future_ptx, 2, options, values) == 218);
    CHECK_THAT(std::string(log), Catch::Contains("sm_100"));

    const char* ptx =
        ".version 8.0\n.target sm_90\n.address_size 64\n"
        "// .entry commented_out(\n"
        ".visible .entry fault(\n\t.param .u64 fault_param_0,\n\t.param .u64 fault_param_1,\n"
        "\t.param .u64 fault_param_2\n)\n{ ret; }\n"
        ".visible .entry twice (.param .u64 a, .param .u64 b)\n{ ret; }\n";
    REQUIRE(cu.cuModuleLoadDataEx(&module, ptx, 2, options, values) == cuda::kSuccess);
    cuda::CUfunction function = nullptr;
    CHECK(cu.cuModuleGetFunction(&function, module, "commented_out") == cuda::kErrorNotFound);
    CHECK(cu.cuModuleGetFunction(&function, module, "faul") == cuda::kErrorNotFound);
    // An entry without the ABI's three parameters is not launched.
    REQUIRE(cu.cuModuleGetFunction(&function, module, "twice") == cuda::kSuccess);
    cuda::CUdeviceptr none = 0;
    void* params[] = {&none, &none, &none};
    CHECK(cu.cuLaunchKernel(function, 1, 1, 1, 1, 1, 1, 0, stream, params, nullptr) ==
          cuda::kErrorInvalidValue);
    REQUIRE(cu.cuModuleGetFunction(&function, module, "fault") == cuda::kSuccess);
    CHECK(cu.cuLaunchKernel(function, 1, 1, 1, 2048, 1, 1, 0, stream, params, nullptr) ==
          cuda::kErrorInvalidValue);

    // Memory: aligned, copies checked against the allocation.
    cuda::CUdeviceptr memory = 0;
    REQUIRE(cu.cuMemAlloc(&memory, 64) == cuda::kSuccess);
    CHECK(memory % 256 == 0);
    std::uint64_t in = 42, out = 0;
    CHECK(cu.cuMemcpyHtoDAsync(memory, &in, sizeof in, stream) == cuda::kSuccess);
    CHECK(cu.cuMemcpyDtoHAsync(&out, memory, sizeof out, stream) == cuda::kSuccess);
    CHECK(out == 42);
    CHECK(cu.cuMemcpyDtoHAsync(&out, memory + 60, sizeof out, stream) ==
          cuda::kErrorInvalidValue); // past its end
    CHECK(cu.cuMemFree(memory) == cuda::kSuccess);

    // A fault is seen by the next query, then by every call in the context.
    REQUIRE(cu.cuLaunchKernel(function, 1, 1, 1, 1, 1, 1, 0, stream, params, nullptr) ==
            cuda::kSuccess);
    CHECK(cu.cuStreamQuery(stream) == cuda::kErrorIllegalAddress);
    CHECK(cu.cuMemAlloc(&memory, 64) == cuda::kErrorIllegalAddress);
    CHECK(cu.cuStreamSynchronize(stream) == cuda::kErrorIllegalAddress);
    CHECK(cu.cuCtxSynchronize() == cuda::kErrorIllegalAddress);
    CHECK(cu.cuModuleGetFunction(&function, module, "fault") == cuda::kErrorIllegalAddress);

    // A reset destroys the context and its handles, and the process stays poisoned: as an
    // H100's driver 580 does, retaining a new context returns the same error (only a new
    // process recovers: the agent's GpuProcess).
    REQUIRE(cu.cuDevicePrimaryCtxRelease(0) == cuda::kSuccess);
    REQUIRE(cu.cuDevicePrimaryCtxReset(0) == cuda::kSuccess);
    CHECK(cu.cuStreamQuery(stream) == 400);    // CUDA_ERROR_INVALID_HANDLE
    CHECK(cu.cuCtxSetCurrent(context) == 709); // CUDA_ERROR_CONTEXT_IS_DESTROYED
    CHECK(cu.cuDevicePrimaryCtxRetain(&context, 0) == cuda::kErrorIllegalAddress);

    unsigned long long resets = 0, loads = 0;
    stats(&resets, &loads);
    CHECK(resets == resets_before + 1);
    CHECK(loads == loads_before + 1);
    ::dlclose(library); // the reference RTLD_NOLOAD took; CudaApi's stays
}

}  // namespace gpu_plumbing_test_cpp
