/* bitship GPU kernel ABI: the header a GPU kernel author includes (plain C, clang 19).
 *
 * A GPU kernel is a C function defined with BS_GPU_KERNEL, compiled by bitship_add_kernels()
 * with `ARCHS ... nvptx64` to an nvptx64-nvidia-cuda bitcode slice. The agent turns that slice
 * into PTX (libdevice linked, internalized, NVVMReflect, O3) and launches it on its GPU:
 *
 *     #include <bitship/gpu_kernel.h>
 *     struct sum_args { uint64_t count; };
 *     BS_GPU_KERNEL(sum_u64) {
 *         const struct sum_args* in = (const struct sum_args*)args;
 *         const uint64_t* data = (const uint64_t*)regions[0];
 *         uint64_t local = 0;
 *         for (uint64_t i = bs_gpu_global_id_x(); i < in->count; i += bs_gpu_global_size_x())
 *             local += data[i];
 *         bs_gpu_atomic_add_u64((uint64_t*)result, local);
 *     }
 *
 * The ABI: every kernel has exactly the parameters
 *     const void*  args     the call's argument bytes, copied to device memory, 16-byte aligned
 *     void*        result   the call's result buffer in device memory, zeroed before the launch;
 *                           its bytes are copied back and returned as the call's result
 *     void* const* regions  device pointers to the agent's GPU regions, in the order the agent
 *                           lists them (its WELCOME); a GPU kernel sees only GPU regions
 * and returns nothing. Launch geometry (grid, block) comes with the call.
 *
 * The same source may also be built for a CPU architecture (ARCHS x86_64 nvptx64): there
 * BS_GPU_KERNEL defines a plain function with the same parameters, the index helpers describe
 * a grid of one block of one thread, and the atomics are the compiler's relaxed __atomic
 * builtins, so a grid-stride loop as above covers the whole range on either target.
 *
 * What a GPU kernel may call, and clang 19's limits here (C for nvptx64, not CUDA):
 *   - The helpers below (thread/block indices, relaxed atomics, memory barriers).
 *   - libdevice math: declare what you use, e.g. `float __nv_expf(float);`,
 *     `double __nv_exp(double);`, `float __nv_sqrtf(float);` (libdevice's names, all
 *     `__nv_*`). C's exp, sinf, ... are not available: there is no libm on the device, and a
 *     call to them is left unresolved (ptxas rejects it). The agent links libdevice lazily, only
 *     what is called.
 *   - printf: bs_gpu_printf(fmt, ...) is the device's printf (CUDA's `vprintf` system call, which
 *     ptxas and the driver provide). LLVM 19 packs the variadic arguments into a buffer, the
 *     ABI vprintf expects; C's `printf` by that name would stay an unresolved `.func`.
 *   - No seq_cst atomics or fences: clang 19 / LLVM 19 lower only relaxed (monotonic) atomic
 *     read-modify-writes correctly for nvptx; order them with bs_gpu_membar_* (membar.cta/gl/sys).
 *     __atomic_thread_fence and seq_cst/acquire/release orderings are not supported here.
 *   - No `__shared__` memory, no warp intrinsics beyond what __nvvm_* builtins give, no C library.
 *   - Every non-static function in the source must be a kernel: a definition without the kernel
 *     attribute would be emitted as a callable `.func` nobody can launch. The nvptx64 slice is
 *     built with -Werror=ignored-attributes -Werror=unknown-attributes (the attribute dropped or
 *     misspelt is an error) and -Werror=missing-prototypes (a non-static definition that did not
 *     come through BS_GPU_KERNEL is an error); helpers must be `static`.
 */
#ifndef BITSHIP_GPU_KERNEL_H
#define BITSHIP_GPU_KERNEL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Declares kernel `name`'s launch geometry for calls that name none (ShipOptions::grid and
 *  block left at x = 0): `threads` a block and `blocks_per_sm` blocks per multiprocessor of the
 *  GPU it runs on (a grid-stride loop covers any size with it). Without it the agent uses 256
 *  and 8. Put it beside the kernel, in every slice's source (a CPU slice ignores it):
 *
 *      BS_GPU_GEOMETRY(sum_u64, 512, 4);
 *
 *  It defines a constant `bs_gpu_geometry_<name>` that the agent reads from the kernel's PTX. */
#define BS_GPU_GEOMETRY(name, threads, blocks_per_sm)                                              \
    extern const uint32_t bs_gpu_geometry_##name[2];                                               \
    const uint32_t bs_gpu_geometry_##name[2] = {(threads), (blocks_per_sm)}
/** What every such constant's name starts with. */
#define BS_GPU_GEOMETRY_PREFIX "bs_gpu_geometry_"

/** The signature every GPU kernel entry has. */
typedef void (*bs_gpu_entry_fn)(const void* args, void* result, void* const* regions);

#if defined(__NVPTX__)
/** The attribute that makes a function a launchable `.entry` (clang 19, C, nvptx64). */
#define BS_GPU_KERNEL_ATTR __attribute__((nvptx_kernel))
#else
#define BS_GPU_KERNEL_ATTR
#endif

/** Declares and defines GPU kernel `name` (see the ABI above). The declaration comes first so
 *  that -Werror=missing-prototypes accepts the kernel and rejects any other non-static function. */
#define BS_GPU_KERNEL(name)                                                                        \
    BS_GPU_KERNEL_ATTR void name(const void* args, void* result, void* const* regions);          \
    BS_GPU_KERNEL_ATTR void name(const void* args, void* result, void* const* regions)

#if defined(__NVPTX__)

/** This thread's index within its block (threadIdx.x, .y, .z). */
static inline unsigned bs_gpu_thread_x(void) { return (unsigned)__nvvm_read_ptx_sreg_tid_x(); }
static inline unsigned bs_gpu_thread_y(void) { return (unsigned)__nvvm_read_ptx_sreg_tid_y(); }
static inline unsigned bs_gpu_thread_z(void) { return (unsigned)__nvvm_read_ptx_sreg_tid_z(); }
/** This block's index within the grid (blockIdx.x, .y, .z). */
static inline unsigned bs_gpu_block_x(void) { return (unsigned)__nvvm_read_ptx_sreg_ctaid_x(); }
static inline unsigned bs_gpu_block_y(void) { return (unsigned)__nvvm_read_ptx_sreg_ctaid_y(); }
static inline unsigned bs_gpu_block_z(void) { return (unsigned)__nvvm_read_ptx_sreg_ctaid_z(); }
/** Threads per block (blockDim.x, .y, .z). */
static inline unsigned bs_gpu_block_dim_x(void) { return (unsigned)__nvvm_read_ptx_sreg_ntid_x(); }
static inline unsigned bs_gpu_block_dim_y(void) { return (unsigned)__nvvm_read_ptx_sreg_ntid_y(); }
static inline unsigned bs_gpu_block_dim_z(void) { return (unsigned)__nvvm_read_ptx_sreg_ntid_z(); }
/** Blocks in the grid (gridDim.x, .y, .z). */
static inline unsigned bs_gpu_grid_dim_x(void) { return (unsigned)__nvvm_read_ptx_sreg_nctaid_x(); }
static inline unsigned bs_gpu_grid_dim_y(void) { return (unsigned)__nvvm_read_ptx_sreg_nctaid_y(); }
static inline unsigned bs_gpu_grid_dim_z(void) { return (unsigned)__nvvm_read_ptx_sreg_nctaid_z(); }

/** The device's printf (see above): returns the number of arguments or a negative value. */
int bs_gpu_printf(const char* fmt, ...) __asm__("vprintf");

/** Waits until every thread of the block reaches it (__syncthreads). */
static inline void bs_gpu_sync_block(void) { __nvvm_bar_sync(0); }
/** Memory barriers: orders this thread's memory accesses as seen by its block (membar.cta),
 *  the whole GPU (membar.gl) or the GPU and the host (membar.sys). */
static inline void bs_gpu_membar_block(void) { __nvvm_membar_cta(); }
static inline void bs_gpu_membar_gpu(void) { __nvvm_membar_gl(); }
static inline void bs_gpu_membar_system(void) { __nvvm_membar_sys(); }

#else /* a CPU slice of the same source: one block of one thread */

static inline unsigned bs_gpu_thread_x(void) { return 0; }
static inline unsigned bs_gpu_thread_y(void) { return 0; }
static inline unsigned bs_gpu_thread_z(void) { return 0; }
static inline unsigned bs_gpu_block_x(void) { return 0; }
static inline unsigned bs_gpu_block_y(void) { return 0; }
static inline unsigned bs_gpu_block_z(void) { return 0; }
static inline unsigned bs_gpu_block_dim_x(void) { return 1; }
static inline unsigned bs_gpu_block_dim_y(void) { return 1; }
static inline unsigned bs_gpu_block_dim_z(void) { return 1; }
static inline unsigned bs_gpu_grid_dim_x(void) { return 1; }
static inline unsigned bs_gpu_grid_dim_y(void) { return 1; }
static inline unsigned bs_gpu_grid_dim_z(void) { return 1; }
#define bs_gpu_printf(...) ((void)0, 0) /* no device console on a CPU slice */
static inline void bs_gpu_sync_block(void) {}
static inline void bs_gpu_membar_block(void) { __atomic_signal_fence(__ATOMIC_SEQ_CST); }
static inline void bs_gpu_membar_gpu(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline void bs_gpu_membar_system(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

#endif

/** This thread's index in the whole grid along x, and the number of threads in the grid along
 *  x: the start and stride of a grid-stride loop. */
static inline uint64_t bs_gpu_global_id_x(void) {
    return (uint64_t)bs_gpu_block_x() * bs_gpu_block_dim_x() + bs_gpu_thread_x();
}
static inline uint64_t bs_gpu_global_size_x(void) { return (uint64_t)bs_gpu_grid_dim_x() * bs_gpu_block_dim_x(); }

/** Relaxed atomic adds (atom.add on the device); return the previous value. Order them with a
 *  bs_gpu_membar_* when another thread must see earlier stores first. */
static inline uint64_t bs_gpu_atomic_add_u64(uint64_t* p, uint64_t v) {
    return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
static inline uint32_t bs_gpu_atomic_add_u32(uint32_t* p, uint32_t v) {
    return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
static inline int64_t bs_gpu_atomic_add_i64(int64_t* p, int64_t v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
/** Relaxed atomic float add (atom.add.f32 on the device; a compare-and-swap loop on a CPU). */
static inline float bs_gpu_atomic_add_f32(float* p, float v) {
#if defined(__NVPTX__)
    return __nvvm_atom_add_gen_f(p, v);
#else
    union { float f; uint32_t u; } old, want;
    old.u = __atomic_load_n((uint32_t*)p, __ATOMIC_RELAXED);
    do {
        want.f = old.f + v;
    } while (!__atomic_compare_exchange_n((uint32_t*)p, &old.u, want.u, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    return old.f;
#endif
}

#ifdef __cplusplus
}
#endif

#endif /* BITSHIP_GPU_KERNEL_H */
