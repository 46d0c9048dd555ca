#include "cuda_api.hpp"

#include <algorithm>
#include <dlfcn.h>
#include <fmt/format.h>
#include <vector>

namespace bitship::agent {
namespace {

/// Missing entry points named in the message before "and N more".
constexpr std::size_t kMissingNamed = 3;

} // namespace

Error cuda::no_driver(const std::string& library, const std::string& why) {
    return Error{Errc::no_device, fmt::format("no CUDA driver: {}: {}", library, why)};
}

Result<std::shared_ptr<const CudaApi>> CudaApi::load(const std::string& library) {
    void* handle = ::dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
        const char* said = ::dlerror();
        std::string why = said != nullptr ? said : "dlopen failed";
        if (why.starts_with(library + ": "))
            why.erase(0, library.size() + 2); // dlerror names it too
        return tl::make_unexpected(cuda::no_driver(library, why));
    }
    // Closed only on failure: once cuInit has run, the driver's threads live in the library.
    auto fail = [&](const std::string& why) {
        ::dlclose(handle);
        return tl::make_unexpected(cuda::no_driver(library, why));
    };

    auto api = std::make_shared<CudaApi>();
    api->library = library;
    std::vector<std::string> missing;
    auto bind = [&]<class Fn>(Fn& slot, const char* symbol) {
        if (void* found = ::dlsym(handle, symbol))
            slot = reinterpret_cast<Fn>(found);
        else
            missing.emplace_back(symbol);
    };
    // The exported names: cuda.h's `#define cuXxx cuXxx_v2` lines decide which are versioned.
    bind(api->cuInit, "cuInit");
    bind(api->cuDriverGetVersion, "cuDriverGetVersion");
    bind(api->cuGetErrorName, "cuGetErrorName");
    bind(api->cuGetErrorString, "cuGetErrorString");
    bind(api->cuDeviceGetCount, "cuDeviceGetCount");
    bind(api->cuDeviceGet, "cuDeviceGet");
    bind(api->cuDeviceGetName, "cuDeviceGetName");
    bind(api->cuDeviceGetPCIBusId, "cuDeviceGetPCIBusId");
    bind(api->cuDeviceGetAttribute, "cuDeviceGetAttribute");
    bind(api->cuDeviceTotalMem, "cuDeviceTotalMem_v2");
    bind(api->cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    bind(api->cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2");
    bind(api->cuDevicePrimaryCtxReset, "cuDevicePrimaryCtxReset_v2");
    bind(api->cuCtxSetCurrent, "cuCtxSetCurrent");
    bind(api->cuCtxSynchronize, "cuCtxSynchronize");
    bind(api->cuStreamCreate, "cuStreamCreate");
    bind(api->cuStreamDestroy, "cuStreamDestroy_v2");
    bind(api->cuStreamQuery, "cuStreamQuery");
    bind(api->cuStreamSynchronize, "cuStreamSynchronize");
    bind(api->cuEventCreate, "cuEventCreate");
    bind(api->cuEventRecord, "cuEventRecord");
    bind(api->cuEventSynchronize, "cuEventSynchronize");
    bind(api->cuEventDestroy, "cuEventDestroy_v2");
    bind(api->cuModuleLoadDataEx, "cuModuleLoadDataEx");
    bind(api->cuModuleGetFunction, "cuModuleGetFunction");
    bind(api->cuModuleUnload, "cuModuleUnload");
    bind(api->cuLaunchKernel, "cuLaunchKernel");
    bind(api->cuMemAlloc, "cuMemAlloc_v2");
    bind(api->cuMemFree, "cuMemFree_v2");
    bind(api->cuMemGetInfo, "cuMemGetInfo_v2");
    bind(api->cuMemsetD8Async, "cuMemsetD8Async");
    bind(api->cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2");
    bind(api->cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2");
    bind(api->cuMemHostRegister, "cuMemHostRegister_v2");
    bind(api->cuMemHostUnregister, "cuMemHostUnregister");
    if (!missing.empty()) {
        std::string names = missing.front();
        for (std::size_t i = 1; i < std::min(missing.size(), kMissingNamed); ++i)
            names += ", " + missing[i];
        if (missing.size() > kMissingNamed)
            names += fmt::format(" and {} more", missing.size() - kMissingNamed);
        return fail("it lacks the driver API: no " + names);
    }

    if (CUresult r = api->cuInit(0); r != cuda::kSuccess)
        return fail("cuInit failed: " + api->said(r));
    return std::shared_ptr<const CudaApi>(std::move(api));
}

std::string CudaApi::said(CUresult result) const {
    const char* name = nullptr;
    if (cuGetErrorName == nullptr || cuGetErrorName(result, &name) != cuda::kSuccess ||
        name == nullptr)
        return fmt::format("CUDA error {}", result);
    return fmt::format("{} ({})", name, result);
}

} // namespace bitship::agent
