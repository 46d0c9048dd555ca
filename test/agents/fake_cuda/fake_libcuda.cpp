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

#include "cuda_api.hpp"
#include "fake_gpu.hpp"
#include "fake_ptx.hpp"

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#define FAKE_CUDA_EXPORT extern "C" __attribute__((visibility("default")))

namespace cuda = bitship::agent::cuda;
using cuda::CUdevice;
using cuda::CUdeviceptr;
using cuda::CUresult;

// The handles' definitions: cuda_api.hpp declares the tags, as cuda.h does.
struct CUctx_st;
struct CUstream_st {
    CUctx_st* context = nullptr;
    bool alive = true;
    CUresult failure = cuda::kSuccess; ///< a kernel failed on the device, not yet seen
    bool spinning = false;             ///< a kernel that never finishes holds it
};
struct CUevent_st {
    CUctx_st* context = nullptr;
    bool alive = true;
    CUresult failure = cuda::kSuccess; ///< recorded behind a failed kernel
    bool spinning = false;             ///< recorded behind a kernel that never finishes
};
struct CUfunc_st {
    struct CUmod_st* module = nullptr;
    std::string name;
    bool bitship_abi = false; ///< its PTX parameters are three `.param .u64`
};
struct CUmod_st {
    CUctx_st* context = nullptr;
    bool alive = true;
    std::string ptx;
    std::map<std::string, bool, std::less<>> entries; ///< name: whether it has the bitship ABI
    std::map<std::string, CUfunc_st*, std::less<>> functions;
};
struct CUctx_st {
    bool alive = true;
    CUresult sticky = cuda::kSuccess; ///< a device failure seen: every call returns it
    std::map<CUdeviceptr, std::size_t> allocations;
    std::map<std::uintptr_t, std::size_t> registered; ///< host ranges pinned with cuMemHostRegister
    CUstream_st* default_stream = nullptr;            ///< the legacy stream, for stream 0
    std::vector<CUstream_st*> streams;
    std::vector<CUevent_st*> events;
    std::vector<CUmod_st*> modules;
};

namespace {

namespace fake_gpu = bitship::test::fake_gpu;
namespace fake_ptx = bitship::test::fake_ptx;
using namespace fake_gpu; // the GPU's limits and the error names

// The device.
constexpr int kDriverVersion = 13000;
constexpr int kDeviceCount = 1;
constexpr const char* kName = "Fake GPU (bitship tests)";
constexpr const char* kBusId = "0000:00:00.0";
constexpr unsigned kSm = kCcMajor * 10 + kCcMinor;
constexpr std::size_t kMemoryBytes = std::size_t{1} << 30;
constexpr unsigned kMaxSharedBytes = 48u << 10;
constexpr std::size_t kAllocationAlignment = 256;
constexpr unsigned kKnownHostRegisterFlags = 0x0f; // PORTABLE, DEVICEMAP, IOMEMORY, READ_ONLY
constexpr unsigned kKnownEventFlags = 0x07;        // BLOCKING_SYNC, DISABLE_TIMING, INTERPROCESS
constexpr unsigned kKnownStreamFlags = cuda::kStreamNonBlocking;

struct State {
    std::mutex mutex;
    std::condition_variable context_destroyed;
    bool initialized = false;
    unsigned references = 0;       ///< on the primary context
    CUctx_st* primary = nullptr;   ///< the live primary context, if any
    unsigned long long resets = 0; ///< cuDevicePrimaryCtxReset calls
    CUresult poisoned = cuda::kSuccess; ///< the sticky error this process saw, for good
    unsigned long long loads = 0;  ///< modules loaded
    std::size_t allocated = 0;     ///< bytes of device memory in use
    // Every handle ever made, freed only with the process: a destroyed handle stays invalid
    // instead of aliasing a new one.
    std::vector<std::unique_ptr<CUctx_st>> contexts;
    std::vector<std::unique_ptr<CUstream_st>> streams;
    std::vector<std::unique_ptr<CUevent_st>> events;
    std::vector<std::unique_ptr<CUmod_st>> modules;
    std::vector<std::unique_ptr<CUfunc_st>> functions;
};

// Never destroyed: the agent's own threads may call in while the process exits.
State& state() {
    static State* s = new State;
    return *s;
}

thread_local CUctx_st* current = nullptr;

using Lock = std::unique_lock<std::mutex>;

void destroy(State& s, CUctx_st* ctx) {
    ctx->alive = false;
    for (auto& [pointer, size] : ctx->allocations) {
        std::free(reinterpret_cast<void*>(pointer));
        s.allocated -= size;
    }
    ctx->allocations.clear();
    ctx->registered.clear();
    for (auto* st : ctx->streams)
        st->alive = false;
    for (auto* e : ctx->events)
        e->alive = false;
    for (auto* m : ctx->modules)
        m->alive = false;
    if (s.primary == ctx) s.primary = nullptr;
    s.context_destroyed.notify_all();
}

/// The calling thread's current context, usable: the error otherwise.
CUresult current_context(const State& s, CUctx_st*& ctx) {
    if (!s.initialized) return kErrorNotInitialized;
    ctx = current;
    if (ctx == nullptr) return kErrorInvalidContext;
    if (!ctx->alive) return kErrorContextIsDestroyed;
    return ctx->sticky;
}

/// `stream` (0: the current context's legacy stream), usable: the error otherwise.
CUresult usable_stream(State& s, CUstream_st*& stream) {
    if (!s.initialized) return kErrorNotInitialized;
    if (stream == nullptr) {
        CUctx_st* ctx = nullptr;
        if (CUresult r = current_context(s, ctx); r != cuda::kSuccess) return r;
        if (ctx->default_stream == nullptr) {
            s.streams.push_back(std::make_unique<CUstream_st>());
            ctx->default_stream = s.streams.back().get();
            ctx->default_stream->context = ctx;
            ctx->streams.push_back(ctx->default_stream);
        }
        stream = ctx->default_stream;
    }
    if (!stream->alive) return kErrorInvalidHandle;
    return stream->context->sticky;
}

/// Whether `stream` is held up behind a kernel that spins or failed: work queued on it waits.
bool held_up(const CUstream_st* stream) {
    return stream->spinning || stream->failure != cuda::kSuccess;
}

/// The host bytes of device range [pointer, pointer + bytes) when it lies inside one live
/// allocation of `ctx`; null otherwise.
std::byte* device_bytes(const CUctx_st* ctx, CUdeviceptr pointer, std::size_t bytes) {
    auto it = ctx->allocations.upper_bound(pointer);
    if (it == ctx->allocations.begin()) return nullptr;
    --it;
    const std::size_t offset = pointer - it->first;
    if (offset > it->second || bytes > it->second - offset) return nullptr;
    return reinterpret_cast<std::byte*>(pointer);
}

/// A device failure seen: sticky from now on.
CUresult seen(CUctx_st* ctx, CUresult failure) {
    ctx->sticky = failure;
    state().poisoned = failure;
    return failure;
}

/// Waits until `ctx` is destroyed (a kernel that never finishes is stopped only so).
CUresult wait_for_destruction(State& s, Lock& lock, CUctx_st* ctx) {
    s.context_destroyed.wait(lock, [&] { return !ctx->alive; });
    return kErrorContextIsDestroyed;
}

// The kernels, run at once on the launch.

struct Params {
    CUdeviceptr args = 0, result = 0, regions = 0;
};

/// Runs table kernel `name`: the device failure it ends with, or success.
CUresult run(CUctx_st* ctx, const std::string& name, const Params& p, const unsigned grid[3],
             const unsigned block[3], CUstream_st* stream) {
    auto u64s = [&](CUdeviceptr at, std::uint64_t count) -> std::uint64_t* {
        if (count > SIZE_MAX / sizeof(std::uint64_t)) return nullptr;
        return reinterpret_cast<std::uint64_t*>(
            device_bytes(ctx, at, count * sizeof(std::uint64_t)));
    };
    auto region0 = [&]() -> const std::uint64_t* { return u64s(p.regions, 1); };
    if (name == "twice") {
        auto* in = u64s(p.args, 1);
        auto* out = u64s(p.result, 1);
        if (in == nullptr || out == nullptr) return cuda::kErrorIllegalAddress;
        *out = 2 * *in;
    } else if (name == "sum_u64") {
        auto* in = u64s(p.args, 1);
        auto* out = u64s(p.result, 1);
        const auto* table = region0();
        if (in == nullptr || out == nullptr || table == nullptr) return cuda::kErrorIllegalAddress;
        if (*in == 0) return cuda::kSuccess;
        const auto* data = u64s(*table, *in);
        if (data == nullptr) return cuda::kErrorIllegalAddress;
        std::uint64_t sum = 0;
        for (std::uint64_t i = 0; i < *in; ++i)
            sum += data[i];
        *out += sum;
    } else if (name == "fill_u64") {
        auto* in = u64s(p.args, 3);
        const auto* table = region0();
        if (in == nullptr || table == nullptr) return cuda::kErrorIllegalAddress;
        if (in[0] == 0) return cuda::kSuccess;
        auto* data = u64s(*table, in[0]);
        if (data == nullptr) return cuda::kErrorIllegalAddress;
        for (std::uint64_t i = 0; i < in[0]; ++i)
            data[i] = i * in[1] + in[2];
    } else if (name == "where" || name == "where_declared") {
        auto* out = u64s(p.result, 3);
        if (out == nullptr) return cuda::kErrorIllegalAddress;
        out[0] = 1;
        out[1] = grid[0];
        out[2] = block[0];
    } else if (name == "sees_data") {
        const auto* table = region0();
        auto* out = u64s(p.result, 1);
        if (table == nullptr || out == nullptr) return cuda::kErrorIllegalAddress;
        *out = *table != 0;
    } else if (name == "fault") {
        return cuda::kErrorIllegalAddress;
    } else if (name == "spin_forever") {
        stream->spinning = true;
    } else {
        return cuda::kErrorLaunchFailed;
    }
    return cuda::kSuccess;
}

} // namespace

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
    return fake_gpu::attribute(attribute, *value) ? cuda::kSuccess : cuda::kErrorInvalidValue;
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

// Streams and events.

/// A stream or event of the current context: owned by the driver's `all`, listed in the
/// context's `mine` (what a context reset forgets), handed out through `out`.
template <class T>
CUresult make_in_context(State& s, std::vector<std::unique_ptr<T>>& all, std::vector<T*> CUctx_st::*mine, T*& out) {
    std::lock_guard lock(s.mutex);
    CUctx_st* ctx = nullptr;
    if (CUresult r = current_context(s, ctx); r != cuda::kSuccess) return r;
    all.push_back(std::make_unique<T>());
    T* made = all.back().get();
    made->context = ctx;
    (ctx->*mine).push_back(made);
    out = made;
    return cuda::kSuccess;
}

FAKE_CUDA_EXPORT CUresult cuStreamCreate(cuda::CUstream* stream, unsigned flags) {
    if (stream == nullptr || (flags & ~kKnownStreamFlags) != 0) return cuda::kErrorInvalidValue;
    auto& s = state();
    return make_in_context(s, s.streams, &CUctx_st::streams, *stream);
}

FAKE_CUDA_EXPORT CUresult cuStreamDestroy_v2(cuda::CUstream stream) {
    if (stream == nullptr) return kErrorInvalidHandle;
    auto& s = state();
    std::lock_guard lock(s.mutex);
    if (CUresult r = usable_stream(s, stream); r != cuda::kSuccess) return r;
    stream->alive = false;
    return cuda::kSuccess;
}

FAKE_CUDA_EXPORT CUresult cuStreamQuery(cuda::CUstream stream) {
    auto& s = state();
    std::lock_guard lock(s.mutex);
    if (CUresult r = usable_stream(s, stream); r != cuda::kSuccess) return r;
    if (stream->failure != cuda::kSuccess) return seen(stream->context, stream->failure);
    return stream->spinning ? cuda::kErrorNotReady : cuda::kSuccess;
}

FAKE_CUDA_EXPORT CUresult cuStreamSynchronize(cuda::CUstream stream) {
    auto& s = state();
    Lock lock(s.mutex);
    if (CUresult r = usable_stream(s, stream); r != cuda::kSuccess) return r;
    if (stream->failure != cuda::kSuccess) return seen(stream->context, stream->failure);
    if (stream->spinning) return wait_for_destruction(s, lock, stream->context);
    return cuda::kSuccess;
}

FAKE_CUDA_EXPORT CUresult cuEventCreate(cuda::CUevent* event, unsigned flags) {
    if (event == nullptr || (flags & ~kKnownEventFlags) != 0) return cuda::kErrorInvalidValue;
    auto& s = state();
    return make_in_context(s, s.events, &CUctx_st::events, *event);
}

FAKE_CUDA_EXPORT CUresult cuEventRecord(cuda::CUevent event, cuda::CUstream stream) {
    if (event == nullptr) return kErrorInvalidHandle;
    auto& s = state();
    std::lock_guard lock(s.mutex);
    if (CUresult r = usable_stream(s, stream); r != cuda::kSuccess) return r;
    if (!event->alive || event->context != stream->context) return kErrorInvalidHandle;
    event->failure = stream->failure;
    event->spinning = stream->spinning;
    return cuda::kSuccess;
}

FAKE_CUDA_EXPORT CUresult cuEventSynchronize(cuda::CUevent event) {
    if (event == nullptr) return kErrorInvalidHandle;
    auto& s = state();
    Lock lock(s.mutex);
    if (!s.initialized) return kErrorNotInitialized;
    if (!event->alive) return kErrorInvalidHandle;
    if (event->context->sticky != cuda::kSuccess) return event->context->sticky;
    if (event->failure != cuda::kSuccess) return seen(event->context, event->failure);
    if (event->spinning) return wait_for_destruction(s, lock, event->context);
    return cuda::kSuccess;
}

FAKE_CUDA_EXPORT CUresult cuEventDestroy_v2(cuda::CUevent event) {
    if (event == nullptr) return kErrorInvalidHandle;
    auto& s = state();
    std::lock_guard lock(s.mutex);
    if (!s.initialized) return kErrorNotInitialized;
    if (!event->alive) return kErrorInvalidHandle;
    if (event->context->sticky != cuda::kSuccess) return event->context->sticky;
    event->alive = false;
    return cuda::kSuccess;
}

// Modules and launches.

FAKE_CUDA_EXPORT CUresult cuModuleLoadDataEx(cuda::CUmodule* module, const void* image,
                                             unsigned option_count, int* options,
                                             void** option_values) {
    if (module == nullptr || image == nullptr) return cuda::kErrorInvalidValue;
    if (option_count != 0 && (options == nullptr || option_values == nullptr))
        return cuda::kErrorInvalidValue;
    auto& s = state();
    std::lock_guard lock(s.mutex);
    CUctx_st* ctx = nullptr;
    if (CUresult r = current_context(s, ctx); r != cuda::kSuccess) return r;
    char* log = nullptr;
    std::size_t log_bytes = 0;
    int log_size_option = -1;
    for (unsigned i = 0; i < option_count; ++i) {
        if (options[i] == cuda::kJitErrorLogBuffer) log = static_cast<char*>(option_values[i]);
        if (options[i] == cuda::kJitErrorLogBufferSizeBytes) {
            log_bytes = reinterpret_cast<std::uintptr_t>(option_values[i]);
            log_size_option = static_cast<int>(i);
        }
    }
    std::string ptx = static_cast<const char*>(image);
    if (std::string why = fake_ptx::refusal(ptx, kSm); !why.empty()) {
        if (log != nullptr && log_bytes > 0) {
            const std::size_t n = std::min(why.size(), log_bytes - 1);
            std::memcpy(log, why.data(), n);
            log[n] = '\0';
            // The size option is in and out: the driver writes back what it filled.
            option_values[log_size_option] =
                reinterpret_cast<void*>(static_cast<std::uintptr_t>(n));
        }
        return kErrorInvalidPtx;
    }
    s.modules.push_back(std::make_unique<CUmod_st>());
    auto* made = s.modules.back().get();
    made->context = ctx;
    made->entries = fake_ptx::entries_of(fake_ptx::without_comments(ptx));
    made->ptx = std::move(ptx);
    ctx->modules.push_back(made);
    ++s.loads;
    *module = made;
    return cuda::kSuccess;
}

FAKE_CUDA_EXPORT CUresult cuModuleGetFunction(cuda::CUfunction* function, cuda::CUmodule module,
                                              const char* name) {
    if (function == nullptr || name == nullptr) return cuda::kErrorInvalidValue;
    if (module == nullptr) return kErrorInvalidHandle;
    auto& s = state();
    std::lock_guard lock(s.mutex);
    if (!s.initialized) return kErrorNotInitialized;
    if (!module->alive) return kErrorInvalidHandle;
    if (module->context->sticky != cuda::kSuccess) return module->context->sticky;
    if (auto f = module->functions.find(name); f != module->functions.end()) {
        *function = f->second;
        return cuda::kSuccess;
    }
    auto entry = module->entries.find(name);
    if (entry == module->entries.end()) return cuda::kErrorNotFound;
    s.functions.push_back(std::make_unique<CUfunc_st>());
    auto* made = s.functions.back().get();
    made->module = module;
    made->name = name;
    made->bitship_abi = entry->second;
    module->functions.emplace(made->name, made);
    *function = made;
    return cuda::kSuccess;
}

FAKE_CUDA_EXPORT CUresult cuModuleUnload(cuda::CUmodule module) {
    if (module == nullptr) return kErrorInvalidHandle;
    auto& s = state();
    std::lock_guard lock(s.mutex);
    if (!s.initialized) return kErrorNotInitialized;
    if (!module->alive) return kErrorInvalidHandle;
    if (module->context->sticky != cuda::kSuccess) return module->context->sticky;
    module->alive = false;
    return cuda::kSuccess;
}

FAKE_CUDA_EXPORT CUresult cuLaunchKernel(cuda::CUfunction function, unsigned grid_x,
                                         unsigned grid_y, unsigned grid_z, unsigned block_x,
                                         unsigned block_y, unsigned block_z, unsigned shared_bytes,
                                         cuda::CUstream stream, void** params, void** extra) {
    if (function == nullptr) return kErrorInvalidHandle;
    auto& s = state();
    std::lock_guard lock(s.mutex);
    if (!s.initialized) return kErrorNotInitialized;
    if (!function->module->alive) return kErrorInvalidHandle;
    if (CUresult r = usable_stream(s, stream); r != cuda::kSuccess) return r;
    CUctx_st* ctx = function->module->context;
    if (stream->context != ctx) return kErrorInvalidHandle;
    const unsigned grid[3] = {grid_x, grid_y, grid_z};
    const unsigned block[3] = {block_x, block_y, block_z};
    std::uint64_t threads = 1;
    for (int i = 0; i < 3; ++i) {
        if (grid[i] == 0 || block[i] == 0 || grid[i] > kMaxGrid[i] || block[i] > kMaxBlock[i])
            return cuda::kErrorInvalidValue;
        threads *= block[i];
    }
    if (threads > kMaxThreadsPerBlock || shared_bytes > kMaxSharedBytes)
        return cuda::kErrorInvalidValue;
    if (extra != nullptr || params == nullptr || !function->bitship_abi)
        return cuda::kErrorInvalidValue;
    Params p;
    CUdeviceptr* values[] = {&p.args, &p.result, &p.regions};
    for (std::size_t i = 0; i < fake_ptx::kBitshipParams; ++i) {
        if (params[i] == nullptr) return cuda::kErrorInvalidValue;
        std::memcpy(values[i], params[i], sizeof(CUdeviceptr));
    }
    if (held_up(stream)) return cuda::kSuccess; // queued behind a kernel that never ends
    if (CUresult failed = run(ctx, function->name, p, grid, block, stream);
        failed != cuda::kSuccess)
        stream->failure = failed; // seen by the next query or synchronisation
    return cuda::kSuccess;
}

// Memory.

FAKE_CUDA_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* pointer, std::size_t bytes) {
    if (pointer == nullptr || bytes == 0) return cuda::kErrorInvalidValue;
    auto& s = state();
    std::lock_guard lock(s.mutex);
    CUctx_st* ctx = nullptr;
    if (CUresult r = current_context(s, ctx); r != cuda::kSuccess) return r;
    if (bytes > kMemoryBytes - s.allocated) return cuda::kErrorOutOfMemory;
    const std::size_t rounded =
        (bytes + kAllocationAlignment - 1) / kAllocationAlignment * kAllocationAlignment;
    void* memory = std::aligned_alloc(kAllocationAlignment, rounded);
    if (memory == nullptr) return cuda::kErrorOutOfMemory;
    *pointer = reinterpret_cast<CUdeviceptr>(memory);
    ctx->allocations.emplace(*pointer, bytes);
    s.allocated += bytes;
    return cuda::kSuccess;
}

FAKE_CUDA_EXPORT CUresult cuMemFree_v2(CUdeviceptr pointer) {
    auto& s = state();
    std::lock_guard lock(s.mutex);
    CUctx_st* ctx = nullptr;
    if (CUresult r = current_context(s, ctx); r != cuda::kSuccess) return r;
    if (pointer == 0) return cuda::kSuccess;
    auto it = ctx->allocations.find(pointer);
    if (it == ctx->allocations.end()) return cuda::kErrorInvalidValue;
    std::free(reinterpret_cast<void*>(pointer));
    s.allocated -= it->second;
    ctx->allocations.erase(it);
    return cuda::kSuccess;
}

FAKE_CUDA_EXPORT CUresult cuMemGetInfo_v2(std::size_t* free, std::size_t* total) {
    if (free == nullptr || total == nullptr) return cuda::kErrorInvalidValue;
    auto& s = state();
    std::lock_guard lock(s.mutex);
    CUctx_st* ctx = nullptr;
    if (CUresult r = current_context(s, ctx); r != cuda::kSuccess) return r;
    *free = kMemoryBytes - s.allocated;
    *total = kMemoryBytes;
    return cuda::kSuccess;
}

FAKE_CUDA_EXPORT CUresult cuMemsetD8Async(CUdeviceptr to, unsigned char value, std::size_t count,
                                          cuda::CUstream stream) {
    auto& s = state();
    std::lock_guard lock(s.mutex);
    if (CUresult r = usable_stream(s, stream); r != cuda::kSuccess) return r;
    std::byte* bytes = device_bytes(stream->context, to, count);
    if (bytes == nullptr) return cuda::kErrorInvalidValue;
    if (!held_up(stream)) std::memset(bytes, value, count);
    return cuda::kSuccess;
}

FAKE_CUDA_EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr to, const void* from, std::size_t bytes,
                                               cuda::CUstream stream) {
    if (from == nullptr && bytes != 0) return cuda::kErrorInvalidValue;
    auto& s = state();
    std::lock_guard lock(s.mutex);
    if (CUresult r = usable_stream(s, stream); r != cuda::kSuccess) return r;
    std::byte* device = device_bytes(stream->context, to, bytes);
    if (device == nullptr) return cuda::kErrorInvalidValue;
    if (!held_up(stream)) std::memcpy(device, from, bytes);
    return cuda::kSuccess;
}

FAKE_CUDA_EXPORT CUresult cuMemcpyDtoHAsync_v2(void* to, CUdeviceptr from, std::size_t bytes,
                                               cuda::CUstream stream) {
    if (to == nullptr && bytes != 0) return cuda::kErrorInvalidValue;
    auto& s = state();
    std::lock_guard lock(s.mutex);
    if (CUresult r = usable_stream(s, stream); r != cuda::kSuccess) return r;
    const std::byte* device = device_bytes(stream->context, from, bytes);
    if (device == nullptr) return cuda::kErrorInvalidValue;
    if (!held_up(stream)) std::memcpy(to, device, bytes);
    return cuda::kSuccess;
}

FAKE_CUDA_EXPORT CUresult cuMemHostRegister_v2(void* pointer, std::size_t bytes, unsigned flags) {
    if (pointer == nullptr || bytes == 0 || (flags & ~kKnownHostRegisterFlags) != 0)
        return cuda::kErrorInvalidValue;
    auto& s = state();
    std::lock_guard lock(s.mutex);
    CUctx_st* ctx = nullptr;
    if (CUresult r = current_context(s, ctx); r != cuda::kSuccess) return r;
    const auto begin = reinterpret_cast<std::uintptr_t>(pointer);
    for (const auto& [at, size] : ctx->registered)
        if (begin < at + size && at < begin + bytes) return cuda::kErrorHostMemoryAlreadyRegistered;
    ctx->registered.emplace(begin, bytes);
    return cuda::kSuccess;
}

FAKE_CUDA_EXPORT CUresult cuMemHostUnregister(void* pointer) {
    auto& s = state();
    std::lock_guard lock(s.mutex);
    CUctx_st* ctx = nullptr;
    if (CUresult r = current_context(s, ctx); r != cuda::kSuccess) return r;
    if (ctx->registered.erase(reinterpret_cast<std::uintptr_t>(pointer)) == 0)
        return kErrorHostMemoryNotRegistered;
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
