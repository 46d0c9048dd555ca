/* Sums `count` u64 values of GPU region 0 into the u64 result: a grid-stride loop per thread,
 * then one relaxed atomic add per thread (the result buffer is zeroed before the launch). */
#include <bitship/gpu_kernel.h>

struct gpu_reduce_args {
    uint64_t count;
};

BS_GPU_KERNEL(gpu_reduce_u64) {
    const struct gpu_reduce_args* in = (const struct gpu_reduce_args*)args;
    const uint64_t* data = (const uint64_t*)regions[0];
    uint64_t local = 0;
    for (uint64_t i = bs_gpu_global_id_x(); i < in->count; i += bs_gpu_global_size_x())
        local += data[i];
    if (local != 0) bs_gpu_atomic_add_u64((uint64_t*)result, local);
}
