#pragma once
// The CUDA driver API as a table of function pointers, found at run time: xagent is never linked
// against libcuda, so the same binary runs where there is no driver. CudaApi::load() opens the
// library with dlopen, resolves every entry point the agent uses and calls cuInit.
//
// No cuda.h here: the agent builds where the toolkit is absent. The C types are spelled out
// below; test/agents/cuda_abi_test.cpp checks each of them, each constant and each function
// type against cuda.h wherever the toolkit is installed.
//
//   auto api = CudaApi::load();                    // no_device when there is no driver
//   int count = 0;
//   if (int r = (*api)->cuDeviceGetCount(&count); r != cuda::kSuccess) log((*api)->said(r));

#include <bitship/errc.hpp>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

// The driver's opaque handles, declared with cuda.h's own struct tags (at global scope, as
// cuda.h declares them), so that a file including both sees one type, and a stream cannot be
// passed where a module goes.
struct CUctx_st;
struct CUmod_st;
struct CUfunc_st;
struct CUstream_st;
struct CUevent_st;

namespace bitship::agent {

/// The driver library's usual name.
inline constexpr const char* kCudaDriverLibrary = "libcuda.so.1";

/// The driver API's C types and the few constants the agent uses, as cuda.h (CUDA 13) defines
/// them. cuda.h's enums (CUresult, CUdevice_attribute, CUjit_option) are passed as int: each is
/// an int-sized enum, passed and returned as one.
namespace cuda {

using CUresult = int; // enum cudaError_enum
using CUdevice = int; // CUdevice_v1
// CUdeviceptr_v2 on 64-bit hosts: cuda.h's own type (std::uint64_t is unsigned long here).
using CUdeviceptr = unsigned long long;
static_assert(sizeof(CUdeviceptr) == 8);
using CUcontext = ::CUctx_st*;
using CUmodule = ::CUmod_st*;
using CUfunction = ::CUfunc_st*;
using CUstream = ::CUstream_st*;
using CUevent = ::CUevent_st*;

// CUresult values.
inline constexpr CUresult kSuccess = 0;                     // CUDA_SUCCESS
inline constexpr CUresult kErrorInvalidValue = 1;           // CUDA_ERROR_INVALID_VALUE
inline constexpr CUresult kErrorOutOfMemory = 2;            // CUDA_ERROR_OUT_OF_MEMORY
inline constexpr CUresult kErrorInvalidDevice = 101;        // CUDA_ERROR_INVALID_DEVICE
inline constexpr CUresult kErrorEccUncorrectable = 214;     // CUDA_ERROR_ECC_UNCORRECTABLE
inline constexpr CUresult kErrorNvlinkUncorrectable = 220;  // CUDA_ERROR_NVLINK_UNCORRECTABLE
inline constexpr CUresult kErrorContained = 226;            // CUDA_ERROR_CONTAINED
inline constexpr CUresult kErrorNotFound = 500;             // CUDA_ERROR_NOT_FOUND
inline constexpr CUresult kErrorNotReady = 600;             // CUDA_ERROR_NOT_READY
inline constexpr CUresult kErrorIllegalAddress = 700;       // CUDA_ERROR_ILLEGAL_ADDRESS
inline constexpr CUresult kErrorLaunchOutOfResources = 701; // CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES
inline constexpr CUresult kErrorLaunchTimeout = 702;        // CUDA_ERROR_LAUNCH_TIMEOUT
// CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED
inline constexpr CUresult kErrorHostMemoryAlreadyRegistered = 712;
inline constexpr CUresult kErrorHardwareStackError = 714;  // CUDA_ERROR_HARDWARE_STACK_ERROR
inline constexpr CUresult kErrorIllegalInstruction = 715;  // CUDA_ERROR_ILLEGAL_INSTRUCTION
inline constexpr CUresult kErrorMisalignedAddress = 716;   // CUDA_ERROR_MISALIGNED_ADDRESS
inline constexpr CUresult kErrorInvalidAddressSpace = 717; // CUDA_ERROR_INVALID_ADDRESS_SPACE
inline constexpr CUresult kErrorInvalidPc = 718;           // CUDA_ERROR_INVALID_PC
inline constexpr CUresult kErrorLaunchFailed = 719;        // CUDA_ERROR_LAUNCH_FAILED
inline constexpr CUresult kErrorTensorMemoryLeak = 721;    // CUDA_ERROR_TENSOR_MEMORY_LEAK
inline constexpr CUresult kErrorExternalDevice = 911;      // CUDA_ERROR_EXTERNAL_DEVICE

/// Whether `r` is one of the errors cuda.h documents as leaving the context "in an inconsistent
/// state" (every later call in it returns the same error): only a new context recovers.
[[nodiscard]] constexpr bool is_sticky(CUresult r) noexcept {
    switch (r) {
    case kErrorEccUncorrectable:
    case kErrorNvlinkUncorrectable:
    case kErrorContained:
    case kErrorIllegalAddress:
    case kErrorLaunchTimeout:
    case kErrorHardwareStackError:
    case kErrorIllegalInstruction:
    case kErrorMisalignedAddress:
    case kErrorInvalidAddressSpace:
    case kErrorInvalidPc:
    case kErrorLaunchFailed:
    case kErrorTensorMemoryLeak:
    case kErrorExternalDevice:
        return true;
    default:
        return false;
    }
}

// CUdevice_attribute values.
inline constexpr int kAttrMaxThreadsPerBlock = 1;   // CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK
inline constexpr int kAttrMaxBlockDimX = 2;         // CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X
inline constexpr int kAttrMaxBlockDimY = 3;         // CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y
inline constexpr int kAttrMaxBlockDimZ = 4;         // CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z
inline constexpr int kAttrMaxGridDimX = 5;          // CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X
inline constexpr int kAttrMaxGridDimY = 6;          // CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y
inline constexpr int kAttrMaxGridDimZ = 7;          // CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z
inline constexpr int kAttrMultiprocessorCount = 16; // CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
// CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR and _MINOR
inline constexpr int kAttrComputeCapabilityMajor = 75;
inline constexpr int kAttrComputeCapabilityMinor = 76;

// CUjit_option values.
inline constexpr int kJitErrorLogBuffer = 5;          // CU_JIT_ERROR_LOG_BUFFER
inline constexpr int kJitErrorLogBufferSizeBytes = 6; // CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES

// Flags.
inline constexpr unsigned kStreamNonBlocking = 0x1;        // CU_STREAM_NON_BLOCKING
inline constexpr unsigned kEventDisableTiming = 0x2;       // CU_EVENT_DISABLE_TIMING
inline constexpr unsigned kMemHostRegisterPortable = 0x01; // CU_MEMHOSTREGISTER_PORTABLE

/// Room for a device's name from cuDeviceGetName (cuda.h documents no limit; 256 with its NUL).
inline constexpr int kDeviceNameLength = 256;

/// The error for a driver that cannot be used: `library`, and why not.
Error no_driver(const std::string& library, const std::string& why);

} // namespace cuda

/// The driver entry points the agent uses. Members are named as the API documents them; where
/// cuda.h #defines a name to a versioned symbol (`#define cuMemAlloc cuMemAlloc_v2`), the member
/// holds that symbol, named in its comment. Shared (shared_ptr) by the CudaDriver listing and
/// every GpuDevice, since the library stays loaded for the process's life.
struct CudaApi {
    using CUresult = cuda::CUresult;
    using CUdevice = cuda::CUdevice;
    using CUdeviceptr = cuda::CUdeviceptr;
    using CUcontext = cuda::CUcontext;
    using CUmodule = cuda::CUmodule;
    using CUfunction = cuda::CUfunction;
    using CUstream = cuda::CUstream;
    using CUevent = cuda::CUevent;

    // Initialisation, version, errors.
    CUresult (*cuInit)(unsigned flags) = nullptr;
    CUresult (*cuDriverGetVersion)(int* version) = nullptr;
    CUresult (*cuGetErrorName)(CUresult error, const char** name) = nullptr;
    CUresult (*cuGetErrorString)(CUresult error, const char** text) = nullptr;

    // Devices.
    CUresult (*cuDeviceGetCount)(int* count) = nullptr;
    CUresult (*cuDeviceGet)(CUdevice* device, int ordinal) = nullptr;
    CUresult (*cuDeviceGetName)(char* name, int length, CUdevice device) = nullptr;
    CUresult (*cuDeviceGetPCIBusId)(char* bus_id, int length, CUdevice device) = nullptr;
    CUresult (*cuDeviceGetAttribute)(int* value, int attribute, CUdevice device) = nullptr;
    /// cuDeviceTotalMem_v2
    CUresult (*cuDeviceTotalMem)(std::size_t* bytes, CUdevice device) = nullptr;

    // Primary contexts.
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext* context, CUdevice device) = nullptr;
    /// cuDevicePrimaryCtxRelease_v2
    CUresult (*cuDevicePrimaryCtxRelease)(CUdevice device) = nullptr;
    /// cuDevicePrimaryCtxReset_v2
    CUresult (*cuDevicePrimaryCtxReset)(CUdevice device) = nullptr;
    CUresult (*cuCtxSetCurrent)(CUcontext context) = nullptr;
    CUresult (*cuCtxSynchronize)() = nullptr;

    // Streams and events.
    CUresult (*cuStreamCreate)(CUstream* stream, unsigned flags) = nullptr;
    /// cuStreamDestroy_v2
    CUresult (*cuStreamDestroy)(CUstream stream) = nullptr;
    CUresult (*cuStreamQuery)(CUstream stream) = nullptr;
    CUresult (*cuStreamSynchronize)(CUstream stream) = nullptr;
    CUresult (*cuEventCreate)(CUevent* event, unsigned flags) = nullptr;
    CUresult (*cuEventRecord)(CUevent event, CUstream stream) = nullptr;
    CUresult (*cuEventSynchronize)(CUevent event) = nullptr;
    /// cuEventDestroy_v2
    CUresult (*cuEventDestroy)(CUevent event) = nullptr;

    // Modules and launches.
    CUresult (*cuModuleLoadDataEx)(CUmodule* module, const void* image, unsigned option_count,
                                   int* options, void** option_values) = nullptr;
    CUresult (*cuModuleGetFunction)(CUfunction* function, CUmodule module,
                                    const char* name) = nullptr;
    CUresult (*cuModuleUnload)(CUmodule module) = nullptr;
    CUresult (*cuLaunchKernel)(CUfunction function, unsigned grid_x, unsigned grid_y,
                               unsigned grid_z, unsigned block_x, unsigned block_y,
                               unsigned block_z, unsigned shared_bytes, CUstream stream,
                               void** params, void** extra) = nullptr;

    // Memory.
    /// cuMemAlloc_v2
    CUresult (*cuMemAlloc)(CUdeviceptr* pointer, std::size_t bytes) = nullptr;
    /// cuMemFree_v2
    CUresult (*cuMemFree)(CUdeviceptr pointer) = nullptr;
    /// cuMemGetInfo_v2
    CUresult (*cuMemGetInfo)(std::size_t* free, std::size_t* total) = nullptr;
    CUresult (*cuMemsetD8Async)(CUdeviceptr to, unsigned char value, std::size_t count,
                                CUstream stream) = nullptr;
    /// cuMemcpyHtoDAsync_v2
    CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr to, const void* from, std::size_t bytes,
                                  CUstream stream) = nullptr;
    /// cuMemcpyDtoHAsync_v2
    CUresult (*cuMemcpyDtoHAsync)(void* to, CUdeviceptr from, std::size_t bytes,
                                  CUstream stream) = nullptr;
    /// cuMemHostRegister_v2
    CUresult (*cuMemHostRegister)(void* pointer, std::size_t bytes, unsigned flags) = nullptr;
    CUresult (*cuMemHostUnregister)(void* pointer) = nullptr;

    /// The library it was loaded from, as named to load().
    std::string library;

    /// Opens `library`, resolves every entry point above and calls cuInit(0). no_device, as
    /// "no CUDA driver: LIBRARY: WHY", when dlopen fails (dlerror's reason), a symbol is missing
    /// (naming it: "it lacks the driver API: no cuInit, ...") or cuInit fails (with the driver's
    /// error: the toolkit's stub library says CUDA_ERROR_STUB_LIBRARY). The library is never
    /// closed: the driver's own threads live in it.
    /// @code
    ///   auto api = CudaApi::load();
    ///   if (!api) return api.error();                 // no_device: "no CUDA driver: libcuda.so.1:
    ///   ..." auto gpu = GpuDevice::open(*api, 0);
    /// @endcode
    static Result<std::shared_ptr<const CudaApi>>
    load(const std::string& library = kCudaDriverLibrary);

    /// A driver result as words: "CUDA_ERROR_ILLEGAL_ADDRESS (700)", or "CUDA error 700" when the
    /// driver does not know the code.
    [[nodiscard]] std::string said(CUresult result) const;
};

} // namespace bitship::agent
