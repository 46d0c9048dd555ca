// bitship-gpu: the process that holds one GPU's CUDA context for an xagent (gpu_process.hpp).
// The agent starts one per GPU with its end of a socket on fd 3 and the shared window for bulk
// bytes on fd 4, and talks to it in the frames of gpu_process_protocol.hpp. The process opens the
// driver (dlopen, never linked) and the GPU, says READY, then serves one request at a time until
// the agent closes the socket.
//
// When its context is poisoned (a sticky error, or a kernel still running past its timeout) it
// answers FAILED marked poisoned and exits at once, without tearing anything down: the driver
// lets no process recover from that but by exiting, and a teardown could wait forever on a
// kernel that never returns. The agent then starts another.
//
//   bitship-gpu --ordinal N [--cuda-library PATH]
#include "core/frame_io.hpp"
#include "cuda_driver.hpp"
#include "gpu_device.hpp"
#include "gpu_process_protocol.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fmt/format.h>
#include <string>
#include <string_view>
#include <unistd.h>

using namespace bitship;
using namespace bitship::agent;
namespace proto = bitship::agent::gpu_protocol;

namespace {

constexpr std::string_view kPeer = "agent";
/// After an answer, the process polls for the next request this long before it sleeps on the
/// socket: calls that follow each other (a client's loop) skip a wake-up each. A GPU host has
/// the cores to spare.
constexpr auto kNextRequestSpin = std::chrono::milliseconds(2);
/// Exit statuses: the agent closed the socket (0), a start that failed (2), a lost socket (3),
/// bad arguments (64, EX_USAGE).
constexpr int kExitStartFailed = 2;
constexpr int kExitSocketLost = 3;
constexpr int kExitUsage = 64;

bool send(const std::vector<std::byte>& frame) {
    return static_cast<bool>(write_frame(proto::kProcessFd, frame, kPeer));
}

/// One request, done; its answer. Bulk bytes are in `window` (gpu_process_protocol.hpp).
std::vector<std::byte> serve(GpuDevice& gpu, std::span<std::byte> window,
                             std::span<const std::byte> frame) {
    auto failed = [&](const Error& e) {
        return proto::encode(proto::Failed{e, !gpu.poisoned().empty()});
    };
    auto type = proto::type_of(frame);
    if (!type) return failed(type.error());
    switch (*type) {
    case proto::Type::add_region: {
        auto m = proto::decode_add_region(frame);
        if (!m) return failed(m.error());
        if (auto r = gpu.add_region(m->name, m->size); !r) return failed(r.error());
        return proto::encode_ok();
    }
    case proto::Type::load_module: {
        auto m = proto::decode_load_module(frame);
        if (!m) return failed(m.error());
        if (auto r = gpu.load_module(m->hash, m->ptx); !r) return failed(r.error());
        return proto::encode_ok();
    }
    case proto::Type::unload_module: {
        auto m = proto::decode_unload_module(frame);
        if (!m) return failed(m.error());
        if (auto r = gpu.unload_module(m->hash); !r) return failed(r.error());
        return proto::encode_ok();
    }
    case proto::Type::launch: { // the decoder holds both sizes to the window's
        auto m = proto::decode_launch(frame);
        if (!m) return failed(m.error());
        auto out = gpu.launch(m->hash, m->entry, window.first(m->args_bytes), m->result_bytes,
                              m->geometry, m->timeout);
        if (!out) return failed(out.error());
        std::memcpy(window.data(), out->data(), out->size());
        return proto::encode_ok(out->size());
    }
    case proto::Type::read: {
        auto m = proto::decode_read(frame);
        if (!m) return failed(m.error());
        if (auto r = gpu.read(m->region, m->offset, window.subspan(m->at, m->length)); !r) // in range: decoded
            return failed(r.error());
        return proto::encode_ok(m->length);
    }
    case proto::Type::write: {
        auto m = proto::decode_write(frame);
        if (!m) return failed(m.error());
        if (auto r = gpu.write(m->region, m->offset, window.subspan(m->at, m->length)); !r)
            return failed(r.error());
        return proto::encode_ok();
    }
    default:
        return failed(Error{Errc::malformed_message,
                            fmt::format("GPU process protocol: message type {} is not a request",
                                        static_cast<int>(*type))});
    }
}

} // namespace

int main(int argc, char** argv) {
    int ordinal = -1;
    std::string library = kCudaDriverLibrary;
    for (int i = 1; i < argc; ++i) {
        const std::string_view a = argv[i];
        if (a == "--ordinal" && i + 1 < argc)
            ordinal = std::atoi(argv[++i]);
        else if (a == "--cuda-library" && i + 1 < argc)
            library = argv[++i];
        else {
            std::fprintf(stderr,
                         "bitship-gpu: unknown argument '%s'\nusage: bitship-gpu --ordinal N "
                         "[--cuda-library PATH] "
                         "(started by xagent, with its socket on fd %d)\n",
                         argv[i], proto::kProcessFd);
            return kExitUsage;
        }
    }
    if (ordinal < 0) {
        std::fprintf(
            stderr,
            "bitship-gpu: --ordinal N is needed (started by xagent, with its socket on fd %d)\n",
            proto::kProcessFd);
        return kExitUsage;
    }
    // No PR_SET_PDEATHSIG: it fires when the thread that started us ends, and the agent restarts
    // GPU processes from worker threads. An agent that ends closes the socket, which ends the
    // loop below (a kernel still running first runs to its timeout).

    auto window = proto::Window::map(proto::kWindowFd);
    if (!window) {
        (void)send(proto::encode(proto::Failed{window.error(), false}));
        return kExitStartFailed;
    }
    auto driver = load_cuda_driver(library);
    auto gpu = driver ? GpuDevice::open(driver->api, ordinal)
                      : Result<std::unique_ptr<GpuDevice>>(tl::make_unexpected(driver.error()));
    if (!gpu) {
        (void)send(proto::encode(proto::Failed{gpu.error(), false}));
        return kExitStartFailed;
    }
    // Reads, writes and launch arguments then go by DMA straight to and from the window; a
    // driver that refuses to pin it leaves them on the staging buffers (one more host copy).
    if (auto pinned = (*gpu)->pin(window->bytes()); !pinned)
        std::fprintf(stderr, "bitship-gpu: GPU %d: the window stays unpinned (staged copies): %s\n",
                     ordinal, pinned.error().describe().c_str());
    if (!send(proto::encode(proto::Ready{proto::kVersion, (*gpu)->info()}))) return kExitSocketLost;

    for (;;) {
        spin_until_readable(proto::kProcessFd, kNextRequestSpin);
        auto frame = read_frame(proto::kProcessFd, proto::kMaxFrame, kPeer);
        if (!frame) {
            if (frame.error().code == Errc::disconnected) return 0; // the agent is done with us
            std::fprintf(stderr, "bitship-gpu: GPU %d: %s\n", ordinal,
                         frame.error().describe().c_str());
            return kExitSocketLost;
        }
        const bool sent = send(serve(**gpu, window->bytes(), *frame));
        if (!(*gpu)->poisoned().empty()) ::_exit(0); // see the header: no teardown
        if (!sent) return kExitSocketLost;
    }
}
