// libFuzzer: the reader of a GPU kernel's declared geometry (agents/ptx_geometry.hpp) never reads
// outside its input, whatever PTX text and entry name it is given. The input is split at its
// first NUL: the entry name, then the PTX.
#include <cstdint>
#include <string_view>

#include "ptx_geometry.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    std::string_view input(reinterpret_cast<const char*>(data), size);
    auto split = input.find('\0');
    auto entry = split == std::string_view::npos ? std::string_view("k") : input.substr(0, split);
    auto ptx = split == std::string_view::npos ? input : input.substr(split + 1);
    if (auto g = bitship::agent::declared_geometry(ptx, entry)) {
        volatile std::uint32_t sink = g->threads + g->blocks_per_sm;
        (void)sink;
    }
    return 0;
}
