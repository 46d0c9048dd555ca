// A fake CUDA driver, built as a shared library (libbitship_fake_cuda.so) that xagent opens with
// `--cuda-library PATH` instead of libcuda.so.1, so that the GPU path between a client and the
// driver runs end to end on a machine with no GPU (test/agents/gpu_plumbing_test.cpp).
//
// IT EXECUTES NO PTX. It checks that what reaches it is PTX text, and "runs" a kernel by its
// entry name from the small table below. What it proves is the plumbing (the RUN's launch block,
// the PTX made by the compiler process reaching cuModuleLoadDataEx, the three kernel parameters,
// GPU region reads and writes, fault and timeout recovery); test/gpu runs the real thing.
//
// The whole behaviour:
//   - One GPU, ordinal 0: "Fake GPU (bitship tests)", compute capability 9.0, 132
//     multiprocessors, 1 GiB, PCI bus id "0000:00:00.0", an H100's limits (1024 threads a block,
//     block 1024 x 1024 x 64, grid 2^31-1 x 65535 x 65535). Driver version 13.0.
//   - Every call but the version and error-name ones needs cuInit first
//     (CUDA_ERROR_NOT_INITIALIZED).
//   - Device memory is host memory: cuMemAlloc gives a 256-byte aligned host allocation and the
//     CUdeviceptr is its address. Copies and memsets check that the device range lies inside one
//     live allocation of the stream's context (else CUDA_ERROR_INVALID_VALUE) and happen at once,
//     unless the stream is held up behind a kernel that spins or faulted: then, as on a GPU, the
//     work is queued behind it and never happens.
//   - One primary context: retain/release count references; the last release destroys it, as
//     cuDevicePrimaryCtxReset does (which is counted). Destroying a context frees its memory,
//     host registrations, streams, events and modules; their handles are never reused, and
//     using one afterwards is CUDA_ERROR_INVALID_HANDLE (a context:
//     CUDA_ERROR_CONTEXT_IS_DESTROYED). Calls that allocate or load use the calling thread's
//     current context (cuCtxSetCurrent): none is CUDA_ERROR_INVALID_CONTEXT.
//   - cuModuleLoadDataEx takes NUL-terminated PTX text: text without ".version" and ".entry", or
//     whose ".target sm_NN" is above the device's 90, is CUDA_ERROR_INVALID_PTX with a line in
//     the CU_JIT_ERROR_LOG_BUFFER option's buffer. The text is kept.
//   - cuModuleGetFunction finds `.entry NAME` followed by white space or '(' (comments are
//     ignored), else CUDA_ERROR_NOT_FOUND.
//   - cuLaunchKernel checks the geometry against the limits and the shared memory against 48 KiB
//     (CUDA_ERROR_INVALID_VALUE), takes kernelParams only (not `extra`), and refuses
//     (CUDA_ERROR_INVALID_VALUE) an entry whose PTX parameters are not the bitship ABI's three
//     `.param .u64`. It reads the three u64 values (args, result, regions table) and runs, by
//     entry name:
//       twice        result u64 = 2 * args u64[0]
//       sum_u64      result u64 += sum of regions[0]'s first args u64[0] u64s
//       fill_u64     args {count, mul, add}: regions[0] u64[i] = i * mul + add for i < count
//       where, where_declared  result u64[3] = {1, grid x, block x}
//       sees_data    result u64 = regions[0] != 0
//       fault        the launch fails on the device with CUDA_ERROR_ILLEGAL_ADDRESS
//       spin_forever never finishes: its stream is not ready until the context is destroyed
//       anything else the launch fails on the device with CUDA_ERROR_LAUNCH_FAILED
//     A table kernel whose loads or stores leave every allocation faults the same way as `fault`.
//   - A device failure is seen by the next cuStreamQuery, cuStreamSynchronize, cuEventSynchronize
//     (of an event recorded after it) or cuCtxSynchronize; from then on it is sticky: every call
//     in that context returns it (except making the context current, retaining, releasing and
//     resetting it) until the context is destroyed; and, as on a real driver (580, H100), the
//     process stays poisoned: a later cuDevicePrimaryCtxRetain returns the same error, so only a
//     new process recovers.
//   - cuStreamQuery of a stream behind spin_forever is CUDA_ERROR_NOT_READY; cuStreamSynchronize,
//     cuEventSynchronize and cuCtxSynchronize wait for it, i.e. until the context is destroyed
//     (then CUDA_ERROR_CONTEXT_IS_DESTROYED).
//   - Thread-safe: one mutex guards everything.
//   - bitship_fake_cuda_stats() reads how many times the primary context was reset and how many
//     modules were loaded, for tests that open the library in their own process.
//
// The entry points are in four files: this one (initialisation, the device, primary contexts),
// fake_streams.cpp, fake_modules.cpp (and the table kernels) and fake_memory.cpp; fake_state.hpp
// holds what they share.

#include "fake_state.hpp"

#include <algorithm>
#include <cstring>

using namespace bitship::test::fake_cuda;

// Initialisation, version, errors.

FAKE_CUDA_EXPORT CUresult cuInit(unsigned flags) {
    if (flags != 0) return cuda::kErrorInvalidValue;
    auto& s = state();
    std::lock_guard lock(s.mutex);
    s.initialized = true;
    return cuda::kSuccess;
}

FAKE_CUDA_EXPORT CUresult cuDriverGetVersion(int* version) {
    if (version == nullptr) return cuda::kErrorInvalidValue;
    *version = kDriverVersion;
    return cuda::kSuccess;
}

FAKE_CUDA_EXPORT CUresult cuGetErrorName(CUresult error, const char** name) {
    if (name == nullptr) return cuda::kErrorInvalidValue;
    const ErrorText* e = error_text(error);
    *name = e ? e->name : nullptr;
    return e ? cuda::kSuccess : cuda::kErrorInvalidValue;
}

FAKE_CUDA_EXPORT CUresult cuGetErrorString(CUresult error, const char** text) {
    if (text == nullptr) return cuda::kErrorInvalidValue;
    const ErrorText* e = error_text(error);
    *text = e ? e->text : nullptr;
    return e ? cuda::kSuccess : cuda::kErrorInvalidValue;
}

// Devices.

namespace {
CUresult check_device(CUdevice device) {
    auto& s = state();
    std::lock_guard lock(s.mutex);
    if (!s.initialized) return kErrorNotInitialized;
    return device >= 0 && device < kDeviceCount ? cuda::kSuccess : cuda::kErrorInvalidDevice;
}

CUresult copy_text(char* out, int length, const char* text) {
    if (out == nullptr || length <= 0) return cuda::kErrorInvalidValue;
    const std::size_t n = std::min(std::strlen(text), static_cast<std::size_t>(length) - 1);
    std::memcpy(out, text, n);
    out[n] = '\0';
    return cuda::kSuccess;
}
} // namespace

FAKE_CUDA_EXPORT CUresult cuDeviceGetCount(int* count) {
    if (count == nullptr) return cuda::kErrorInvalidValue;
    auto& s = state();
    std::lock_guard lock(s.mutex);
    if (!s.initialized) return kErrorNotInitialized;
    *count = kDeviceCount;
    return cuda::kSuccess;
}

FAKE_CUDA_EXPORT CUresult cuDeviceGet(CUdevice* device, int ordinal) {
    if (device == nullptr) return cuda::kErrorInvalidValue;
    if (CUresult r = check_device(ordinal); r != cuda::kSuccess) return r;
    *device = ordinal;
    return cuda::kSuccess;
}

FAKE_CUDA_EXPORT CUresult cuDeviceGetName(char* name, int length, CUdevice device) {
    if (CUresult r = check_device(device); r != cuda::kSuccess) return r;
    return copy_text(name, length, kName);
}

FAKE_CUDA_EXPORT CUresult cuDeviceGetPCIBusId(char* bus_id, int length, CUdevice device) {
    if (CUresult r = check_device(device); r != cuda::kSuccess) return r;
    return copy_text(bus_id, length, kBusId);
}

FAKE_CUDA_EXPORT CUresult cuDeviceGetAttribute(int* value, int attribute, CUdevice device) {
    if (value == nullptr) return cuda::kErrorInvalidValue;
    if (CUresult r = check_device(device); r != cuda::kSuccess) return r;
    // The fake knows only what the agent asks.
    return bitship::test::fake_gpu::attribute(attribute, *value) ? cuda::kSuccess : cuda::kErrorInvalidValue;
}

FAKE_CUDA_EXPORT CUresult cuDeviceTotalMem_v2(std::size_t* bytes, CUdevice device) {
    if (bytes == nullptr) return cuda::kErrorInvalidValue;
    if (CUresult r = check_device(device); r != cuda::kSuccess) return r;
    *bytes = kMemoryBytes;
    return cuda::kSuccess;
}

// Primary contexts.

FAKE_CUDA_EXPORT CUresult cuDevicePrimaryCtxRetain(cuda::CUcontext* context, CUdevice device) {
    if (context == nullptr) return cuda::kErrorInvalidValue;
    if (CUresult r = check_device(device); r != cuda::kSuccess) return r;
    auto& s = state();
    std::lock_guard lock(s.mutex);
    if (s.poisoned != cuda::kSuccess) return s.poisoned;
    if (s.primary == nullptr) {
        s.contexts.push_back(std::make_unique<CUctx_st>());
        s.primary = s.contexts.back().get();
    }
    ++s.references;
    *context = s.primary;
    return cuda::kSuccess;
}

FAKE_CUDA_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice device) {
    if (CUresult r = check_device(device); r != cuda::kSuccess) return r;
    auto& s = state();
    std::lock_guard lock(s.mutex);
    if (s.references == 0) return kErrorInvalidContext;
    if (--s.references == 0 && s.primary != nullptr) destroy(s, s.primary);
    return cuda::kSuccess;
}

FAKE_CUDA_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice device) {
    if (CUresult r = check_device(device); r != cuda::kSuccess) return r;
    auto& s = state();
    std::lock_guard lock(s.mutex);
    ++s.resets;
    if (s.primary != nullptr) destroy(s, s.primary);
    // The references stand; the next retain makes a new context (an old handle stays destroyed).
    return cuda::kSuccess;
}

FAKE_CUDA_EXPORT CUresult cuCtxSetCurrent(cuda::CUcontext context) {
    auto& s = state();
    std::lock_guard lock(s.mutex);
    if (!s.initialized) return kErrorNotInitialized;
    if (context != nullptr && !context->alive) return kErrorContextIsDestroyed;
    current = context;
    return cuda::kSuccess;
}

FAKE_CUDA_EXPORT CUresult cuCtxSynchronize() {
    auto& s = state();
    Lock lock(s.mutex);
    CUctx_st* ctx = nullptr;
    if (CUresult r = current_context(s, ctx); r != cuda::kSuccess) return r;
    for (auto* st : ctx->streams)
        if (st->alive && st->failure != cuda::kSuccess) return seen(ctx, st->failure);
    for (auto* st : ctx->streams)
        if (st->alive && st->spinning) return wait_for_destruction(s, lock, ctx);
    return cuda::kSuccess;
}

// For tests that open the library in their own process.

/// Writes how many times the primary context was reset and how many modules were loaded since
/// the process started; 0.
FAKE_CUDA_EXPORT int bitship_fake_cuda_stats(unsigned long long* context_resets,
                                             unsigned long long* modules_loaded) {
    auto& s = state();
    std::lock_guard lock(s.mutex);
    if (context_resets != nullptr) *context_resets = s.resets;
    if (modules_loaded != nullptr) *modules_loaded = s.loads;
    return 0;
}
