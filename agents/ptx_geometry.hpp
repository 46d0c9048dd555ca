#pragma once
// A GPU kernel's declared launch geometry (BS_GPU_GEOMETRY in <bitship/gpu_kernel.h>), read from
// the PTX the agent made of its slice: the constant `bs_gpu_geometry_<entry>`, which the PTX
// compile keeps external, as LLVM's NVPTX back end writes it, e.g.
//
//   .visible .global .align 4 .b8 bs_gpu_geometry_sum_u64[8] = {0, 2, 0, 0, 4};
//
// (bytes, little-endian, trailing zeros left out) or as .b32/.u32 words.

#include <cstdint>
#include <optional>
#include <string_view>

namespace bitship::agent {

struct DeclaredGeometry {
    std::uint32_t threads = 0;       ///< a block
    std::uint32_t blocks_per_sm = 0; ///< of the GPU it runs on
};

/// `entry`'s declared geometry in `ptx`, or nullopt when it declares none, or declares it in a
/// form this reader does not know (the caller then uses its default). Zeros are returned as
/// they are: the launch refuses a geometry the device cannot have, naming it.
std::optional<DeclaredGeometry> declared_geometry(std::string_view ptx, std::string_view entry);

} // namespace bitship::agent
