// The in-process fake CUDA driver's entry points (recording_driver.hpp says what it does).
#include "recording_driver.hpp"

#include "fake_gpu.hpp"

#include <cstdio>
#include <cstring>
#include <fmt/format.h>

namespace bitship::test::fake {

using agent::CudaApi;

Driver* driver = nullptr;

std::unique_lock<std::mutex> lock() {
    return std::unique_lock(driver->mutex);
}

namespace {

thread_local CUcontext current = nullptr;

/// The checks every call in a context makes: a poisoned context answers its error, and the
/// calling thread must have made the context current.
CUresult in_context(const char* call) {
    if (driver->sticky != 0) return driver->sticky;
    if (!driver->alive || current != driver->context()) {
        driver->violations.push_back(
            fmt::format("{} without the live context current on this thread", call));
        return fake_gpu::kErrorInvalidContext;
    }
    return cuda::kSuccess;
}

CUresult init(unsigned) {
    return cuda::kSuccess;
}
CUresult driver_version(int* v) {
    *v = 13000;
    return cuda::kSuccess;
}
CUresult error_name(CUresult r, const char** name) {
    const fake_gpu::ErrorText* e = fake_gpu::error_text(r);
    if (e == nullptr) return cuda::kErrorInvalidValue;
    *name = e->name;
    return cuda::kSuccess;
}
CUresult device_count(int* n) {
    *n = 1;
    return cuda::kSuccess;
}
CUresult device_get(CUdevice* d, int ordinal) {
    if (ordinal != 0) return cuda::kErrorInvalidDevice;
    *d = 0;
    return cuda::kSuccess;
}
CUresult device_name(char* name, int length, CUdevice) {
    std::snprintf(name, static_cast<std::size_t>(length), "Fake GPU");
    return cuda::kSuccess;
}
CUresult device_bus_id(char* id, int length, CUdevice) {
    std::snprintf(id, static_cast<std::size_t>(length), "0000:3B:00.0");
    return cuda::kSuccess;
}
CUresult device_attribute(int* value, int attribute, CUdevice) {
    return fake_gpu::attribute(attribute, *value) ? cuda::kSuccess : cuda::kErrorInvalidValue;
}
CUresult total_memory(std::size_t* bytes, CUdevice) {
    *bytes = std::size_t{80} << 30;
    return cuda::kSuccess;
}
CUresult retain(CUcontext* context, CUdevice) {
    auto l = lock();
    if (driver->refuse_retain) return cuda::kErrorOutOfMemory;
    if (!driver->alive) {
        driver->alive = true;
        ++driver->generation;
    }
    ++driver->retains;
    *context = driver->context();
    return cuda::kSuccess;
}
CUresult release(CUdevice) {
    auto l = lock();
    if (driver->retains == 0) {
        driver->violations.push_back("cuDevicePrimaryCtxRelease without a retain");
        return fake_gpu::kErrorInvalidContext;
    }
    if (--driver->retains == 0) driver->destroy_everything();
    return cuda::kSuccess;
}
CUresult reset(CUdevice) {
    auto l = lock();
    ++driver->resets;
    driver->destroy_everything();
    return cuda::kSuccess;
}
CUresult set_current(CUcontext context) {
    current = context;
    return cuda::kSuccess;
}
CUresult synchronize() {
    auto l = lock();
    if (CUresult r = in_context("cuCtxSynchronize"); r != cuda::kSuccess) return r;
    return driver->run_queue(nullptr, false) ? driver->sticky : fake_gpu::kErrorUnknown;
}
CUresult stream_create(CUstream* stream, unsigned flags) {
    auto l = lock();
    if (CUresult r = in_context("cuStreamCreate"); r != cuda::kSuccess) return r;
    if (flags != cuda::kStreamNonBlocking)
        driver->violations.push_back("a stream that is not non-blocking");
    *stream = driver->make<CUstream>();
    driver->streams.insert(*stream);
    return cuda::kSuccess;
}
CUresult stream_destroy(CUstream stream) {
    auto l = lock();
    if (driver->streams.erase(stream) == 0)
        driver->violations.push_back("cuStreamDestroy of an unknown stream");
    return cuda::kSuccess;
}
bool known_stream(CUstream s, const char* call) {
    if (driver->streams.contains(s)) return true;
    driver->violations.push_back(fmt::format("{} on an unknown stream", call));
    return false;
}
CUresult stream_query(CUstream stream) {
    auto l = lock();
    if (CUresult r = in_context("cuStreamQuery"); r != cuda::kSuccess) return r;
    if (!known_stream(stream, "cuStreamQuery")) return fake_gpu::kErrorInvalidHandle;
    if (!driver->run_queue(nullptr, true)) return cuda::kErrorNotReady;
    return driver->sticky;
}
CUresult stream_synchronize(CUstream stream) {
    auto l = lock();
    if (CUresult r = in_context("cuStreamSynchronize"); r != cuda::kSuccess) return r;
    if (!known_stream(stream, "cuStreamSynchronize")) return fake_gpu::kErrorInvalidHandle;
    if (!driver->run_queue(nullptr, false)) {
        driver->violations.push_back("cuStreamSynchronize behind a kernel that never returns");
        return fake_gpu::kErrorUnknown;
    }
    return driver->sticky;
}
CUresult event_create(CUevent* event, unsigned flags) {
    auto l = lock();
    if (CUresult r = in_context("cuEventCreate"); r != cuda::kSuccess) return r;
    if (flags != cuda::kEventDisableTiming)
        driver->violations.push_back("an event that keeps timing");
    *event = driver->make<CUevent>();
    driver->events[*event] = true;
    return cuda::kSuccess;
}
CUresult event_record(CUevent event, CUstream stream) {
    auto l = lock();
    if (CUresult r = in_context("cuEventRecord"); r != cuda::kSuccess) return r;
    if (!known_stream(stream, "cuEventRecord") || !driver->events.contains(event))
        return fake_gpu::kErrorInvalidHandle;
    driver->events[event] = false;
    driver->queue.push_back(Op{[event] { driver->events[event] = true; }});
    return cuda::kSuccess;
}
CUresult event_synchronize(CUevent event) {
    auto l = lock();
    if (CUresult r = in_context("cuEventSynchronize"); r != cuda::kSuccess) return r;
    if (!driver->events.contains(event)) return fake_gpu::kErrorInvalidHandle;
    if (!driver->run_queue([event] { return driver->events[event]; }, false)) {
        driver->violations.push_back("cuEventSynchronize behind a kernel that never returns");
        return fake_gpu::kErrorUnknown;
    }
    return driver->sticky;
}
CUresult event_destroy(CUevent event) {
    auto l = lock();
    if (driver->events.erase(event) == 0)
        driver->violations.push_back("cuEventDestroy of an unknown event");
    return cuda::kSuccess;
}
// PTX is "entries" here: the name after each ".entry ". Text with "syntax error" is refused,
// with a log.
CUresult module_load(CUmodule* module, const void* image, unsigned count, int* options,
                     void** values) {
    auto l = lock();
    if (CUresult r = in_context("cuModuleLoadDataEx"); r != cuda::kSuccess) return r;
    const std::string text(static_cast<const char*>(image)); // NUL-terminated, or this reads on
    char* log = nullptr;
    std::size_t log_size = 0;
    for (unsigned i = 0; i < count; ++i) {
        if (options[i] == cuda::kJitErrorLogBuffer) log = static_cast<char*>(values[i]);
        if (options[i] == cuda::kJitErrorLogBufferSizeBytes)
            log_size = reinterpret_cast<std::uintptr_t>(values[i]);
    }
    if (log == nullptr || log_size == 0)
        driver->violations.push_back("cuModuleLoadDataEx without an error log");
    if (text.find("syntax error") != std::string::npos) {
        if (log != nullptr)
            std::snprintf(log, log_size,
                          "ptxas application ptx input, line 3; error   : syntax error\n");
        return fake_gpu::kErrorInvalidPtx;
    }
    std::set<std::string> entries;
    for (auto at = text.find(".entry "); at != std::string::npos;
         at = text.find(".entry ", at + 1)) {
        auto begin = at + 7;
        entries.insert(text.substr(begin, text.find('(', begin) - begin));
    }
    *module = driver->make<CUmodule>();
    driver->modules[*module] = std::move(entries);
    ++driver->module_loads;
    return cuda::kSuccess;
}
CUresult module_function(CUfunction* function, CUmodule module, const char* name) {
    auto l = lock();
    if (CUresult r = in_context("cuModuleGetFunction"); r != cuda::kSuccess) return r;
    auto m = driver->modules.find(module);
    if (m == driver->modules.end()) {
        driver->violations.push_back("cuModuleGetFunction on an unknown module");
        return fake_gpu::kErrorInvalidHandle;
    }
    if (!m->second.contains(name)) return cuda::kErrorNotFound;
    *function = driver->make<CUfunction>();
    driver->functions[*function] = name;
    return cuda::kSuccess;
}
CUresult module_unload(CUmodule module) {
    auto l = lock();
    if (driver->modules.erase(module) == 0)
        driver->violations.push_back("cuModuleUnload of an unknown module");
    return cuda::kSuccess;
}
// The kernels, run on the host when the stream gets to them; a bad address poisons the context.
CUresult launch(CUfunction function, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                unsigned by, unsigned bz, unsigned shared, CUstream stream, void** params,
                void** extra) {
    auto l = lock();
    if (CUresult r = in_context("cuLaunchKernel"); r != cuda::kSuccess) return r;
    if (!known_stream(stream, "cuLaunchKernel")) return fake_gpu::kErrorInvalidHandle;
    auto f = driver->functions.find(function);
    if (f == driver->functions.end() || params == nullptr || extra != nullptr || shared != 0) {
        driver->violations.push_back("cuLaunchKernel with an unknown function or bad parameters");
        return cuda::kErrorInvalidValue;
    }
    const std::string name = f->second;
    if (name == "heavy" && bx * by * bz > kHeavyMaxThreads) return cuda::kErrorLaunchOutOfResources;
    CUdeviceptr args = 0, result = 0, table = 0;
    std::memcpy(&args, params[0], 8);
    std::memcpy(&result, params[1], 8);
    std::memcpy(&table, params[2], 8);
    auto u64 = [](CUdeviceptr p) -> std::uint64_t* {
        auto* b = driver->device_bytes(p, 8);
        if (b == nullptr) driver->sticky = cuda::kErrorIllegalAddress;
        return reinterpret_cast<std::uint64_t*>(b);
    };
    Op op;
    if (name == "sum_u64") {
        op.run = [=] {
            auto *a = u64(args), *b = u64(args + 8), *out = u64(result);
            if (a && b && out) *out = *a + *b;
        };
    } else if (name == "fill_region") {
        op.run = [=] {
            auto *n = u64(args), *base = u64(args + 8), *region = u64(table);
            if (!n || !base || !region) return;
            for (std::uint64_t i = 0; i < *n; ++i)
                if (auto* at = u64(*region + 8 * i))
                    *at = *base + i;
                else
                    return;
        };
    } else if (name == "geometry") {
        op.run = [=] {
            const std::uint64_t dims[] = {gx, gy, gz, bx, by, bz};
            for (std::size_t i = 0; i < 6; ++i)
                if (auto* at = u64(result + 8 * i)) *at = dims[i];
        };
    } else if (name == "bad_address") {
        op.run = [=] { u64(8); };
    } else if (name == "spin_forever") {
        op.hangs = true;
    } else if (name == "slow") {
        op.polls_left = kSlowPolls;
        op.run = [=] {
            if (auto* out = u64(result)) *out = 7;
        };
    } else if (name == "heavy") {
        op.run = [] {};
    }
    driver->queue.push_back(std::move(op));
    return cuda::kSuccess;
}
CUresult mem_alloc(CUdeviceptr* p, std::size_t n) {
    auto l = lock();
    if (CUresult r = in_context("cuMemAlloc"); r != cuda::kSuccess) return r;
    if (n == 0 || n > kMemoryLimit) return cuda::kErrorOutOfMemory;
    Allocation a{std::make_unique<std::byte[]>(n), n};
    std::memset(a.bytes.get(), 0xAB, n); // what a new allocation holds is not zeros
    *p = reinterpret_cast<CUdeviceptr>(a.bytes.get());
    driver->memory.emplace(*p, std::move(a));
    return cuda::kSuccess;
}
CUresult mem_free(CUdeviceptr p) {
    auto l = lock();
    if (CUresult r = in_context("cuMemFree"); r != cuda::kSuccess) return r;
    if (driver->memory.erase(p) == 0) driver->violations.push_back("cuMemFree of no allocation");
    return cuda::kSuccess;
}
CUresult mem_info(std::size_t* free, std::size_t* total) {
    *free = *total = kMemoryLimit;
    return cuda::kSuccess;
}
CUresult memset_async(CUdeviceptr to, unsigned char value, std::size_t n, CUstream stream) {
    auto l = lock();
    if (CUresult r = in_context("cuMemsetD8Async"); r != cuda::kSuccess) return r;
    if (!known_stream(stream, "cuMemsetD8Async")) return fake_gpu::kErrorInvalidHandle;
    if (driver->device_bytes(to, n) == nullptr) return cuda::kErrorInvalidValue;
    driver->queue.push_back(Op{[=] { std::memset(driver->device_bytes(to, n), value, n); }});
    return cuda::kSuccess;
}
CUresult copy_to_device(CUdeviceptr to, const void* from, std::size_t n, CUstream stream) {
    auto l = lock();
    if (CUresult r = in_context("cuMemcpyHtoDAsync"); r != cuda::kSuccess) return r;
    if (!known_stream(stream, "cuMemcpyHtoDAsync")) return fake_gpu::kErrorInvalidHandle;
    if (driver->device_bytes(to, n) == nullptr) return cuda::kErrorInvalidValue;
    if (!driver->is_pinned(from, n))
        driver->violations.push_back("cuMemcpyHtoDAsync from memory that is not pinned");
    driver->host_copies.push_back(from);
    driver->queue.push_back(Op{[=] { std::memcpy(driver->device_bytes(to, n), from, n); }});
    return cuda::kSuccess;
}
CUresult copy_to_host(void* to, CUdeviceptr from, std::size_t n, CUstream stream) {
    auto l = lock();
    if (CUresult r = in_context("cuMemcpyDtoHAsync"); r != cuda::kSuccess) return r;
    if (!known_stream(stream, "cuMemcpyDtoHAsync")) return fake_gpu::kErrorInvalidHandle;
    if (driver->device_bytes(from, n) == nullptr) return cuda::kErrorInvalidValue;
    if (!driver->is_pinned(to, n))
        driver->violations.push_back("cuMemcpyDtoHAsync to memory that is not pinned");
    driver->host_copies.push_back(to);
    driver->queue.push_back(Op{[=] { std::memcpy(to, driver->device_bytes(from, n), n); }});
    return cuda::kSuccess;
}
CUresult host_register(void* p, std::size_t n, unsigned flags) {
    auto l = lock();
    if (CUresult r = in_context("cuMemHostRegister"); r != cuda::kSuccess) return r;
    if (flags != cuda::kMemHostRegisterPortable)
        driver->violations.push_back("a registration that is not portable");
    if (reinterpret_cast<std::uintptr_t>(p) %
            static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE)) !=
        0)
        driver->violations.push_back("a registration that is not page-aligned");
    if (driver->pinned.contains(p)) return cuda::kErrorHostMemoryAlreadyRegistered;
    driver->pinned[p] = n;
    return cuda::kSuccess;
}
CUresult host_unregister(void* p) {
    auto l = lock();
    if (driver->sticky != 0) return driver->sticky;
    return driver->pinned.erase(p) == 0 ? fake_gpu::kErrorHostMemoryNotRegistered : cuda::kSuccess;
}

} // namespace

std::shared_ptr<const CudaApi> api() {
    auto t = std::make_shared<CudaApi>();
    t->library = "fake";
    t->cuInit = init;
    t->cuDriverGetVersion = driver_version;
    t->cuGetErrorName = error_name;
    t->cuGetErrorString = error_name;
    t->cuDeviceGetCount = device_count;
    t->cuDeviceGet = device_get;
    t->cuDeviceGetName = device_name;
    t->cuDeviceGetPCIBusId = device_bus_id;
    t->cuDeviceGetAttribute = device_attribute;
    t->cuDeviceTotalMem = total_memory;
    t->cuDevicePrimaryCtxRetain = retain;
    t->cuDevicePrimaryCtxRelease = release;
    t->cuDevicePrimaryCtxReset = reset;
    t->cuCtxSetCurrent = set_current;
    t->cuCtxSynchronize = synchronize;
    t->cuStreamCreate = stream_create;
    t->cuStreamDestroy = stream_destroy;
    t->cuStreamQuery = stream_query;
    t->cuStreamSynchronize = stream_synchronize;
    t->cuEventCreate = event_create;
    t->cuEventRecord = event_record;
    t->cuEventSynchronize = event_synchronize;
    t->cuEventDestroy = event_destroy;
    t->cuModuleLoadDataEx = module_load;
    t->cuModuleGetFunction = module_function;
    t->cuModuleUnload = module_unload;
    t->cuLaunchKernel = launch;
    t->cuMemAlloc = mem_alloc;
    t->cuMemFree = mem_free;
    t->cuMemGetInfo = mem_info;
    t->cuMemsetD8Async = memset_async;
    t->cuMemcpyHtoDAsync = copy_to_device;
    t->cuMemcpyDtoHAsync = copy_to_host;
    t->cuMemHostRegister = host_register;
    t->cuMemHostUnregister = host_unregister;
    return t;
}

} // namespace bitship::test::fake
