/* bench/gpu_reduce's kernels: fill and sum u64 values of a region, shipped to an agent's GPU
 * (the nvptx64 slice, over its GPU region 0) and, with the same names, to its CPU (the x86_64
 * slice, over its host region "data"): every slice of a bundle defines the same entry points.
 * bench/kernels/gpu_reduce_native.cu is the same GPU code in CUDA C++, the native baseline.
 *
 * Arguments: fill_u64 {count, mul, add} writes data[i] = i * mul + add for i < count;
 * sum_u64 {count} answers the u64 sum (mod 2^64) of data[0..count). */
#include <stdint.h>

struct fill_args {
    uint64_t count, mul, add;
};
struct sum_args {
    uint64_t count;
};

#ifdef __NVPTX__
#include <bitship/gpu_kernel.h>

/* Two u64 a step: one 16-byte load (ld.v2.u64). Region bases come from cuMemAlloc (256-byte
 * aligned), so pairs of a region's u64s are 16-byte aligned. */
typedef uint64_t u64x2 __attribute__((ext_vector_type(2)));

enum { kWarp = 32 };

/* The sum of `v` over the 32 lanes of this thread's warp, in lane 0 (the other lanes hold
 * partial sums). Every lane of the warp must call it: blocks are whole warps. */
static uint64_t warp_sum(uint64_t v) {
    for (int delta = kWarp / 2; delta > 0; delta /= 2) {
        uint32_t lo = (uint32_t)__nvvm_shfl_sync_down_i32(0xffffffffu, (int)(uint32_t)v, delta, kWarp - 1);
        uint32_t hi = (uint32_t)__nvvm_shfl_sync_down_i32(0xffffffffu, (int)(uint32_t)(v >> 32), delta, kWarp - 1);
        v += ((uint64_t)hi << 32) | lo;
    }
    return v;
}

BS_GPU_KERNEL(fill_u64) {
    const struct fill_args* in = (const struct fill_args*)args;
    uint64_t* data = (uint64_t*)regions[0];
    (void)result;
    for (uint64_t i = bs_gpu_global_id_x(); i < in->count; i += bs_gpu_global_size_x()) data[i] = i * in->mul + in->add;
}

/* A grid-stride loop over pairs, the odd last value by thread 0, then one atomic add per warp
 * (per thread when a block is not whole warps): a single result address takes 32 times fewer
 * atomics than one per thread. */
BS_GPU_KERNEL(sum_u64) {
    const struct sum_args* in = (const struct sum_args*)args;
    const u64x2* pairs = (const u64x2*)regions[0];
    const uint64_t count = in->count, id = bs_gpu_global_id_x(), stride = bs_gpu_global_size_x();
    uint64_t local = 0;
    for (uint64_t i = id; i < count / 2; i += stride) {
        u64x2 v = pairs[i];
        local += v.x + v.y;
    }
    if (id == 0 && (count & 1)) local += ((const uint64_t*)regions[0])[count - 1];
    if (bs_gpu_block_dim_x() % kWarp == 0 && bs_gpu_block_dim_y() == 1 && bs_gpu_block_dim_z() == 1) {
        local = warp_sum(local);
        if (bs_gpu_thread_x() % kWarp != 0) return;
    }
    if (local != 0) bs_gpu_atomic_add_u64((uint64_t*)result, local);
}
#else
#include <bitship/kernel.h>

/* The CPU slice: the same computation over the agent's host region "data". */
static uint64_t* host_data(bs_ctx* ctx, uint64_t count) {
    size_t size = 0;
    uint64_t* data = (uint64_t*)bs_region(ctx, "data", &size);
    if (!data) return (void)bs_fail(ctx, 1, "gpu_reduce: this agent has no host region 'data'"), (uint64_t*)0;
    if (count > size / sizeof *data) return (void)bs_fail(ctx, 2, "gpu_reduce: count exceeds region 'data'"), (uint64_t*)0;
    return data;
}

BS_KERNEL(fill_u64) {
    size_t len = 0;
    const struct fill_args* in = (const struct fill_args*)bs_args(ctx, &len);
    if (len != sizeof *in) return (void)bs_fail(ctx, 3, "fill_u64: expected {count, mul, add}");
    uint64_t* data = host_data(ctx, in->count);
    if (!data) return;
    for (uint64_t i = 0; i < in->count; ++i) data[i] = i * in->mul + in->add;
    bs_reply(ctx, 0, 0);
}

BS_KERNEL(sum_u64) {
    size_t len = 0;
    const struct sum_args* in = (const struct sum_args*)bs_args(ctx, &len);
    if (len != sizeof *in) return (void)bs_fail(ctx, 3, "sum_u64: expected {count}");
    const uint64_t* data = host_data(ctx, in->count);
    if (!data) return;
    uint64_t sum = 0;
    for (uint64_t i = 0; i < in->count; ++i) sum += data[i];
    bs_reply(ctx, &sum, sizeof sum);
}
#endif
