#pragma once
// What the two fake CUDA drivers of the tests say alike: the one GPU's limits (an H100's,
// compute capability 9.0) and the driver's error names and texts. The shared-library fake
// (fake_libcuda.cpp) runs the agent's GPU path end to end; the recording one
// (recording_driver.cpp) checks GpuDevice's use of the driver in process.

#include "cuda_api.hpp"

namespace bitship::test::fake_gpu {

namespace cuda = agent::cuda;

constexpr int kCcMajor = 9;
constexpr int kCcMinor = 0;
constexpr int kMultiprocessors = 132;
constexpr unsigned kMaxThreadsPerBlock = 1024;
constexpr unsigned kMaxBlock[3] = {1024, 1024, 64};
constexpr unsigned kMaxGrid[3] = {2147483647u, 65535, 65535};

/// cuDeviceGetAttribute's answer for the attributes the agent asks for; false for any other
/// (the fakes know only what the agent asks).
constexpr bool attribute(int attribute, int& value) {
    switch (attribute) {
    case cuda::kAttrMaxThreadsPerBlock:
        value = static_cast<int>(kMaxThreadsPerBlock);
        return true;
    case cuda::kAttrMaxBlockDimX:
        value = static_cast<int>(kMaxBlock[0]);
        return true;
    case cuda::kAttrMaxBlockDimY:
        value = static_cast<int>(kMaxBlock[1]);
        return true;
    case cuda::kAttrMaxBlockDimZ:
        value = static_cast<int>(kMaxBlock[2]);
        return true;
    case cuda::kAttrMaxGridDimX:
        value = static_cast<int>(kMaxGrid[0]);
        return true;
    case cuda::kAttrMaxGridDimY:
        value = static_cast<int>(kMaxGrid[1]);
        return true;
    case cuda::kAttrMaxGridDimZ:
        value = static_cast<int>(kMaxGrid[2]);
        return true;
    case cuda::kAttrMultiprocessorCount:
        value = kMultiprocessors;
        return true;
    case cuda::kAttrComputeCapabilityMajor:
        value = kCcMajor;
        return true;
    case cuda::kAttrComputeCapabilityMinor:
        value = kCcMinor;
        return true;
    default:
        return false;
    }
}

// CUresult values the agent does not name.
constexpr cuda::CUresult kErrorNotInitialized = 3;       // CUDA_ERROR_NOT_INITIALIZED
constexpr cuda::CUresult kErrorInvalidContext = 201;     // CUDA_ERROR_INVALID_CONTEXT
constexpr cuda::CUresult kErrorInvalidPtx = 218;         // CUDA_ERROR_INVALID_PTX
constexpr cuda::CUresult kErrorInvalidHandle = 400;      // CUDA_ERROR_INVALID_HANDLE
constexpr cuda::CUresult kErrorContextIsDestroyed = 709; // CUDA_ERROR_CONTEXT_IS_DESTROYED
constexpr cuda::CUresult kErrorHostMemoryNotRegistered =
    713;                                      // CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED
constexpr cuda::CUresult kErrorUnknown = 999; // CUDA_ERROR_UNKNOWN

struct ErrorText {
    cuda::CUresult code;
    const char* name;
    const char* text;
};
constexpr ErrorText kErrors[] = {
    {cuda::kSuccess, "CUDA_SUCCESS", "no error"},
    {cuda::kErrorInvalidValue, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {cuda::kErrorOutOfMemory, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {kErrorNotInitialized, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {cuda::kErrorInvalidDevice, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {kErrorInvalidContext, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {kErrorInvalidPtx, "CUDA_ERROR_INVALID_PTX", "a PTX JIT compilation failed"},
    {kErrorInvalidHandle, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {cuda::kErrorNotFound, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {cuda::kErrorNotReady, "CUDA_ERROR_NOT_READY", "device not ready"},
    {cuda::kErrorIllegalAddress, "CUDA_ERROR_ILLEGAL_ADDRESS",
     "an illegal memory access was encountered"},
    {cuda::kErrorLaunchOutOfResources, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
     "too many resources requested for launch"},
    {kErrorContextIsDestroyed, "CUDA_ERROR_CONTEXT_IS_DESTROYED", "context is destroyed"},
    {cuda::kErrorHostMemoryAlreadyRegistered, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
     "part or all of the requested memory range is already mapped"},
    {kErrorHostMemoryNotRegistered, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
     "pointer does not correspond to a registered memory region"},
    {cuda::kErrorLaunchFailed, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
    {kErrorUnknown, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

/// The name and text of `code`, or null for a code the fakes never return.
constexpr const ErrorText* error_text(cuda::CUresult code) {
    for (const auto& e : kErrors)
        if (e.code == code) return &e;
    return nullptr;
}

} // namespace bitship::test::fake_gpu
