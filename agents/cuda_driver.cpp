#include "cuda_driver.hpp"

#include <dlfcn.h>

#include <fmt/format.h>

namespace bitship::agent {
namespace {

// The few driver entry points used, with the driver API's C types spelled out (no cuda.h:
// this file builds where the toolkit is absent).
using CUresult = int;
using CUdevice = int;
using InitFn = CUresult (*)(unsigned);
using VersionFn = CUresult (*)(int*);
using CountFn = CUresult (*)(int*);
using GetFn = CUresult (*)(CUdevice*, int);
using NameFn = CUresult (*)(char*, int, CUdevice);
using AttributeFn = CUresult (*)(int*, int, CUdevice);
using TotalMemFn = CUresult (*)(std::size_t*, CUdevice);
using ErrorNameFn = CUresult (*)(CUresult, const char**);

constexpr int kAttrComputeCapabilityMajor = 75; // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
constexpr int kAttrComputeCapabilityMinor = 76; // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR
constexpr int kNameLength = 256;

Error no_driver(const std::string& library, const std::string& why) {
    return Error{Errc::no_device, fmt::format("no CUDA driver: {}: {}", library, why)};
}

} // namespace

Result<CudaDriver> load_cuda_driver(const std::string& library) {
    void* handle = ::dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
        const char* said = ::dlerror();
        std::string why = said != nullptr ? said : "dlopen failed";
        if (why.starts_with(library + ": ")) why.erase(0, library.size() + 2); // dlerror names it too
        return tl::make_unexpected(no_driver(library, why));
    }
    auto fail = [&](const std::string& why) {
        ::dlclose(handle);
        return tl::make_unexpected(no_driver(library, why));
    };
    auto sym = [&](const char* name) { return ::dlsym(handle, name); };
    auto init = reinterpret_cast<InitFn>(sym("cuInit"));
    auto version = reinterpret_cast<VersionFn>(sym("cuDriverGetVersion"));
    auto count = reinterpret_cast<CountFn>(sym("cuDeviceGetCount"));
    auto get = reinterpret_cast<GetFn>(sym("cuDeviceGet"));
    auto name = reinterpret_cast<NameFn>(sym("cuDeviceGetName"));
    auto attribute = reinterpret_cast<AttributeFn>(sym("cuDeviceGetAttribute"));
    auto total_mem = reinterpret_cast<TotalMemFn>(sym("cuDeviceTotalMem_v2"));
    auto error_name = reinterpret_cast<ErrorNameFn>(sym("cuGetErrorName"));
    if (!init || !version || !count || !get || !name || !attribute || !total_mem)
        return fail("it lacks the driver API's entry points (cuInit, cuDeviceGet, ...)");
    auto said = [&](CUresult r) {
        const char* text = nullptr;
        if (error_name == nullptr || error_name(r, &text) != 0 || text == nullptr) return fmt::format("CUDA error {}", r);
        return fmt::format("{} ({})", text, r);
    };

    if (CUresult r = init(0); r != 0) return fail("cuInit failed: " + said(r));
    CudaDriver out;
    if (CUresult r = version(&out.version); r != 0) return fail("cuDriverGetVersion failed: " + said(r));
    int n = 0;
    if (CUresult r = count(&n); r != 0) return fail("cuDeviceGetCount failed: " + said(r));
    for (int i = 0; i < n; ++i) {
        CUdevice dev = 0;
        if (CUresult r = get(&dev, i); r != 0) return fail(fmt::format("cuDeviceGet({}) failed: {}", i, said(r)));
        CudaDevice d;
        d.ordinal = i;
        char text[kNameLength] = {};
        if (name(text, kNameLength - 1, dev) == 0) d.name = text;
        attribute(&d.cc_major, kAttrComputeCapabilityMajor, dev);
        attribute(&d.cc_minor, kAttrComputeCapabilityMinor, dev);
        std::size_t bytes = 0;
        if (total_mem(&bytes, dev) == 0) d.memory_bytes = bytes;
        out.devices.push_back(std::move(d));
    }
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
