/* GPU kernels for test/gpu and bench/gpu_reduce's checks: the nvptx64 slice holds the GPU
 * kernels, the x86_64 slice the CPU ones the same tests call (a CPU kernel must not see the
 * agent's GPU regions). Region 0 of a GPU kernel is the agent's first GPU region. */
#include <stdint.h>

#ifdef __NVPTX__
#include <bitship/gpu_kernel.h>

struct fill_args {
    uint64_t count, mul, add;
};
struct sum_args {
    uint64_t count;
};

/* data[i] = i * mul + add for i < count, over region 0. */
BS_GPU_KERNEL(fill_u64) {
    const struct fill_args* in = (const struct fill_args*)args;
    uint64_t* data = (uint64_t*)regions[0];
    (void)result;
    for (uint64_t i = bs_gpu_global_id_x(); i < in->count; i += bs_gpu_global_size_x()) data[i] = i * in->mul + in->add;
}

/* The sum of region 0's first count u64s. */
BS_GPU_KERNEL(sum_u64) {
    const struct sum_args* in = (const struct sum_args*)args;
    const uint64_t* data = (const uint64_t*)regions[0];
    uint64_t local = 0;
    for (uint64_t i = bs_gpu_global_id_x(); i < in->count; i += bs_gpu_global_size_x()) local += data[i];
    bs_gpu_atomic_add_u64((uint64_t*)result, local);
}

/* Where it ran: 1 on a GPU (the CPU slice's `where` answers 0), and the grid it ran with. */
static void report_where(void* result) {
    uint64_t* out = (uint64_t*)result;
    if (bs_gpu_global_id_x() == 0) {
        out[0] = 1;
        out[1] = bs_gpu_grid_dim_x();
        out[2] = bs_gpu_block_dim_x();
    }
}

BS_GPU_KERNEL(where) {
    (void)args;
    (void)regions;
    report_where(result);
}

/* `where` with a declared geometry: 128 threads a block, 2 blocks per multiprocessor. */
BS_GPU_GEOMETRY(where_declared, 128, 2);
BS_GPU_KERNEL(where_declared) {
    (void)args;
    (void)regions;
    report_where(result);
}

/* 1: a GPU kernel sees the agent's first GPU region. */
BS_GPU_KERNEL(sees_data) {
    (void)args;
    if (bs_gpu_global_id_x() == 0) *(uint64_t*)result = regions[0] != 0;
}

/* A store to an address no allocation holds: CUDA_ERROR_ILLEGAL_ADDRESS. */
BS_GPU_KERNEL(fault) {
    (void)args;
    (void)result;
    (void)regions;
    *(volatile uint64_t*)(uintptr_t)0x10 = 1;
}

/* Never returns (the agent's kernel timeout stops it). */
BS_GPU_KERNEL(spin_forever) {
    (void)args;
    (void)regions;
    volatile uint64_t* out = (volatile uint64_t*)result;
    for (uint64_t i = 0;; ++i) *out = i;
}
#else
#include <bitship/kernel.h>

/* The CPU slice of the same kernels (a bundle's slices define the same names). A CPU kernel
 * does not see the agent's GPU regions: those asking for "data" fail saying so. */
static const uint64_t* data_region(bs_ctx* ctx, size_t* size) { return (const uint64_t*)bs_region(ctx, "data", size); }

BS_KERNEL(fill_u64) {
    size_t size = 0;
    if (!data_region(ctx, &size)) return (void)bs_fail(ctx, 2, "fill_u64 (CPU): no region 'data' here");
    bs_reply(ctx, 0, 0);
}

BS_KERNEL(sum_u64) {
    size_t len = 0, size = 0;
    const uint64_t* count = (const uint64_t*)bs_args(ctx, &len);
    const uint64_t* data = data_region(ctx, &size);
    if (!data) return (void)bs_fail(ctx, 2, "sum_u64 (CPU): no region 'data' here");
    uint64_t sum = 0;
    for (uint64_t i = 0; len == sizeof *count && i < *count && i < size / 8; ++i) sum += data[i];
    bs_reply(ctx, &sum, sizeof sum);
}

BS_KERNEL(where) {
    uint64_t out[3] = {0, 0, 0};
    bs_reply(ctx, out, sizeof out);
}

BS_KERNEL(where_declared) {
    uint64_t out[3] = {0, 0, 0};
    bs_reply(ctx, out, sizeof out);
}

BS_KERNEL(fault) { bs_fail(ctx, 3, "fault: a GPU kernel"); }
BS_KERNEL(spin_forever) { bs_fail(ctx, 3, "spin_forever: a GPU kernel"); }

/* 1 when this CPU kernel can see a region named "data" (it must not: that is a GPU region). */
BS_KERNEL(sees_data) {
    size_t size = 0;
    uint64_t seen = data_region(ctx, &size) != 0;
    bs_reply(ctx, &seen, sizeof seen);
}
#endif
