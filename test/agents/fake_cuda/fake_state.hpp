#pragma once
// The fake CUDA driver's state, which its entry points share (fake_libcuda.cpp says what the
// driver does; fake_streams.cpp, fake_modules.cpp and fake_memory.cpp hold the rest of them):
// the handles, the device, the one mutex that guards them all, and the fault model every call
// checks (a device failure is seen on a stream or event, then sticks to its context and
// poisons the process).

#include "cuda_api.hpp"
#include "fake_gpu.hpp"

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
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

namespace bitship::test::fake_cuda {

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
inline State& state() {
    static State* s = new State;
    return *s;
}

/// The calling thread's current context (cuCtxSetCurrent).
inline thread_local CUctx_st* current = nullptr;

using Lock = std::unique_lock<std::mutex>;

inline void destroy(State& s, CUctx_st* ctx) {
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
inline CUresult current_context(const State& s, CUctx_st*& ctx) {
    if (!s.initialized) return kErrorNotInitialized;
    ctx = current;
    if (ctx == nullptr) return kErrorInvalidContext;
    if (!ctx->alive) return kErrorContextIsDestroyed;
    return ctx->sticky;
}

/// `stream` (0: the current context's legacy stream), usable: the error otherwise.
inline CUresult usable_stream(State& s, CUstream_st*& stream) {
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

/// Module or event `handle`, usable: the error otherwise (no cuInit, destroyed, or its context
/// has seen a device failure).
template <class Handle>
CUresult usable(const State& s, const Handle* handle) {
    if (!s.initialized) return kErrorNotInitialized;
    if (!handle->alive) return kErrorInvalidHandle;
    return handle->context->sticky;
}

/// Whether `stream` is held up behind a kernel that spins or failed: work queued on it waits.
inline bool held_up(const CUstream_st* stream) {
    return stream->spinning || stream->failure != cuda::kSuccess;
}

/// The host bytes of device range [pointer, pointer + bytes) when it lies inside one live
/// allocation of `ctx`; null otherwise.
inline std::byte* device_bytes(const CUctx_st* ctx, CUdeviceptr pointer, std::size_t bytes) {
    auto it = ctx->allocations.upper_bound(pointer);
    if (it == ctx->allocations.begin()) return nullptr;
    --it;
    const std::size_t offset = pointer - it->first;
    if (offset > it->second || bytes > it->second - offset) return nullptr;
    return reinterpret_cast<std::byte*>(pointer);
}

/// A device failure seen: sticky from now on.
inline CUresult seen(CUctx_st* ctx, CUresult failure) {
    ctx->sticky = failure;
    state().poisoned = failure;
    return failure;
}

/// Waits until `ctx` is destroyed (a kernel that never finishes is stopped only so).
inline CUresult wait_for_destruction(State& s, Lock& lock, CUctx_st* ctx) {
    s.context_destroyed.wait(lock, [&] { return !ctx->alive; });
    return kErrorContextIsDestroyed;
}

} // namespace bitship::test::fake_cuda
