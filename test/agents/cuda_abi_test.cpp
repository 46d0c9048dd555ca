// agents/cuda_api.hpp spells the CUDA driver API's types, constants and function types out by hand
// (the agent builds without cuda.h). Where the toolkit's cuda.h is installed, this file checks
// every one of them against it at compile time: a wrong enumerator, a missed `_v2` or a changed
// parameter is a build error here rather than a crash on a GPU host.
#include "cuda_api.hpp"

#include <catch2/catch.hpp>
#include <string>
#include <type_traits>

using bitship::agent::CudaApi;
namespace cuda = bitship::agent::cuda;

// The table's function types, named before cuda.h is included: its `#define cuMemAlloc
// cuMemAlloc_v2` lines would rename the members in every mention after it.
namespace ours {
using Init = decltype(CudaApi::cuInit);
using DriverGetVersion = decltype(CudaApi::cuDriverGetVersion);
using GetErrorName = decltype(CudaApi::cuGetErrorName);
using GetErrorString = decltype(CudaApi::cuGetErrorString);
using DeviceGetCount = decltype(CudaApi::cuDeviceGetCount);
using DeviceGet = decltype(CudaApi::cuDeviceGet);
using DeviceGetName = decltype(CudaApi::cuDeviceGetName);
using DeviceGetPCIBusId = decltype(CudaApi::cuDeviceGetPCIBusId);
using DeviceGetAttribute = decltype(CudaApi::cuDeviceGetAttribute);
using DeviceTotalMem = decltype(CudaApi::cuDeviceTotalMem);
using DevicePrimaryCtxRetain = decltype(CudaApi::cuDevicePrimaryCtxRetain);
using DevicePrimaryCtxRelease = decltype(CudaApi::cuDevicePrimaryCtxRelease);
using DevicePrimaryCtxReset = decltype(CudaApi::cuDevicePrimaryCtxReset);
using CtxSetCurrent = decltype(CudaApi::cuCtxSetCurrent);
using CtxSynchronize = decltype(CudaApi::cuCtxSynchronize);
using StreamCreate = decltype(CudaApi::cuStreamCreate);
using StreamDestroy = decltype(CudaApi::cuStreamDestroy);
using StreamQuery = decltype(CudaApi::cuStreamQuery);
using StreamSynchronize = decltype(CudaApi::cuStreamSynchronize);
using EventCreate = decltype(CudaApi::cuEventCreate);
using EventRecord = decltype(CudaApi::cuEventRecord);
using EventSynchronize = decltype(CudaApi::cuEventSynchronize);
using EventDestroy = decltype(CudaApi::cuEventDestroy);
using ModuleLoadDataEx = decltype(CudaApi::cuModuleLoadDataEx);
using ModuleGetFunction = decltype(CudaApi::cuModuleGetFunction);
using ModuleUnload = decltype(CudaApi::cuModuleUnload);
using LaunchKernel = decltype(CudaApi::cuLaunchKernel);
using MemAlloc = decltype(CudaApi::cuMemAlloc);
using MemFree = decltype(CudaApi::cuMemFree);
using MemGetInfo = decltype(CudaApi::cuMemGetInfo);
using MemsetD8Async = decltype(CudaApi::cuMemsetD8Async);
using MemcpyHtoDAsync = decltype(CudaApi::cuMemcpyHtoDAsync);
using MemcpyDtoHAsync = decltype(CudaApi::cuMemcpyDtoHAsync);
using MemHostRegister = decltype(CudaApi::cuMemHostRegister);
using MemHostUnregister = decltype(CudaApi::cuMemHostUnregister);
/// The functions named above: CudaApi must have no more (checked by its size below).
constexpr std::size_t kFunctions = 35;
} // namespace ours

// Every member is a function pointer but `library`: a member added to CudaApi must be added to
// the list above, to the checks below and to CudaApi::load().
static_assert(sizeof(CudaApi) == ours::kFunctions * sizeof(void (*)()) + sizeof(std::string));

#if __has_include(<cuda.h>)
#include <cuda.h>
#define BITSHIP_HAVE_CUDA_H 1
#elif __has_include(</usr/local/cuda/include/cuda.h>)
#include </usr/local/cuda/include/cuda.h>
#define BITSHIP_HAVE_CUDA_H 1
#else
#define BITSHIP_HAVE_CUDA_H 0
#endif

#if BITSHIP_HAVE_CUDA_H

namespace {

// A cuda.h type as cuda_api.hpp spells it: its enums (CUresult, CUdevice_attribute,
// CUjit_option) become int, through pointers, const and function types.
template <class T> struct Spelled { using type = T; };
template <> struct Spelled<CUresult> { using type = int; };
template <> struct Spelled<CUdevice_attribute> { using type = int; };
template <> struct Spelled<CUjit_option> { using type = int; };
template <class T> struct Spelled<T*> { using type = typename Spelled<T>::type*; };
template <class T> struct Spelled<const T> { using type = const typename Spelled<T>::type; };
template <class R, class... A> struct Spelled<R(A...)> {
    using type = typename Spelled<R>::type(typename Spelled<A>::type...);
};
template <class T> using SpelledT = typename Spelled<T>::type;

// Passed as int: each enum must be an int's size.
static_assert(sizeof(CUresult) == sizeof(int) && sizeof(CUdevice_attribute) == sizeof(int) &&
              sizeof(CUjit_option) == sizeof(int));

// The handle and scalar types are cuda.h's own.
static_assert(std::is_same_v<cuda::CUdevice, CUdevice>);
static_assert(std::is_same_v<cuda::CUdeviceptr, CUdeviceptr>);
static_assert(std::is_same_v<cuda::CUcontext, CUcontext>);
static_assert(std::is_same_v<cuda::CUmodule, CUmodule>);
static_assert(std::is_same_v<cuda::CUfunction, CUfunction>);
static_assert(std::is_same_v<cuda::CUstream, CUstream>);
static_assert(std::is_same_v<cuda::CUevent, CUevent>);

// Each member against the symbol load() resolves for it: the versioned one where cuda.h
// #defines the name to it, so a member missing its `_v2` (or gaining a wrong one) fails here.
#define BITSHIP_SAME_FUNCTION(ours_type, symbol)                                                   \
    static_assert(std::is_same_v<ours_type, SpelledT<decltype(&symbol)>>,                          \
                  #symbol " differs from cuda.h")
BITSHIP_SAME_FUNCTION(ours::Init, cuInit);
BITSHIP_SAME_FUNCTION(ours::DriverGetVersion, cuDriverGetVersion);
BITSHIP_SAME_FUNCTION(ours::GetErrorName, cuGetErrorName);
BITSHIP_SAME_FUNCTION(ours::GetErrorString, cuGetErrorString);
BITSHIP_SAME_FUNCTION(ours::DeviceGetCount, cuDeviceGetCount);
BITSHIP_SAME_FUNCTION(ours::DeviceGet, cuDeviceGet);
BITSHIP_SAME_FUNCTION(ours::DeviceGetName, cuDeviceGetName);
BITSHIP_SAME_FUNCTION(ours::DeviceGetPCIBusId, cuDeviceGetPCIBusId);
BITSHIP_SAME_FUNCTION(ours::DeviceGetAttribute, cuDeviceGetAttribute);
BITSHIP_SAME_FUNCTION(ours::DeviceTotalMem, cuDeviceTotalMem_v2);
BITSHIP_SAME_FUNCTION(ours::DevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain);
BITSHIP_SAME_FUNCTION(ours::DevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease_v2);
BITSHIP_SAME_FUNCTION(ours::DevicePrimaryCtxReset, cuDevicePrimaryCtxReset_v2);
BITSHIP_SAME_FUNCTION(ours::CtxSetCurrent, cuCtxSetCurrent);
BITSHIP_SAME_FUNCTION(ours::CtxSynchronize, cuCtxSynchronize);
BITSHIP_SAME_FUNCTION(ours::StreamCreate, cuStreamCreate);
BITSHIP_SAME_FUNCTION(ours::StreamDestroy, cuStreamDestroy_v2);
BITSHIP_SAME_FUNCTION(ours::StreamQuery, cuStreamQuery);
BITSHIP_SAME_FUNCTION(ours::StreamSynchronize, cuStreamSynchronize);
BITSHIP_SAME_FUNCTION(ours::EventCreate, cuEventCreate);
BITSHIP_SAME_FUNCTION(ours::EventRecord, cuEventRecord);
BITSHIP_SAME_FUNCTION(ours::EventSynchronize, cuEventSynchronize);
BITSHIP_SAME_FUNCTION(ours::EventDestroy, cuEventDestroy_v2);
BITSHIP_SAME_FUNCTION(ours::ModuleLoadDataEx, cuModuleLoadDataEx);
BITSHIP_SAME_FUNCTION(ours::ModuleGetFunction, cuModuleGetFunction);
BITSHIP_SAME_FUNCTION(ours::ModuleUnload, cuModuleUnload);
BITSHIP_SAME_FUNCTION(ours::LaunchKernel, cuLaunchKernel);
BITSHIP_SAME_FUNCTION(ours::MemAlloc, cuMemAlloc_v2);
BITSHIP_SAME_FUNCTION(ours::MemFree, cuMemFree_v2);
BITSHIP_SAME_FUNCTION(ours::MemGetInfo, cuMemGetInfo_v2);
BITSHIP_SAME_FUNCTION(ours::MemsetD8Async, cuMemsetD8Async);
BITSHIP_SAME_FUNCTION(ours::MemcpyHtoDAsync, cuMemcpyHtoDAsync_v2);
BITSHIP_SAME_FUNCTION(ours::MemcpyDtoHAsync, cuMemcpyDtoHAsync_v2);
BITSHIP_SAME_FUNCTION(ours::MemHostRegister, cuMemHostRegister_v2);
BITSHIP_SAME_FUNCTION(ours::MemHostUnregister, cuMemHostUnregister);
#undef BITSHIP_SAME_FUNCTION

// The constants, each against the enumerator its comment names.
static_assert(cuda::kSuccess == CUDA_SUCCESS);
static_assert(cuda::kErrorInvalidValue == CUDA_ERROR_INVALID_VALUE);
static_assert(cuda::kErrorOutOfMemory == CUDA_ERROR_OUT_OF_MEMORY);
static_assert(cuda::kErrorInvalidDevice == CUDA_ERROR_INVALID_DEVICE);
static_assert(cuda::kErrorEccUncorrectable == CUDA_ERROR_ECC_UNCORRECTABLE);
static_assert(cuda::kErrorNvlinkUncorrectable == CUDA_ERROR_NVLINK_UNCORRECTABLE);
static_assert(cuda::kErrorContained == CUDA_ERROR_CONTAINED);
static_assert(cuda::kErrorNotFound == CUDA_ERROR_NOT_FOUND);
static_assert(cuda::kErrorNotReady == CUDA_ERROR_NOT_READY);
static_assert(cuda::kErrorIllegalAddress == CUDA_ERROR_ILLEGAL_ADDRESS);
static_assert(cuda::kErrorLaunchOutOfResources == CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES);
static_assert(cuda::kErrorLaunchTimeout == CUDA_ERROR_LAUNCH_TIMEOUT);
static_assert(cuda::kErrorHostMemoryAlreadyRegistered == CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
static_assert(cuda::kErrorHardwareStackError == CUDA_ERROR_HARDWARE_STACK_ERROR);
static_assert(cuda::kErrorIllegalInstruction == CUDA_ERROR_ILLEGAL_INSTRUCTION);
static_assert(cuda::kErrorMisalignedAddress == CUDA_ERROR_MISALIGNED_ADDRESS);
static_assert(cuda::kErrorInvalidAddressSpace == CUDA_ERROR_INVALID_ADDRESS_SPACE);
static_assert(cuda::kErrorInvalidPc == CUDA_ERROR_INVALID_PC);
static_assert(cuda::kErrorLaunchFailed == CUDA_ERROR_LAUNCH_FAILED);
static_assert(cuda::kErrorTensorMemoryLeak == CUDA_ERROR_TENSOR_MEMORY_LEAK);
static_assert(cuda::kErrorExternalDevice == CUDA_ERROR_EXTERNAL_DEVICE);
static_assert(cuda::kAttrMaxThreadsPerBlock == CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
static_assert(cuda::kAttrMaxBlockDimX == CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X);
static_assert(cuda::kAttrMaxBlockDimY == CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y);
static_assert(cuda::kAttrMaxBlockDimZ == CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z);
static_assert(cuda::kAttrMaxGridDimX == CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X);
static_assert(cuda::kAttrMaxGridDimY == CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y);
static_assert(cuda::kAttrMaxGridDimZ == CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z);
static_assert(cuda::kAttrMultiprocessorCount == CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
static_assert(cuda::kAttrComputeCapabilityMajor == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
static_assert(cuda::kAttrComputeCapabilityMinor == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
static_assert(cuda::kJitErrorLogBuffer == CU_JIT_ERROR_LOG_BUFFER);
static_assert(cuda::kJitErrorLogBufferSizeBytes == CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES);
static_assert(cuda::kStreamNonBlocking == CU_STREAM_NON_BLOCKING);
static_assert(cuda::kEventDisableTiming == CU_EVENT_DISABLE_TIMING);
static_assert(cuda::kMemHostRegisterPortable == CU_MEMHOSTREGISTER_PORTABLE);

} // namespace

TEST_CASE("the CUDA driver API as cuda_api.hpp spells it matches the toolkit's cuda.h", "[unit]") {
    // The checks are the static_asserts above: reaching here means they held.
    INFO("cuda.h's CUDA_VERSION " << CUDA_VERSION);
    CHECK(CUDA_VERSION >= 12000);
}

#else

TEST_CASE("the CUDA driver API as cuda_api.hpp spells it matches the toolkit's cuda.h", "[unit]") {
    WARN("not checked: no cuda.h on the include path or at /usr/local/cuda/include (CUDA toolkit "
         "not installed)");
}

#endif
