#include "cuda_driver.hpp"

#include <fmt/format.h>

namespace bitship::agent {
Result<CudaDriver> load_cuda_driver(const std::string& library) {
    auto api = CudaApi::load(library);
    if (!api) return tl::make_unexpected(api.error());
    const CudaApi& cu = **api;

    CudaDriver out;
    if (int r = cu.cuDriverGetVersion(&out.version); r != cuda::kSuccess)
        return tl::make_unexpected(cuda::no_driver(library, "cuDriverGetVersion failed: " + cu.said(r)));
    int n = 0;
    if (int r = cu.cuDeviceGetCount(&n); r != cuda::kSuccess)
        return tl::make_unexpected(cuda::no_driver(library, "cuDeviceGetCount failed: " + cu.said(r)));
    for (int i = 0; i < n; ++i) {
        cuda::CUdevice dev = 0;
        if (int r = cu.cuDeviceGet(&dev, i); r != cuda::kSuccess)
            return tl::make_unexpected(cuda::no_driver(library, fmt::format("cuDeviceGet({}) failed: {}", i, cu.said(r))));
        CudaDevice d;
        d.ordinal = i;
        // What a device does not say stays 0 or empty: the listing is informational.
        char text[cuda::kDeviceNameLength] = {};
        if (cu.cuDeviceGetName(text, cuda::kDeviceNameLength - 1, dev) == cuda::kSuccess) d.name = text;
        cu.cuDeviceGetAttribute(&d.cc_major, cuda::kAttrComputeCapabilityMajor, dev);
        cu.cuDeviceGetAttribute(&d.cc_minor, cuda::kAttrComputeCapabilityMinor, dev);
        cu.cuDeviceGetAttribute(&d.multiprocessors, cuda::kAttrMultiprocessorCount, dev);
        std::size_t bytes = 0;
        if (cu.cuDeviceTotalMem(&bytes, dev) == cuda::kSuccess) d.memory_bytes = bytes;
        out.devices.push_back(std::move(d));
    }
    out.api = std::move(*api);
    return out;
}

std::string describe(const Result<CudaDriver>& driver) {
    if (!driver) return driver.error().message;
    std::string line = fmt::format("driver {}.{}, {} GPU{}", driver->version / 1000, driver->version % 1000 / 10,
                                   driver->devices.size(), driver->devices.size() == 1 ? "" : "s");
    for (std::size_t i = 0; i < driver->devices.size(); ++i) {
        const auto& d = driver->devices[i];
        line += fmt::format("{} {} (sm_{}{}, {} GiB)", i == 0 ? ":" : ",", d.name, d.cc_major, d.cc_minor,
                            d.memory_bytes >> 30);
    }
    return line;
}

} // namespace bitship::agent
