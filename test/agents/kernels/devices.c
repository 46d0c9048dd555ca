/* One kernel, "twice", for the CPU and for an NVIDIA GPU: a bundle with an x86_64 and an
 * nvptx64 slice (test/agents/gpu_slice_test.cpp). */
#include <stdint.h>

#ifdef __NVPTX__
#include <bitship/gpu_kernel.h>

BS_GPU_KERNEL(twice) {
    (void)regions;
    if (bs_gpu_global_id_x() == 0) *(uint64_t*)result = 2 * *(const uint64_t*)args;
}
#else
#include <bitship/kernel.h>

BS_KERNEL(twice) {
    size_t len;
    const uint64_t* in = (const uint64_t*)bs_args(ctx, &len);
    uint64_t out = len == sizeof *in ? 2 * *in : 0;
    bs_reply(ctx, &out, sizeof out);
}
#endif
