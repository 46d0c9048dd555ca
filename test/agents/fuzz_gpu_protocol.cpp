// libFuzzer: the decoders of the agent ⇄ bitship-gpu frames (agents/gpu_process_protocol.hpp)
// never read outside their input and never accept a size past the window, whatever bytes they
// are given. The agent decodes what a process that runs shipped GPU code sends back; the
// process decodes the agent's requests.
#include "gpu_process_protocol.hpp"

#include <cstdint>
#include <span>

namespace proto = bitship::agent::gpu_protocol;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::span<const std::byte> frame(reinterpret_cast<const std::byte*>(data), size);
    volatile std::uint64_t sink = 0;
    if (auto m = proto::decode_ready(frame)) sink = sink + m->gpu.name.size() + m->gpu.limits.max_grid[2];
    if (auto m = proto::decode_add_region(frame)) sink = sink + m->size;
    if (auto m = proto::decode_load_module(frame)) sink = sink + m->ptx.size();
    if (auto m = proto::decode_unload_module(frame)) sink = sink + static_cast<std::uint8_t>(m->hash[0]);
    if (auto m = proto::decode_launch(frame)) {
        if (m->args_bytes > proto::kWindowBytes || m->result_bytes > proto::kWindowBytes)
            __builtin_trap();
        sink = sink + m->args_bytes;
    }
    for (auto decode : {proto::decode_read, proto::decode_write})
        if (auto m = decode(frame)) {
            if (m->length > proto::kWindowBytes) __builtin_trap();
            // What the process then touches, window.subspan(at, length), lies in the window.
            if (m->at > proto::kWindowTotalBytes || m->length > proto::kWindowTotalBytes - m->at) __builtin_trap();
            sink = sink + m->offset;
        }
    if (auto m = proto::decode_ok(frame)) {
        if (*m > proto::kWindowBytes) __builtin_trap();
    }
    if (auto m = proto::decode_failed(frame)) sink = sink + m->error.message.size();
    (void)sink;
    return 0;
}
