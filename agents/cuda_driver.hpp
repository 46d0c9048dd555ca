#pragma once
// The CUDA driver, found at run time: xagent is never linked against libcuda, so the same
// binary runs where there is no driver. load_cuda_driver() opens it (CudaApi::load: dlopen and
// cuInit) and lists the GPUs it sees with their compute capability; INFO reports the result
// ("cuda"). GpuDevice (gpu_device.hpp) runs kernels on them through the same CudaApi.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <bitship/errc.hpp>

#include "cuda_api.hpp"

namespace bitship::agent {

/// One GPU as the driver reports it.
struct CudaDevice {
    int ordinal = 0;
    std::string name;
    int cc_major = 0; ///< compute capability, e.g. 9.0 for an H100
    int cc_minor = 0;
    std::uint64_t memory_bytes = 0;
    int multiprocessors = 0; ///< streaming multiprocessors (132 on an H100 SXM)
};

struct CudaDriver {
    int version = 0; ///< cuDriverGetVersion: 13000 for CUDA 13.0
    std::vector<CudaDevice> devices;
    /// The driver's entry points, for GpuDevice::open; shared with every device opened on it.
    std::shared_ptr<const CudaApi> api;
};

/// Opens `library` (CudaApi::load: dlopen, cuInit) and lists the devices. no_device naming the
/// library and what failed when there is no driver (dlopen's reason), a symbol is missing, or
/// cuInit fails (with the driver's error name: the CUDA toolkit's stub library says
/// CUDA_ERROR_STUB_LIBRARY). The library stays loaded on success.
Result<CudaDriver> load_cuda_driver(const std::string& library = kCudaDriverLibrary);

/// One line for INFO and the start log: "driver 13.0, 1 GPU: NVIDIA H100 (sm_90, 80 GiB)", or
/// the error's message.
std::string describe(const Result<CudaDriver>& driver);

} // namespace bitship::agent
