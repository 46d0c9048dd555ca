// The agent's GPU runtime (agents/cuda_api.hpp, agents/gpu_device.hpp), three ways:
// - the driver loader where there is no working driver (always runs);
// - GpuDevice on a fake driver: a CudaApi whose entry points are the functions below, with
//   device memory in host memory and a stream that runs its work only when waited for, so
//   the device's buffering, ordering, error mapping and context recreation are proven here
//   (always runs);
// - GpuDevice on a real GPU with hand-written PTX ([needs-gpu]: skipped, exit status 77, where
//   the driver does not load).
#include "cuda_api.hpp"
#include "gpu_device.hpp"

#include <atomic>
#include <bitship/bundle.hpp>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fmt/format.h>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

using namespace bitship;
using namespace bitship::agent;
using namespace std::chrono_literals;

namespace {

// The test kernels, each with the parameters every GPU kernel gets: (args, result, regions).
// Assembled by ptxas below where the toolkit is, run on a GPU by the [needs-gpu] cases.
constexpr const char* kTestPtx = R"(.version 8.0
.target sm_90
.address_size 64

// result[0] = args[0] + args[1], by thread 0 of block 0.
.visible .entry sum_u64(.param .u64 sum_args, .param .u64 sum_result, .param .u64 sum_regions)
{
    .reg .pred %p<2>;
    .reg .b32 %r<4>;
    .reg .b64 %rd<8>;
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, %ctaid.x;
    or.b32 %r3, %r1, %r2;
    setp.ne.u32 %p1, %r3, 0;
    @%p1 bra SUM_DONE;
    ld.param.u64 %rd1, [sum_args];
    ld.param.u64 %rd2, [sum_result];
    cvta.to.global.u64 %rd3, %rd1;
    cvta.to.global.u64 %rd4, %rd2;
    ld.global.u64 %rd5, [%rd3];
    ld.global.u64 %rd6, [%rd3+8];
    add.s64 %rd7, %rd5, %rd6;
    st.global.u64 [%rd4], %rd7;
SUM_DONE:
    ret;
}

// Region 0's u64 number i = args[1] + i, for i < args[0]: one thread each.
.visible .entry fill_region(.param .u64 fill_args, .param .u64 fill_result, .param .u64 fill_regions)
{
    .reg .pred %p<2>;
    .reg .b32 %r<5>;
    .reg .b64 %rd<12>;
    ld.param.u64 %rd1, [fill_args];
    ld.param.u64 %rd2, [fill_regions];
    cvta.to.global.u64 %rd3, %rd1;
    cvta.to.global.u64 %rd4, %rd2;
    ld.global.u64 %rd5, [%rd3];
    ld.global.u64 %rd6, [%rd3+8];
    ld.global.u64 %rd7, [%rd4];
    mov.u32 %r1, %ctaid.x;
    mov.u32 %r2, %ntid.x;
    mov.u32 %r3, %tid.x;
    mad.lo.u32 %r4, %r1, %r2, %r3;
    cvt.u64.u32 %rd8, %r4;
    setp.ge.u64 %p1, %rd8, %rd5;
    @%p1 bra FILL_DONE;
    add.s64 %rd9, %rd6, %rd8;
    shl.b64 %rd10, %rd8, 3;
    add.s64 %rd11, %rd7, %rd10;
    st.global.u64 [%rd11], %rd9;
FILL_DONE:
    ret;
}

// Stores to address 8, which no allocation holds: CUDA_ERROR_ILLEGAL_ADDRESS.
.visible .entry bad_address(.param .u64 bad_args, .param .u64 bad_result, .param .u64 bad_regions)
{
    .reg .b64 %rd<3>;
    mov.u64 %rd1, 8;
    mov.u64 %rd2, 42;
    st.global.u64 [%rd1], %rd2;
    ret;
}

// Waits for a value nobody writes: never returns.
.visible .entry spin_forever(.param .u64 spin_args, .param .u64 spin_result, .param .u64 spin_regions)
{
    .reg .pred %p<2>;
    .reg .b64 %rd<4>;
    ld.param.u64 %rd1, [spin_result];
    cvta.to.global.u64 %rd2, %rd1;
SPIN:
    ld.volatile.global.u64 %rd3, [%rd2];
    setp.ne.u64 %p1, %rd3, 12345;
    @%p1 bra SPIN;
    ret;
}
)";

CodeHash hash_of(const std::string& text) {
    return hash_code(std::as_bytes(std::span(text.data(), text.size())));
}

template <class T> std::span<const std::byte> bytes_of(const std::vector<T>& v) {
    return std::as_bytes(std::span(v));
}

std::uint64_t u64_at(const Bytes& b, std::size_t i = 0) {
    std::uint64_t v = 0;
    std::memcpy(&v, b.data() + i * 8, 8);
    return v;
}

/// A pattern that differs at every offset of a few MiB (no period a chunk size divides).
std::vector<std::byte> pattern(std::size_t n, unsigned seed) {
    std::vector<std::byte> out(n);
    std::uint32_t x = seed * 2654435761u + 1;
    for (auto& b : out) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        b = static_cast<std::byte>(x);
    }
    return out;
}

bool all_zero(std::span<const std::byte> b) {
    return std::all_of(b.begin(), b.end(), [](std::byte x) { return x == std::byte{0}; });
}

} // namespace

// ---------------------------------------------------------------------------------------------
// Where there is no working driver.

TEST_CASE("the CUDA driver API loads where there is a driver and is no_device naming the reason "
          "where there is none",
          "[unit]") {
    auto api = CudaApi::load();
    if (api) { // a GPU host
        CHECK((*api)->said(cuda::kErrorIllegalAddress) == "CUDA_ERROR_ILLEGAL_ADDRESS (700)");
        int version = 0;
        CHECK((*api)->cuDriverGetVersion(&version) == cuda::kSuccess);
        CHECK(version > 0);
    } else {
        CHECK(api.error().code == Errc::no_device);
        CHECK_THAT(api.error().message, Catch::StartsWith("no CUDA driver: libcuda.so.1: "));
    }

    // The toolkit's stub exports every entry point and refuses cuInit: reaching cuInit proves
    // each symbol load() resolves (the `_v2` names included) is one the driver exports.
    const std::string stub = "/usr/local/cuda/lib64/stubs/libcuda.so";
    auto stubbed = CudaApi::load(stub);
    REQUIRE_FALSE(stubbed);
    CHECK(stubbed.error().code == Errc::no_device);
    CHECK_THAT(stubbed.error().message, Catch::StartsWith("no CUDA driver: " + stub + ": "));
    if (std::filesystem::exists(stub)) {
        CHECK_THAT(stubbed.error().message, Catch::Contains("cuInit failed: "));
        CHECK_THAT(stubbed.error().message, !Catch::Contains("lacks"));
    }

    auto libm = CudaApi::load("libm.so.6"); // loads, but has no driver API
    REQUIRE_FALSE(libm);
    CHECK(libm.error().code == Errc::no_device);
    CHECK_THAT(
        libm.error().message,
        Catch::StartsWith("no CUDA driver: libm.so.6: it lacks the driver API: no cuInit, "));
    CHECK_THAT(libm.error().message, Catch::EndsWith(" more"));

    auto none = CudaApi::load("libbitship-no-such-driver.so");
    REQUIRE_FALSE(none);
    CHECK(none.error().code == Errc::no_device);
    CHECK_THAT(none.error().message,
               Catch::StartsWith("no CUDA driver: libbitship-no-such-driver.so: "));

    auto device = GpuDevice::open(nullptr, 0);
    REQUIRE_FALSE(device);
    CHECK(device.error().code == Errc::no_device);
}

TEST_CASE("the GPU test kernels are valid PTX for sm_90", "[unit]") {
    const std::filesystem::path ptxas = "/usr/local/cuda/bin/ptxas";
    if (!std::filesystem::exists(ptxas)) {
        WARN("not checked: no " << ptxas << " (CUDA toolkit not installed)");
        return;
    }
    const auto dir =
        std::filesystem::temp_directory_path() / fmt::format("bitship-ptx-{}", ::getpid());
    std::filesystem::create_directories(dir);
    std::ofstream(dir / "kernels.ptx") << kTestPtx;
    const auto command = fmt::format("{} -arch=sm_90 {} -o {} 2>&1", ptxas.string(),
                                     (dir / "kernels.ptx").string(), (dir / "k.cubin").string());
    std::string said;
    FILE* p = ::popen(command.c_str(), "r");
    REQUIRE(p != nullptr);
    char buffer[4096];
    while (auto n = std::fread(buffer, 1, sizeof buffer, p))
        said.append(buffer, n);
    const int status = ::pclose(p);
    std::filesystem::remove_all(dir);
    INFO(said);
    CHECK(status == 0);
}

// ---------------------------------------------------------------------------------------------
// A fake driver. Device memory is host memory; work put on a stream runs only when the stream
// or an event is waited for (as a real DMA engine runs behind the host), and reads host memory
// when it runs, not when it is queued: a device that reuses a staging buffer too early copies
// the wrong bytes here too. What the device does against the driver's rules is listed in
// `violations`.

namespace fake {

using cuda::CUcontext;
using cuda::CUdevice;
using cuda::CUdeviceptr;
using cuda::CUevent;
using cuda::CUfunction;
using cuda::CUmodule;
using cuda::CUresult;
using cuda::CUstream;

constexpr CUresult kInvalidContext = 201; // CUDA_ERROR_INVALID_CONTEXT
constexpr CUresult kInvalidHandle = 400;  // CUDA_ERROR_INVALID_HANDLE
constexpr CUresult kInvalidPtx = 218;     // CUDA_ERROR_INVALID_PTX
constexpr CUresult kNotRegistered = 713;  // CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED
constexpr CUresult kUnknown = 999;        // CUDA_ERROR_UNKNOWN
constexpr std::size_t kMemoryLimit = std::size_t{1} << 30;
constexpr int kMaxThreads = 1024;
constexpr int kHeavyMaxThreads = 256; ///< "heavy" has registers for this many threads a block
constexpr int kSlowPolls = 50;        ///< cuStreamQuery calls "slow" takes

struct Op {
    std::function<void()> run;
    int polls_left = 0;
    bool hangs = false;
};

struct Allocation {
    std::unique_ptr<std::byte[]> bytes;
    std::size_t size = 0;
};

struct Driver {
    std::mutex mutex;
    bool alive = false; ///< the primary context exists
    int retains = 0;
    unsigned generation = 0; ///< which context: each reset makes a new one
    int resets = 0;
    int sticky = 0; ///< the error that poisoned the context, or 0
    bool refuse_retain = false;
    std::map<CUdeviceptr, Allocation> memory;
    std::map<const void*, std::size_t> pinned;
    std::set<CUstream> streams;
    std::map<CUevent, bool> events; ///< event → its last record has run
    std::map<CUmodule, std::set<std::string>> modules;
    std::map<CUfunction, std::string> functions;
    std::deque<Op> queue;
    int module_loads = 0;
    std::uintptr_t next_handle = 0x1000;
    std::vector<std::string> violations;

    CUcontext context() const {
        return reinterpret_cast<CUcontext>(std::uintptr_t{0x100000} + generation * 0x10);
    }
    template <class Handle> Handle make() { return reinterpret_cast<Handle>(next_handle += 0x10); }

    void destroy_everything() {
        queue.clear();
        memory.clear();
        pinned.clear();
        streams.clear();
        events.clear();
        modules.clear();
        functions.clear();
        sticky = 0;
        alive = false;
    }
    /// The bytes at [p, p + n) of one allocation, or null (a fault).
    std::byte* device_bytes(CUdeviceptr p, std::size_t n) {
        auto it = memory.upper_bound(p);
        if (it == memory.begin()) return nullptr;
        --it;
        if (p - it->first > it->second.size || n > it->second.size - (p - it->first))
            return nullptr;
        return it->second.bytes.get() + (p - it->first);
    }
    bool is_pinned(const void* p, std::size_t n) const {
        auto it = pinned.upper_bound(p);
        if (it == pinned.begin()) return false;
        --it;
        auto base = static_cast<const std::byte*>(it->first);
        auto at = static_cast<const std::byte*>(p);
        return at >= base && at + n <= base + it->second;
    }
    /// Runs queued work until `until` says stop, the queue is empty, or it reaches work that is
    /// not done. False when it stopped at unfinished work.
    bool run_queue(const std::function<bool()>& until, bool poll) {
        while (!queue.empty() && !(until && until())) {
            Op& op = queue.front();
            if (op.hangs) return false;
            if (op.polls_left > 0) {
                if (poll)
                    --op.polls_left;
                else
                    op.polls_left = 0; // a blocking wait: the kernel finishes meanwhile
                if (op.polls_left > 0) return false;
            }
            auto run = std::move(op.run);
            queue.pop_front();
            if (run) run();
            if (sticky != 0) queue.clear(); // the rest of the stream's work fails with it
        }
        return true;
    }
};

Driver* driver = nullptr; // the fake the entry points below act on; one test at a time
thread_local CUcontext current = nullptr;

std::unique_lock<std::mutex> lock() {
    return std::unique_lock(driver->mutex);
}

/// The checks every call in a context makes: a poisoned context answers its error, and the
/// calling thread must have made the context current.
CUresult in_context(const char* call) {
    if (driver->sticky != 0) return driver->sticky;
    if (!driver->alive || current != driver->context()) {
        driver->violations.push_back(
            fmt::format("{} without the live context current on this thread", call));
        return kInvalidContext;
    }
    return cuda::kSuccess;
}

const std::map<CUresult, const char*> kNames = {
    {cuda::kSuccess, "CUDA_SUCCESS"},
    {cuda::kErrorInvalidValue, "CUDA_ERROR_INVALID_VALUE"},
    {cuda::kErrorOutOfMemory, "CUDA_ERROR_OUT_OF_MEMORY"},
    {cuda::kErrorInvalidDevice, "CUDA_ERROR_INVALID_DEVICE"},
    {kInvalidContext, "CUDA_ERROR_INVALID_CONTEXT"},
    {kInvalidPtx, "CUDA_ERROR_INVALID_PTX"},
    {kInvalidHandle, "CUDA_ERROR_INVALID_HANDLE"},
    {cuda::kErrorNotFound, "CUDA_ERROR_NOT_FOUND"},
    {cuda::kErrorNotReady, "CUDA_ERROR_NOT_READY"},
    {cuda::kErrorIllegalAddress, "CUDA_ERROR_ILLEGAL_ADDRESS"},
    {cuda::kErrorLaunchOutOfResources, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"},
    {cuda::kErrorHostMemoryAlreadyRegistered, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED"},
    {kNotRegistered, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED"},
    {kUnknown, "CUDA_ERROR_UNKNOWN"},
};

CUresult init(unsigned) {
    return cuda::kSuccess;
}
CUresult driver_version(int* v) {
    *v = 13000;
    return cuda::kSuccess;
}
CUresult error_name(CUresult r, const char** name) {
    auto it = kNames.find(r);
    if (it == kNames.end()) return cuda::kErrorInvalidValue;
    *name = it->second;
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
    switch (attribute) {
    case cuda::kAttrMaxThreadsPerBlock:
        *value = kMaxThreads;
        break;
    case cuda::kAttrMaxBlockDimX:
        *value = 1024;
        break;
    case cuda::kAttrMaxBlockDimY:
        *value = 1024;
        break;
    case cuda::kAttrMaxBlockDimZ:
        *value = 64;
        break;
    case cuda::kAttrMaxGridDimX:
        *value = 2147483647;
        break;
    case cuda::kAttrMaxGridDimY:
        *value = 65535;
        break;
    case cuda::kAttrMaxGridDimZ:
        *value = 65535;
        break;
    case cuda::kAttrMultiprocessorCount:
        *value = 132;
        break;
    case cuda::kAttrComputeCapabilityMajor:
        *value = 9;
        break;
    case cuda::kAttrComputeCapabilityMinor:
        *value = 0;
        break;
    default:
        return cuda::kErrorInvalidValue;
    }
    return cuda::kSuccess;
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
        return kInvalidContext;
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
    return driver->run_queue(nullptr, false) ? driver->sticky : kUnknown;
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
    if (!known_stream(stream, "cuStreamQuery")) return kInvalidHandle;
    if (!driver->run_queue(nullptr, true)) return cuda::kErrorNotReady;
    return driver->sticky;
}
CUresult stream_synchronize(CUstream stream) {
    auto l = lock();
    if (CUresult r = in_context("cuStreamSynchronize"); r != cuda::kSuccess) return r;
    if (!known_stream(stream, "cuStreamSynchronize")) return kInvalidHandle;
    if (!driver->run_queue(nullptr, false)) {
        driver->violations.push_back("cuStreamSynchronize behind a kernel that never returns");
        return kUnknown;
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
        return kInvalidHandle;
    driver->events[event] = false;
    driver->queue.push_back(Op{[event] { driver->events[event] = true; }});
    return cuda::kSuccess;
}
CUresult event_synchronize(CUevent event) {
    auto l = lock();
    if (CUresult r = in_context("cuEventSynchronize"); r != cuda::kSuccess) return r;
    if (!driver->events.contains(event)) return kInvalidHandle;
    if (!driver->run_queue([event] { return driver->events[event]; }, false)) {
        driver->violations.push_back("cuEventSynchronize behind a kernel that never returns");
        return kUnknown;
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
        return kInvalidPtx;
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
        return kInvalidHandle;
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
    if (!known_stream(stream, "cuLaunchKernel")) return kInvalidHandle;
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
    if (!known_stream(stream, "cuMemsetD8Async")) return kInvalidHandle;
    if (driver->device_bytes(to, n) == nullptr) return cuda::kErrorInvalidValue;
    driver->queue.push_back(Op{[=] { std::memset(driver->device_bytes(to, n), value, n); }});
    return cuda::kSuccess;
}
CUresult copy_to_device(CUdeviceptr to, const void* from, std::size_t n, CUstream stream) {
    auto l = lock();
    if (CUresult r = in_context("cuMemcpyHtoDAsync"); r != cuda::kSuccess) return r;
    if (!known_stream(stream, "cuMemcpyHtoDAsync")) return kInvalidHandle;
    if (driver->device_bytes(to, n) == nullptr) return cuda::kErrorInvalidValue;
    if (!driver->is_pinned(from, n))
        driver->violations.push_back("cuMemcpyHtoDAsync from memory that is not pinned");
    driver->queue.push_back(Op{[=] { std::memcpy(driver->device_bytes(to, n), from, n); }});
    return cuda::kSuccess;
}
CUresult copy_to_host(void* to, CUdeviceptr from, std::size_t n, CUstream stream) {
    auto l = lock();
    if (CUresult r = in_context("cuMemcpyDtoHAsync"); r != cuda::kSuccess) return r;
    if (!known_stream(stream, "cuMemcpyDtoHAsync")) return kInvalidHandle;
    if (driver->device_bytes(from, n) == nullptr) return cuda::kErrorInvalidValue;
    if (!driver->is_pinned(to, n))
        driver->violations.push_back("cuMemcpyDtoHAsync to memory that is not pinned");
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
    return driver->pinned.erase(p) == 0 ? kNotRegistered : cuda::kSuccess;
}

/// The fake driver's table.
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

/// A fresh fake driver for one test, and its checks when the test is done with it.
struct Scope {
    Driver state;
    std::shared_ptr<const CudaApi> table = api();
    Scope() { driver = &state; }
    ~Scope() { driver = nullptr; }
    /// Nothing is left of a device that was closed: no context reference, memory, pin, stream,
    /// event or module.
    void check_all_released() {
        auto l = lock();
        CHECK(state.retains == 0);
        CHECK(state.memory.empty());
        CHECK(state.pinned.empty());
        CHECK(state.streams.empty());
        CHECK(state.events.empty());
        CHECK(state.modules.empty());
    }
    std::vector<std::string> violations() {
        auto l = lock();
        return state.violations;
    }
};

constexpr const char* kFakePtx = R"(// fake
.visible .entry sum_u64(...)
.visible .entry fill_region(...)
.visible .entry geometry(...)
.visible .entry bad_address(...)
.visible .entry spin_forever(...)
.visible .entry slow(...)
.visible .entry heavy(...)
)";

} // namespace fake

namespace {

std::unique_ptr<GpuDevice> open_fake(fake::Scope& fake) {
    auto gpu = GpuDevice::open(fake.table, 0);
    INFO((gpu ? std::string() : gpu.error().describe()));
    REQUIRE(gpu);
    return std::move(*gpu);
}

std::vector<std::uint64_t> sum_args(std::uint64_t a, std::uint64_t b) {
    return {a, b};
}

} // namespace

TEST_CASE("a GPU device opens with the driver's limits and leaves nothing behind when closed",
          "[unit]") {
    fake::Scope fake;
    CHECK(fake.table->said(cuda::kErrorIllegalAddress) == "CUDA_ERROR_ILLEGAL_ADDRESS (700)");
    CHECK(fake.table->said(12345) == "CUDA error 12345");
    {
        auto gpu = open_fake(fake);
        CHECK(gpu->ordinal() == 0);
        CHECK(gpu->name() == "Fake GPU");
        CHECK(gpu->sm() == 90);
        CHECK(gpu->multiprocessors() == 132);
        CHECK(gpu->memory_bytes() == std::uint64_t{80} << 30);
        const auto g = gpu->default_geometry();
        CHECK(g.grid[0] == 8 * 132);
        CHECK(g.block[0] == 256);
        CHECK((g.grid[1] == 1 && g.grid[2] == 1 && g.block[1] == 1 && g.block[2] == 1));
        REQUIRE(gpu->add_region("data", 4096));
        REQUIRE(gpu->load_module(hash_of(fake::kFakePtx), fake::kFakePtx));
        REQUIRE(
            gpu->launch(hash_of(fake::kFakePtx), "sum_u64", bytes_of(sum_args(1, 2)), 8, g, 1s));
        auto l = fake::lock();
        CHECK(fake.state.retains == 1);
        CHECK(fake.state.pinned.size() == 2); // the two staging buffers
    }
    fake.check_all_released();
    CHECK(fake.violations().empty());

    auto missing = GpuDevice::open(fake.table, 1);
    REQUIRE_FALSE(missing);
    CHECK(missing.error().code == Errc::no_device);
    CHECK_THAT(missing.error().message,
               Catch::Contains("GPU 1") && Catch::Contains("CUDA_ERROR_INVALID_DEVICE (101)"));

    fake.state.refuse_retain = true;
    auto refused = GpuDevice::open(fake.table, 0);
    REQUIRE_FALSE(refused);
    CHECK(refused.error().code == Errc::no_device);
    CHECK_THAT(refused.error().message,
               Catch::Contains("cuDevicePrimaryCtxRetain failed: CUDA_ERROR_OUT_OF_MEMORY"));
}

TEST_CASE(
    "GPU regions start zeroed, and reads and writes of any size cross the staging buffers intact",
    "[unit]") {
    fake::Scope fake;
    {
        auto gpu = open_fake(fake);
        const std::uint64_t size =
            (std::uint64_t{20} << 20) + 4096 + 123; // two and a half staging buffers
        REQUIRE(gpu->add_region("data", size));
        REQUIRE(gpu->add_region("small", 64));
        CHECK(gpu->region("small")->index == 1);
        CHECK(gpu->region("data")->size == size);
        CHECK_FALSE(gpu->region("other"));
        REQUIRE(gpu->regions().size() == 2);
        CHECK(gpu->regions()[0].name == "data");

        std::vector<std::byte> all(size, std::byte{0xFF});
        REQUIRE(gpu->read("data", 0, all));
        CHECK(all_zero(all));

        // Writes and reads of many sizes, each at an odd offset: one byte, under a staging buffer,
        // exactly one, and several with a remainder.
        for (std::size_t n : {std::size_t{1}, std::size_t{1000}, std::size_t{8} << 20,
                              (std::size_t{17} << 20) + 5}) {
            INFO("bytes " << n);
            const std::uint64_t offset = 4097;
            const auto data = pattern(n, static_cast<unsigned>(n));
            REQUIRE(gpu->write("data", offset, data));
            std::vector<std::byte> back(n);
            REQUIRE(gpu->read("data", offset, back));
            CHECK((back == data)); // a bool: Catch would print every byte
        }
        REQUIRE(gpu->read("data", 0, all));
        CHECK(all_zero(std::span(all).first(4097)));

        std::vector<std::byte> two(2);
        auto past = gpu->read("data", size - 1, two);
        REQUIRE_FALSE(past);
        CHECK(past.error().code == Errc::invalid_argument);
        CHECK_THAT(past.error().message, Catch::Contains("outside region 'data'"));
        auto wrapped = gpu->write("data", ~std::uint64_t{0}, two); // offset + size overflows
        REQUIRE_FALSE(wrapped);
        CHECK(wrapped.error().code == Errc::invalid_argument);
        CHECK(gpu->read("data", size, std::span<std::byte>()).has_value()); // nothing, at the end
        auto unknown = gpu->read("nope", 0, two);
        REQUIRE_FALSE(unknown);
        CHECK(unknown.error().code == Errc::invalid_argument);

        auto duplicate = gpu->add_region("data", 16);
        REQUIRE_FALSE(duplicate);
        CHECK(duplicate.error().code == Errc::invalid_argument);
        auto empty = gpu->add_region("empty", 0);
        REQUIRE_FALSE(empty);
        CHECK(empty.error().code == Errc::invalid_argument);
        auto huge = gpu->add_region("huge", std::uint64_t{1} << 40);
        REQUIRE_FALSE(huge);
        CHECK(huge.error().code == Errc::no_device);
        CHECK_THAT(huge.error().message, Catch::Contains("CUDA_ERROR_OUT_OF_MEMORY (2)"));
        CHECK_FALSE(gpu->region("huge"));
    }
    fake.check_all_released();
    CHECK(fake.violations().empty());
}

TEST_CASE("a GPU kernel gets its arguments, a zeroed result, the regions table and its geometry",
          "[unit]") {
    fake::Scope fake;
    {
        auto gpu = open_fake(fake);
        const auto hash = hash_of(fake::kFakePtx);
        CHECK_FALSE(gpu->has_module(hash));
        REQUIRE(gpu->load_module(hash, fake::kFakePtx));
        REQUIRE(gpu->load_module(hash, fake::kFakePtx)); // loaded already: nothing to do
        CHECK(gpu->has_module(hash));
        CHECK(gpu->modules_loaded() == 1);
        CHECK(fake.state.module_loads == 1);
        const auto one = GpuGeometry{};

        auto sum = gpu->launch(hash, "sum_u64", bytes_of(sum_args(40, 2)), 8, one, 1s);
        REQUIRE(sum);
        REQUIRE(sum->size() == 8);
        CHECK(u64_at(*sum) == 42);

        // A region added after launches is in the next launch's table.
        REQUIRE(gpu->add_region("data", 8000));
        std::vector<std::uint64_t> fill = {1000, 7};
        auto filled = gpu->launch(hash, "fill_region", bytes_of(fill), 0,
                                  GpuGeometry{{4, 1, 1}, {256, 1, 1}}, 1s);
        REQUIRE(filled);
        CHECK(filled->empty());
        std::vector<std::uint64_t> values(1000);
        REQUIRE(gpu->read("data", 0, std::as_writable_bytes(std::span(values))));
        CHECK(values[0] == 7);
        CHECK(values[999] == 1006);

        GpuGeometry g{{3, 5, 7}, {32, 4, 2}};
        auto geometry = gpu->launch(hash, "geometry", {}, 48, g, 1s);
        REQUIRE(geometry);
        CHECK(u64_at(*geometry, 0) == 3);
        CHECK(u64_at(*geometry, 2) == 7);
        CHECK(u64_at(*geometry, 3) == 32);
        CHECK(u64_at(*geometry, 5) == 2);

        // A result over a staging buffer comes back whole, and zeroed where the kernel wrote
        // nothing (new device memory is not zeros in the fake).
        auto big = gpu->launch(hash, "sum_u64", bytes_of(sum_args(1, 1)), 9u << 20, one, 1s);
        REQUIRE(big);
        REQUIRE(big->size() == 9u << 20);
        CHECK(u64_at(*big) == 2);
        CHECK(all_zero(std::span(*big).subspan(8)));

        // A kernel the stream needs many polls for is waited for.
        auto slow = gpu->launch(hash, "slow", {}, 8, one, 10s);
        REQUIRE(slow);
        CHECK(u64_at(*slow) == 7);
        CHECK(gpu->launches() == 5);
        CHECK(gpu->context_resets() == 0);
    }
    fake.check_all_released();
    CHECK(fake.violations().empty());
}

TEST_CASE("a GPU launch names what is wrong: an unknown kernel or module, a geometry over the "
          "limits, bad PTX",
          "[unit]") {
    fake::Scope fake;
    auto gpu = open_fake(fake);
    const auto hash = hash_of(fake::kFakePtx);
    REQUIRE(gpu->load_module(hash, fake::kFakePtx));
    const auto args = sum_args(1, 2);

    auto unknown = gpu->launch(hash, "nope", bytes_of(args), 8, GpuGeometry{}, 1s);
    REQUIRE_FALSE(unknown);
    CHECK(unknown.error().code == Errc::entry_not_found);
    CHECK_THAT(unknown.error().message, Catch::Contains("has no kernel 'nope'"));

    auto not_loaded =
        gpu->launch(hash_of("other"), "sum_u64", bytes_of(args), 8, GpuGeometry{}, 1s);
    REQUIRE_FALSE(not_loaded);
    CHECK(not_loaded.error().code == Errc::entry_not_found);
    CHECK_THAT(not_loaded.error().message, Catch::Contains("is not loaded"));

    for (const auto& g :
         {GpuGeometry{{0, 1, 1}, {1, 1, 1}}, GpuGeometry{{1, 1, 1}, {1, 0, 1}},
          GpuGeometry{{1, 1, 1}, {2048, 1, 1}}, GpuGeometry{{1, 1, 1}, {32, 32, 2}},
          GpuGeometry{{1, 65536, 1}, {1, 1, 1}}, GpuGeometry{{1, 1, 1}, {1, 1, 65}}}) {
        auto refused = gpu->launch(hash, "sum_u64", bytes_of(args), 8, g, 1s);
        INFO(g.grid[0] << "x" << g.grid[1] << "x" << g.grid[2] << " by " << g.block[0] << "x"
                       << g.block[1] << "x" << g.block[2]);
        REQUIRE_FALSE(refused);
        CHECK(refused.error().code == Errc::invalid_argument);
    }

    auto heavy = gpu->launch(hash, "heavy", {}, 0, GpuGeometry{{1, 1, 1}, {512, 1, 1}}, 1s);
    REQUIRE_FALSE(heavy);
    CHECK(heavy.error().code == Errc::invalid_argument);
    CHECK_THAT(heavy.error().message, Catch::Contains("CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES (701)"));
    CHECK(gpu->launch(hash, "heavy", {}, 0, GpuGeometry{{1, 1, 1}, {256, 1, 1}}, 1s).has_value());

    const std::string bad = "// a syntax error\n.visible .entry broken(...)\n";
    auto refused = gpu->load_module(hash_of(bad), bad);
    REQUIRE_FALSE(refused);
    CHECK(refused.error().code == Errc::compile_failed);
    CHECK_THAT(refused.error().message, Catch::Contains("CUDA_ERROR_INVALID_PTX (218)") &&
                                            Catch::Contains("line 3; error   : syntax error"));
    CHECK_FALSE(gpu->has_module(hash_of(bad)));
    CHECK(gpu->modules_loaded() == 1);
    CHECK(gpu->context_resets() == 0);
    CHECK(fake.violations().empty());
}

TEST_CASE("a faulting GPU kernel is kernel_crashed, and the device recreates its context and works "
          "after it",
          "[unit]") {
    fake::Scope fake;
    {
        auto gpu = open_fake(fake);
        const auto hash = hash_of(fake::kFakePtx);
        REQUIRE(gpu->load_module(hash, fake::kFakePtx));
        REQUIRE(gpu->add_region("data", 8000));
        const auto data = pattern(8000, 3);
        REQUIRE(gpu->write("data", 0, data));

        auto crashed = gpu->launch(hash, "bad_address", {}, 8, GpuGeometry{}, 1s);
        REQUIRE_FALSE(crashed);
        CHECK(crashed.error().code == Errc::kernel_crashed);
        CHECK_THAT(
            crashed.error().message,
            Catch::Contains("kernel 'bad_address'") &&
                Catch::Contains("CUDA_ERROR_ILLEGAL_ADDRESS (700)") &&
                Catch::Contains("the context was recreated") &&
                Catch::Contains("GPU regions were allocated again (their contents are lost)"));
        CHECK(gpu->context_resets() == 1);
        CHECK(fake.state.resets == 1);

        // The region is there again, zeroed; the module reloads from its PTX when next used; the
        // regions table names the new allocation.
        std::vector<std::byte> back(8000);
        REQUIRE(gpu->read("data", 0, back));
        CHECK(all_zero(back));
        CHECK(gpu->has_module(hash));
        auto sum = gpu->launch(hash, "sum_u64", bytes_of(sum_args(40, 2)), 8, GpuGeometry{}, 1s);
        REQUIRE(sum);
        CHECK(u64_at(*sum) == 42);
        CHECK(fake.state.module_loads == 2);
        CHECK(gpu->modules_loaded() == 1);
        std::vector<std::uint64_t> fill = {10, 100};
        REQUIRE(gpu->launch(hash, "fill_region", bytes_of(fill), 0,
                            GpuGeometry{{1, 1, 1}, {32, 1, 1}}, 1s));
        std::vector<std::uint64_t> values(10);
        REQUIRE(gpu->read("data", 0, std::as_writable_bytes(std::span(values))));
        CHECK(values[9] == 109);
    }
    fake.check_all_released();
    CHECK(fake.violations().empty());
}

TEST_CASE("a GPU kernel past its time is kernel_timeout, and the device recreates its context and "
          "works after it",
          "[unit]") {
    fake::Scope fake;
    {
        auto gpu = open_fake(fake);
        const auto hash = hash_of(fake::kFakePtx);
        REQUIRE(gpu->load_module(hash, fake::kFakePtx));

        const auto start = std::chrono::steady_clock::now();
        auto stuck = gpu->launch(hash, "spin_forever", {}, 8, GpuGeometry{}, 20ms);
        const auto waited = std::chrono::steady_clock::now() - start;
        REQUIRE_FALSE(stuck);
        CHECK(stuck.error().code == Errc::kernel_timeout);
        CHECK_THAT(stuck.error().message,
                   Catch::Contains("kernel 'spin_forever' still running after 20 ms") &&
                       Catch::Contains("the context was recreated") &&
                       !Catch::Contains("GPU regions"));
        CHECK(waited >= 20ms);
        CHECK(waited < 5s);
        CHECK(gpu->context_resets() == 1);

        auto sum = gpu->launch(hash, "sum_u64", bytes_of(sum_args(2, 3)), 8, GpuGeometry{}, 1s);
        REQUIRE(sum);
        CHECK(u64_at(*sum) == 5);
    }
    fake.check_all_released();
    CHECK(fake.violations().empty());
}

TEST_CASE(
    "a GPU whose context cannot be recreated says so, and recovers on a later call when it can",
    "[unit]") {
    fake::Scope fake;
    {
        auto gpu = open_fake(fake);
        const auto hash = hash_of(fake::kFakePtx);
        REQUIRE(gpu->load_module(hash, fake::kFakePtx));
        REQUIRE(gpu->add_region("data", 64));

        fake.state.refuse_retain = true;
        auto crashed = gpu->launch(hash, "bad_address", {}, 8, GpuGeometry{}, 1s);
        REQUIRE_FALSE(crashed);
        CHECK(crashed.error().code == Errc::kernel_crashed);
        CHECK_THAT(crashed.error().message, Catch::Contains("recreating the context failed"));
        CHECK(gpu->context_resets() == 0);

        std::vector<std::byte> back(64);
        auto unusable = gpu->read("data", 0, back);
        REQUIRE_FALSE(unusable);
        CHECK(unusable.error().code == Errc::no_device);
        CHECK_THAT(unusable.error().message, Catch::Contains("GPU 0 is unusable"));

        fake.state.refuse_retain = false;
        REQUIRE(gpu->read("data", 0, back));
        CHECK(all_zero(back));
        CHECK(gpu->context_resets() == 1);
        auto sum = gpu->launch(hash, "sum_u64", bytes_of(sum_args(2, 3)), 8, GpuGeometry{}, 1s);
        REQUIRE(sum);
        CHECK(u64_at(*sum) == 5);
    }
    fake.check_all_released();
    CHECK(fake.violations().empty());
}

TEST_CASE("GPU calls from many threads take turns on the stream, each making the context current "
          "on its thread",
          "[unit]") {
    fake::Scope fake;
    {
        auto gpu = open_fake(fake);
        const auto hash = hash_of(fake::kFakePtx);
        REQUIRE(gpu->load_module(hash, fake::kFakePtx));
        REQUIRE(gpu->add_region("data", std::uint64_t{1} << 20));
        constexpr int kThreads = 6, kCalls = 40;
        std::atomic<int> wrong{0};
        std::vector<std::thread> threads;
        for (int t = 0; t < kThreads; ++t) {
            threads.emplace_back([&, t] {
                const auto mine = pattern(4096, static_cast<unsigned>(t) + 100);
                std::vector<std::byte> back(4096);
                for (int i = 0; i < kCalls; ++i) {
                    auto sum = gpu->launch(hash, "sum_u64", bytes_of(sum_args(t, i)), 8,
                                           GpuGeometry{}, 1s);
                    if (!sum || u64_at(*sum) != static_cast<std::uint64_t>(t + i)) ++wrong;
                    const std::uint64_t offset = static_cast<std::uint64_t>(t) * 8192 + 1;
                    if (!gpu->write("data", offset, mine) || !gpu->read("data", offset, back) ||
                        back != mine)
                        ++wrong;
                }
            });
        }
        for (auto& t : threads)
            t.join();
        CHECK(wrong == 0);
        CHECK(gpu->launches() == kThreads * kCalls);
    }
    fake.check_all_released();
    CHECK(fake.violations().empty());
}

// ---------------------------------------------------------------------------------------------
// On a real GPU.

namespace {

/// Whether this process runs this one test case alone, as ctest runs each: then a skip is the
/// exit status 77 (SKIP_RETURN_CODE); in a run of many it is a warning, and the others go on.
bool runs_alone() {
    const auto& config = Catch::getCurrentContext().getConfig();
    return Catch::filterTests(Catch::getAllTestCasesSorted(*config), config->testSpec(), *config)
               .size() == 1;
}

/// The driver, or null after skipping the test (no driver, or no GPU).
std::shared_ptr<const CudaApi> driver_or_skip() {
    std::string why;
    auto api = CudaApi::load();
    if (api) {
        int count = 0;
        if (int r = (*api)->cuDeviceGetCount(&count); r != cuda::kSuccess)
            why = "cuDeviceGetCount: " + (*api)->said(r);
        else if (count == 0)
            why = "the CUDA driver sees no GPU";
        else
            return *api;
    } else {
        why = api.error().message;
    }
    if (runs_alone()) {
        std::printf("skipped: %s\n", why.c_str());
        std::fflush(stdout);
        std::exit(77);
    }
    WARN("skipped: " << why);
    return nullptr;
}

std::unique_ptr<GpuDevice> open_gpu(const std::shared_ptr<const CudaApi>& api) {
    auto gpu = GpuDevice::open(api, 0);
    INFO((gpu ? std::string() : gpu.error().describe()));
    REQUIRE(gpu);
    INFO((*gpu)->name() << " sm_" << (*gpu)->sm());
    REQUIRE((*gpu)->load_module(hash_of(kTestPtx), kTestPtx));
    return std::move(*gpu);
}

} // namespace

TEST_CASE("on a GPU, a PTX kernel runs with its arguments, result and regions, and region reads "
          "and writes round-trip",
          "[gpu][needs-gpu]") {
    auto api = driver_or_skip();
    if (!api) return;
    auto gpu = open_gpu(api);
    const auto hash = hash_of(kTestPtx);
    REQUIRE(gpu->add_region("data", 1 << 20));
    REQUIRE(gpu->add_region("big", std::uint64_t{20} << 20));

    auto sum =
        gpu->launch(hash, "sum_u64", bytes_of(sum_args(40, 2)), 8, gpu->default_geometry(), 10s);
    INFO((sum ? std::string() : sum.error().describe()));
    REQUIRE(sum);
    CHECK(u64_at(*sum) == 42);

    std::vector<std::uint64_t> fill = {1000, 7};
    REQUIRE(gpu->launch(hash, "fill_region", bytes_of(fill), 0, GpuGeometry{{4, 1, 1}, {256, 1, 1}},
                        10s));
    std::vector<std::uint64_t> values(1001);
    REQUIRE(gpu->read("data", 0, std::as_writable_bytes(std::span(values))));
    CHECK(values[0] == 7);
    CHECK(values[999] == 1006);
    CHECK(values[1000] == 0);

    const auto data = pattern((std::size_t{17} << 20) + 5, 9);
    REQUIRE(gpu->write("big", 4097, data));
    std::vector<std::byte> back(data.size());
    REQUIRE(gpu->read("big", 4097, back));
    CHECK((back == data));

    std::vector<std::byte> two(2);
    auto past = gpu->read("data", (1 << 20) - 1, two);
    REQUIRE_FALSE(past);
    CHECK(past.error().code == Errc::invalid_argument);
    auto unknown = gpu->launch(hash, "nope", {}, 8, GpuGeometry{}, 10s);
    REQUIRE_FALSE(unknown);
    CHECK(unknown.error().code == Errc::entry_not_found);
    CHECK(gpu->context_resets() == 0);
}

TEST_CASE("on a GPU, an illegal address is kernel_crashed and the device works after it",
          "[gpu][needs-gpu]") {
    auto api = driver_or_skip();
    if (!api) return;
    auto gpu = open_gpu(api);
    const auto hash = hash_of(kTestPtx);
    REQUIRE(gpu->add_region("data", 4096));
    REQUIRE(gpu->write("data", 0, pattern(4096, 1)));

    auto crashed = gpu->launch(hash, "bad_address", {}, 8, GpuGeometry{}, 10s);
    REQUIRE_FALSE(crashed);
    INFO(crashed.error().describe());
    CHECK(crashed.error().code == Errc::kernel_crashed);
    CHECK_THAT(crashed.error().message, Catch::Contains("the context was recreated") &&
                                            Catch::Contains("GPU regions were allocated again"));
    CHECK(gpu->context_resets() == 1);

    auto sum = gpu->launch(hash, "sum_u64", bytes_of(sum_args(40, 2)), 8, GpuGeometry{}, 10s);
    INFO((sum ? std::string() : sum.error().describe()));
    REQUIRE(sum);
    CHECK(u64_at(*sum) == 42);
    std::vector<std::byte> back(4096);
    REQUIRE(gpu->read("data", 0, back));
    CHECK(all_zero(back));
}

TEST_CASE("on a GPU, a kernel that never returns is kernel_timeout after its time",
          "[gpu][needs-gpu]") {
    auto api = driver_or_skip();
    if (!api) return;
    auto gpu = open_gpu(api);
    const auto hash = hash_of(kTestPtx);

    const auto start = std::chrono::steady_clock::now();
    auto stuck = gpu->launch(hash, "spin_forever", {}, 8, GpuGeometry{}, 200ms);
    const auto waited = std::chrono::steady_clock::now() - start;
    REQUIRE_FALSE(stuck);
    INFO(stuck.error().describe());
    CHECK(stuck.error().code == Errc::kernel_timeout);
    CHECK(waited >= 200ms);
    INFO("returned after " << std::chrono::duration_cast<std::chrono::milliseconds>(waited).count()
                           << " ms");
    CHECK(waited < 10s);
    CHECK(gpu->context_resets() == 1);

    // Whether recreating the context stopped the kernel: the device works after it.
    auto sum = gpu->launch(hash, "sum_u64", bytes_of(sum_args(1, 2)), 8, GpuGeometry{}, 10s);
    INFO((sum ? std::string() : sum.error().describe()));
    REQUIRE(sum);
    CHECK(u64_at(*sum) == 3);
}
