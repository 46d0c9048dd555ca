// The fake CUDA driver's memory: device memory is host memory (fake_libcuda.cpp says what the
// driver does).
#include "fake_state.hpp"

#include <cstdlib>
#include <cstring>

using namespace bitship::test::fake_cuda;

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
