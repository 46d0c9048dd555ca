// The wire's GPU parts: a RUN's launch (kFlagGpu), a GPU region's REGION_INFO, GPU_READ and
// GPU_WRITE, and the GPUs and GPU regions WELCOME lists after its session fields.
#include <catch2/catch.hpp>

#include <string>

#include "core/wire.hpp"
#include "wire_checks.hpp"

namespace gpu_wire_test_cpp {

using namespace bitship;
using bitship::test::as_bytes;
using bitship::test::every_truncation_refused;

namespace {

wire::Run gpu_run() {
    wire::Run r;
    r.hash.fill(9);
    r.entry = "sum_u64";
    static const std::uint64_t count = 1 << 20;
    r.args = std::as_bytes(std::span(&count, 1));
    r.gpu = wire::GpuLaunch{{1056, 1, 1}, {256, 2, 1}, 16, 1};
    return r;
}

wire::Welcome welcome_with_gpus() {
    wire::Welcome w;
    w.agent = "127.0.0.1:7000";
    w.triple = "x86_64-pc-linux-gnu";
    w.cpu = "sapphirerapids";
    w.caps.pus = 32;
    w.caps.gpus = 2;
    w.caps.gpu_devices = {{"NVIDIA H100 80GB HBM3", 90, 132, 80ull << 30, 0}, {"NVIDIA H100 80GB HBM3", 90, 132, 80ull << 30, -1}};
    w.caps.gpu_regions = {{"data", 4ull << 30, 0}, {"out", 1 << 20, 1}};
    w.sandbox = SandboxMode::sfi;
    return w;
}

} // namespace

TEST_CASE("a GPU RUN carries its launch, flagged in the header, with or without a window", "[unit]") {
    for (bool window : {false, true}) {
        auto r = gpu_run();
        if (window) {
            r.window = wire::WindowUse{0, 8, 64, 1024};
            r.args = {};
        }
        auto e = wire::encode_run(7, r);
        CHECK((e.header.flags & wire::kFlagGpu) != 0);
        CHECK(((e.header.flags & wire::kFlagWindow) != 0) == window);
        auto m = wire::decode(e.header, e.payload);
        REQUIRE(m);
        const auto& got = std::get<wire::Run>(m->body);
        REQUIRE(got.gpu);
        CHECK(*got.gpu == *r.gpu);
        CHECK(got.entry == "sum_u64");
        CHECK(got.window.has_value() == window);
        every_truncation_refused(e);
    }
    // A CPU RUN has none.
    auto cpu = gpu_run();
    cpu.gpu.reset();
    auto e = wire::encode_run(8, cpu);
    CHECK((e.header.flags & wire::kFlagGpu) == 0);
    CHECK_FALSE(std::get<wire::Run>(wire::decode(e.header, e.payload)->body).gpu);
}

TEST_CASE("a RUN with a flag this build does not know is refused, naming the flags", "[unit]") {
    auto e = wire::encode_run(9, gpu_run());
    e.header.flags |= 1u << 7;
    auto m = wire::decode(e.header, e.payload);
    REQUIRE_FALSE(m);
    CHECK(m.error().code == Errc::malformed_message);
    CHECK_THAT(m.error().message, Catch::Contains("unknown flags 0x0082"));
}

TEST_CASE("a GPU region's REGION_INFO says so and gives its index, and a host region's stays as it was", "[unit]") {
    auto g = wire::encode_region_info(4, {0, 4ull << 30, {}, true, 3});
    auto gm = wire::decode(g.header, g.payload);
    REQUIRE(gm);
    const auto& info = std::get<wire::RegionInfo>(gm->body);
    CHECK(info.gpu);
    CHECK(info.gpu_index == 3);
    CHECK(info.size == 4ull << 30);
    CHECK(info.rkey.empty());
    // Cut inside its GPU fields it is refused; cut before them it is a host region's.
    for (std::size_t cut = 1; cut < 5; ++cut) {
        auto h = g.header;
        h.payload_size = static_cast<std::uint32_t>(g.payload.size() - cut);
        std::vector<std::byte> shorter(g.payload.begin(), g.payload.end() - static_cast<std::ptrdiff_t>(cut));
        CHECK_FALSE(wire::decode(h, shorter));
    }

    static const std::string rkey = "packed";
    auto h = wire::encode_region_info(5, {0x1000, 4096, as_bytes(rkey)});
    auto hm = wire::decode(h.header, h.payload);
    REQUIRE(hm);
    CHECK_FALSE(std::get<wire::RegionInfo>(hm->body).gpu);
    CHECK(h.payload.size() + 5 == g.payload.size() + rkey.size()); // one byte of kind and the u32 index, no more

    auto bad = g;
    bad.payload[bad.payload.size() - 5] = std::byte{2};
    auto bm = wire::decode(bad.header, bad.payload);
    REQUIRE_FALSE(bm);
    CHECK_THAT(bm.error().message, Catch::Contains("memory kind 2"));
}

TEST_CASE("GPU_READ and GPU_WRITE round trip, and every cut is refused", "[unit]") {
    auto r = wire::encode_gpu_read(11, {"data", 1 << 20, 16 << 20});
    CHECK(r.header.type == wire::Type::gpu_read);
    auto rm = wire::decode(r.header, r.payload);
    REQUIRE(rm);
    const auto& read = std::get<wire::GpuRead>(rm->body);
    CHECK(read.name == "data");
    CHECK(read.offset == 1u << 20);
    CHECK(read.length == 16u << 20);
    every_truncation_refused(r);

    static const std::string bytes = "sixteen bytes!!!";
    auto w = wire::encode_gpu_write(12, {"data", 64, as_bytes(bytes)});
    auto wm = wire::decode(w.header, w.payload);
    REQUIRE(wm);
    const auto& write = std::get<wire::GpuWrite>(wm->body);
    CHECK(write.name == "data");
    CHECK(write.offset == 64);
    CHECK(std::string(reinterpret_cast<const char*>(write.bytes.data()), write.bytes.size()) == bytes);
    // A write of nothing is a write (the agent checks the range); cut inside its fields it is not.
    for (std::size_t n = 0; n < 2 + 4 + 8; ++n) {
        auto h = w.header;
        h.payload_size = static_cast<std::uint32_t>(n);
        std::vector<std::byte> cut(w.payload.begin(), w.payload.begin() + static_cast<std::ptrdiff_t>(n));
        CHECK_FALSE(wire::decode(h, cut));
    }
    CHECK(std::string(wire::to_string(wire::Type::gpu_read)) == "GPU_READ");
    CHECK(std::string(wire::to_string(wire::Type::gpu_write)) == "GPU_WRITE");
}

TEST_CASE("WELCOME lists the agent's GPUs and GPU regions after its session fields", "[unit]") {
    auto e = wire::encode_welcome(welcome_with_gpus());
    auto m = wire::decode(e.header, e.payload);
    REQUIRE(m);
    const auto& got = std::get<wire::Welcome>(m->body);
    CHECK(got.sandbox == SandboxMode::sfi); // the field before them still reads
    REQUIRE(got.caps.gpu_devices.size() == 2);
    CHECK(got.caps.gpu_devices[0].name == "NVIDIA H100 80GB HBM3");
    CHECK(got.caps.gpu_devices[0].sm == 90);
    CHECK(got.caps.gpu_devices[0].multiprocessors == 132);
    CHECK(got.caps.gpu_devices[0].memory_bytes == 80ull << 30);
    CHECK(got.caps.gpu_devices[0].numa_node == 0);
    CHECK(got.caps.gpu_devices[1].numa_node == -1);
    REQUIRE(got.caps.gpu_regions.size() == 2);
    CHECK(got.caps.gpu_regions[0].name == "data");
    CHECK(got.caps.gpu_regions[0].size == 4ull << 30);
    CHECK(got.caps.gpu_regions[1].device == 1);
    every_truncation_refused(e);
    // A GPU-less agent's WELCOME ends at its sandbox byte, as before the GPU details.
    auto plain = welcome_with_gpus();
    plain.caps.gpus = 0;
    plain.caps.gpu_devices.clear();
    plain.caps.gpu_regions.clear();
    auto pe = wire::encode_welcome(plain);
    CHECK(pe.payload.size() + wire::encode_gpu_details(welcome_with_gpus().caps).size() == e.payload.size());
    CHECK(static_cast<std::uint8_t>(pe.payload.back()) == static_cast<std::uint8_t>(SandboxMode::sfi));
}

TEST_CASE("GPU details that claim more than their bytes, a region on a GPU not listed, or trailing bytes are refused", "[unit]") {
    auto caps = welcome_with_gpus().caps;
    auto bytes = wire::encode_gpu_details(caps);
    Capabilities out;
    REQUIRE(wire::decode_gpu_details(bytes, out));
    CHECK(out.gpu_regions.size() == 2);

    auto many = bytes;
    many[0] = std::byte{0xff};
    many[1] = std::byte{0xff};
    auto r = wire::decode_gpu_details(many, out);
    REQUIRE_FALSE(r);
    CHECK_THAT(r.error().message, Catch::Contains("gpu_devices"));

    caps.gpu_regions[1].device = 2;
    auto elsewhere = wire::decode_gpu_details(wire::encode_gpu_details(caps), out);
    REQUIRE_FALSE(elsewhere);
    CHECK_THAT(elsewhere.error().message, Catch::Contains("GPU region 'out' is on GPU 2 of 2"));

    auto longer = bytes;
    longer.push_back(std::byte{0});
    auto trailing = wire::decode_gpu_details(longer, out);
    REQUIRE_FALSE(trailing);
    CHECK_THAT(trailing.error().message, Catch::Contains("1 bytes after the GPU details"));
}

}  // namespace gpu_wire_test_cpp
