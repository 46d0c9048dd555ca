// The fake CUDA driver's streams and events (fake_libcuda.cpp says what the driver does).
#include "fake_state.hpp"

#include <memory>
#include <vector>

using namespace bitship::test::fake_cuda;

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
    if (CUresult r = usable(s, event); r != cuda::kSuccess) return r;
    if (event->failure != cuda::kSuccess) return seen(event->context, event->failure);
    if (event->spinning) return wait_for_destruction(s, lock, event->context);
    return cuda::kSuccess;
}

FAKE_CUDA_EXPORT CUresult cuEventDestroy_v2(cuda::CUevent event) {
    if (event == nullptr) return kErrorInvalidHandle;
    auto& s = state();
    std::lock_guard lock(s.mutex);
    if (CUresult r = usable(s, event); r != cuda::kSuccess) return r;
    event->alive = false;
    return cuda::kSuccess;
}
