// The agent ⇄ bitship-gpu frames (agents/gpu_process_protocol.hpp): each message round-trips,
// and the decoders refuse what is truncated, oversized or of another type, naming it. The
// agent decodes what a process that runs shipped GPU code sends back.
#include "gpu_process_protocol.hpp"

#include <bitship/bundle.hpp>
#include <catch2/catch.hpp>
#include <cstring>
#include <unistd.h>
#include <vector>

namespace gpu_process_protocol_test_cpp {

using namespace bitship;
using namespace bitship::agent;
namespace proto = bitship::agent::gpu_protocol;

namespace {

CodeHash some_hash() {
    CodeHash h{};
    for (std::size_t i = 0; i < h.size(); ++i)
        h[i] = static_cast<std::uint8_t>(i * 7 + 1);
    return h;
}

/// Every proper prefix of `frame` is refused by `decode`, as malformed.
template <class Decode>
void check_prefixes_refused(const std::vector<std::byte>& frame, Decode decode) {
    for (std::size_t n = 0; n < frame.size(); ++n) {
        auto r = decode(std::span(frame).first(n));
        INFO("prefix of " << n << " of " << frame.size() << " bytes");
        REQUIRE_FALSE(r);
        CHECK(r.error().code == Errc::malformed_message);
    }
    auto longer = frame;
    longer.push_back(std::byte{0});
    auto r = decode(std::span(longer));
    REQUIRE_FALSE(r);
    CHECK_THAT(r.error().message, Catch::Contains("1 bytes after"));
}

} // namespace

TEST_CASE("gpu process protocol: every message round-trips and every truncation is refused",
          "[unit]") {
    proto::Ready ready;
    ready.gpu.name = "NVIDIA H100 80GB HBM3";
    ready.gpu.pci_bus_id = "00000000:00:06.0";
    ready.gpu.sm = 90;
    ready.gpu.limits = GpuLimits{132, 1024, {1024, 1024, 64}, {2147483647u, 65535, 65535}};
    ready.gpu.memory_bytes = 85'000'000'000ull;
    auto r = proto::decode_ready(proto::encode(ready));
    REQUIRE(r);
    CHECK(r->gpu.name == ready.gpu.name);
    CHECK(r->gpu.pci_bus_id == ready.gpu.pci_bus_id);
    CHECK(r->gpu.sm == 90);
    CHECK(r->gpu.limits.multiprocessors == 132);
    CHECK(r->gpu.limits.max_threads_per_block == 1024);
    CHECK(r->gpu.limits.max_block[2] == 64);
    CHECK(r->gpu.limits.max_grid[0] == 2147483647u);
    CHECK(r->gpu.memory_bytes == ready.gpu.memory_bytes);
    check_prefixes_refused(proto::encode(ready), proto::decode_ready);

    auto region = proto::decode_add_region(proto::encode(proto::AddRegion{"data", 4096}));
    REQUIRE(region);
    CHECK(region->name == "data");
    CHECK(region->size == 4096);
    check_prefixes_refused(proto::encode(proto::AddRegion{"data", 4096}), proto::decode_add_region);

    auto module =
        proto::decode_load_module(proto::encode(proto::LoadModule{some_hash(), ".version 8.0\n"}));
    REQUIRE(module);
    CHECK(module->hash == some_hash());
    CHECK(module->ptx == ".version 8.0\n");
    check_prefixes_refused(proto::encode(proto::LoadModule{some_hash(), "x"}),
                           proto::decode_load_module);
    auto unload = proto::decode_unload_module(proto::encode(proto::UnloadModule{some_hash()}));
    REQUIRE(unload);
    CHECK(unload->hash == some_hash());
    check_prefixes_refused(proto::encode(proto::UnloadModule{some_hash()}),
                           proto::decode_unload_module);

    proto::Launch launch;
    launch.hash = some_hash();
    launch.entry = "sum_u64";
    launch.geometry = GpuGeometry{{1056, 1, 1}, {256, 1, 1}};
    launch.result_bytes = 8;
    launch.timeout = std::chrono::milliseconds(30000);
    launch.args_bytes = 16;
    auto l = proto::decode_launch(proto::encode(launch));
    REQUIRE(l);
    CHECK(l->hash == some_hash());
    CHECK(l->entry == "sum_u64");
    CHECK(l->geometry.grid[0] == 1056);
    CHECK(l->geometry.block[0] == 256);
    CHECK(l->result_bytes == 8);
    CHECK(l->timeout == std::chrono::milliseconds(30000));
    CHECK(l->args_bytes == 16);
    check_prefixes_refused(proto::encode(launch), proto::decode_launch);

    auto read = proto::decode_read(proto::encode_read({"data", 64, 4096, proto::kWindowBytes}));
    REQUIRE(read);
    CHECK(read->region == "data");
    CHECK(read->offset == 64);
    CHECK(read->length == 4096);
    CHECK(read->at == proto::kWindowBytes);
    check_prefixes_refused(proto::encode_read({"data", 64, 4096, proto::kWindowBytes}), proto::decode_read);
    auto write = proto::decode_write(proto::encode_write({"data", 0, 8}));
    REQUIRE(write);
    CHECK(write->length == 8);
    check_prefixes_refused(proto::encode_write({"data", 0, 8}), proto::decode_write);

    auto ok = proto::decode_ok(proto::encode_ok(12));
    REQUIRE(ok);
    CHECK(*ok == 12);
    check_prefixes_refused(proto::encode_ok(12), proto::decode_ok);

    auto failed = proto::decode_failed(
        proto::encode(proto::Failed{Error{Errc::kernel_crashed, "GPU 0: boom"}, true}));
    REQUIRE(failed);
    CHECK(failed->error.code == Errc::kernel_crashed);
    CHECK(failed->error.message == "GPU 0: boom");
    CHECK(failed->poisoned);
    check_prefixes_refused(proto::encode(proto::Failed{Error{Errc::internal, "x"}, false}),
                           proto::decode_failed);
}

TEST_CASE("gpu process protocol: sizes past the window, another message's type, an unknown type, "
          "another version and an unknown error code are refused or mapped",
          "[unit]") {
    auto too_long = proto::decode_read(proto::encode_read({"data", 0, proto::kWindowBytes + 1}));
    REQUIRE_FALSE(too_long);
    CHECK_THAT(too_long.error().message, Catch::Contains("the window holds"));
    // A read slot's place is checked against the window's end, without overflow.
    const auto last_slot = proto::kWindowBytes + (proto::kReadSlots - 1) * proto::kReadSlotBytes;
    auto in_last = proto::decode_read(proto::encode_read({"data", 0, proto::kReadSlotBytes, last_slot}));
    REQUIRE(in_last);
    CHECK(in_last->at == last_slot);
    for (std::uint64_t at : {last_slot + 1, proto::kWindowTotalBytes, ~std::uint64_t{0}}) {
        auto past_end = proto::decode_write(proto::encode_write({"data", 0, proto::kReadSlotBytes, at}));
        REQUIRE_FALSE(past_end);
        CHECK_THAT(past_end.error().message, Catch::Contains("of the window, which ends at"));
    }
    auto ok_too_long = proto::decode_ok(proto::encode_ok(proto::kWindowBytes + 1));
    REQUIRE_FALSE(ok_too_long);
    proto::Launch launch;
    launch.entry = "k";
    launch.args_bytes = proto::kWindowBytes + 1;
    REQUIRE_FALSE(proto::decode_launch(proto::encode(launch)));
    launch.args_bytes = 0;
    launch.timeout = std::chrono::hours(24 * 400);
    auto forever = proto::decode_launch(proto::encode(launch));
    REQUIRE_FALSE(forever);
    CHECK_THAT(forever.error().message, Catch::Contains("a timeout of"));

    auto wrong = proto::decode_read(proto::encode_ok(0));
    REQUIRE_FALSE(wrong);
    CHECK_THAT(wrong.error().message, Catch::Contains("expected message type"));
    std::vector<std::byte> unknown = {std::byte{99}};
    auto t = proto::type_of(unknown);
    REQUIRE_FALSE(t);
    CHECK_THAT(t.error().message, Catch::Contains("unknown message type 99"));
    REQUIRE_FALSE(proto::type_of({}));

    auto ready = proto::encode(proto::Ready{});
    const std::uint32_t other = proto::kVersion + 1;
    std::memcpy(ready.data() + 1, &other, sizeof other);
    auto v = proto::decode_ready(ready);
    REQUIRE_FALSE(v);
    CHECK_THAT(v.error().message, Catch::Contains("speaks version"));

    auto failed = proto::encode(proto::Failed{Error{Errc::internal, "x"}, false});
    const std::uint32_t code = 0xfffffu;
    std::memcpy(failed.data() + 1, &code, sizeof code);
    auto f = proto::decode_failed(failed);
    REQUIRE(f);
    CHECK(f->error.code == Errc::internal); // a code this build does not know
    failed[1 + 4] = std::byte{2};           // poisoned is 0 or 1
    REQUIRE_FALSE(proto::decode_failed(failed));
}

TEST_CASE(
    "gpu process protocol: the window is shared memory of its set size, and refuses another size",
    "[unit]") {
    auto window = proto::Window::create();
    REQUIRE(window);
    CHECK(window->bytes().size() == proto::kWindowTotalBytes);
    window->bytes()[5] = std::byte{42};
    auto again = proto::Window::map(::dup(window->fd()));
    REQUIRE(again);
    CHECK(again->bytes()[5] == std::byte{42}); // the same memory, mapped twice
    int pipe_fds[2];
    REQUIRE(::pipe(pipe_fds) == 0);
    auto not_one = proto::Window::map(pipe_fds[0]); // not kWindowTotalBytes long: refused, left open
    REQUIRE_FALSE(not_one);
    ::close(pipe_fds[0]);
    ::close(pipe_fds[1]);
}

}  // namespace gpu_process_protocol_test_cpp
