// bench/gpu_reduce's native baseline: the kernels of bench/kernels/gpu_reduce.c (nvptx64
// slice), statement for statement, in CUDA C++, compiled by nvcc to a cubin at build time
// (nvcc -cubin -arch=sm_90 -O3) and launched by the bench through the driver API. Same ABI as a
// shipped GPU kernel: (args, result, regions), args and the regions table in device memory.
#include <cstdint>

namespace {

struct FillArgs {
    std::uint64_t count, mul, add;
};
struct SumArgs {
    std::uint64_t count;
};

constexpr int kWarp = 32;

__device__ std::uint64_t global_id_x() { return std::uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ std::uint64_t global_size_x() { return std::uint64_t(gridDim.x) * blockDim.x; }

// As gpu_reduce.c's warp_sum: two 32-bit shuffles a step.
__device__ std::uint64_t warp_sum(std::uint64_t v) {
    for (int delta = kWarp / 2; delta > 0; delta /= 2) {
        auto lo = static_cast<std::uint32_t>(__shfl_down_sync(0xffffffffu, static_cast<int>(static_cast<std::uint32_t>(v)), delta));
        auto hi = static_cast<std::uint32_t>(__shfl_down_sync(0xffffffffu, static_cast<int>(static_cast<std::uint32_t>(v >> 32)), delta));
        v += (std::uint64_t(hi) << 32) | lo;
    }
    return v;
}

} // namespace

extern "C" __global__ void fill_u64(const void* args, void* result, void* const* regions) {
    const auto* in = static_cast<const FillArgs*>(args);
    auto* data = static_cast<std::uint64_t*>(regions[0]);
    (void)result;
    for (std::uint64_t i = global_id_x(); i < in->count; i += global_size_x()) data[i] = i * in->mul + in->add;
}

extern "C" __global__ void sum_u64(const void* args, void* result, void* const* regions) {
    const auto* in = static_cast<const SumArgs*>(args);
    const auto* pairs = static_cast<const ulonglong2*>(regions[0]); // 16-byte loads, as the C kernel's u64x2
    const std::uint64_t count = in->count, id = global_id_x(), stride = global_size_x();
    std::uint64_t local = 0;
    for (std::uint64_t i = id; i < count / 2; i += stride) {
        ulonglong2 v = pairs[i];
        local += v.x + v.y;
    }
    if (id == 0 && (count & 1)) local += static_cast<const std::uint64_t*>(regions[0])[count - 1];
    if (blockDim.x % kWarp == 0 && blockDim.y == 1 && blockDim.z == 1) {
        local = warp_sum(local);
        if (threadIdx.x % kWarp != 0) return;
    }
    if (local != 0) atomicAdd(static_cast<unsigned long long*>(result), static_cast<unsigned long long>(local));
}
