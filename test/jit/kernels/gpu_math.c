/* exp() of each float of GPU region 0 into region 1, through libdevice (__nv_expf) on the GPU
 * and libm's expf on a CPU slice; the result is the number of values written. */
#include <bitship/gpu_kernel.h>

#if defined(__NVPTX__)
float __nv_expf(float);
#define bs_expf __nv_expf
#else
float expf(float);
#define bs_expf expf
#endif

struct gpu_exp_args {
    uint64_t count;
};

BS_GPU_KERNEL(gpu_exp_f32) {
    const struct gpu_exp_args* in = (const struct gpu_exp_args*)args;
    const float* x = (const float*)regions[0];
    float* y = (float*)regions[1];
    uint32_t done = 0;
    for (uint64_t i = bs_gpu_global_id_x(); i < in->count; i += bs_gpu_global_size_x()) {
        y[i] = bs_expf(x[i]);
        ++done;
    }
    bs_gpu_membar_gpu();
    bs_gpu_atomic_add_u32((uint32_t*)result, done);
}
