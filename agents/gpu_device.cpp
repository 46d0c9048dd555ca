#include "gpu_device_impl.hpp"

#include "ptx_geometry.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fmt/format.h>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <unistd.h>

namespace bitship::agent {
namespace {

using namespace std::chrono_literals;
using cuda::CUdeviceptr;
using cuda::CUresult;

/// Kernel argument and result buffers are allocated in multiples of this, and at least this.
constexpr std::size_t kParamAlignment = 16;
/// Room for the driver's PTX JIT error log.
constexpr std::size_t kJitLogBytes = std::size_t{16} << 10;
/// A launch is waited for by spinning this long, then by sleeping in growing steps up to
/// kMaxPollSleep: kernels up to a few milliseconds (a pass over GPU memory) answer within a
/// poll of finishing (a sleep oversleeps by the timer slack, 50 µs, which would be several
/// percent of such a call), longer ones cost little CPU. A GPU host has the cores to spare.
constexpr auto kSpinFor = 5ms;
constexpr auto kFirstPollSleep = 5us;
constexpr auto kMaxPollSleep = 100us;
/// default_geometry(): threads a block and blocks per multiprocessor.
constexpr unsigned kDefaultBlockThreads = 256;
constexpr unsigned kDefaultBlocksPerMultiprocessor = 8;
constexpr int kBusIdLength = 32; ///< "0000:3B:00.0" and its NUL, with room

void cpu_pause() noexcept {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
}

std::size_t param_bytes(std::size_t n) {
    return std::max(kParamAlignment, (n + kParamAlignment - 1) / kParamAlignment * kParamAlignment);
}

std::string describe(const GpuGeometry& g) {
    return fmt::format("grid {}x{}x{}, block {}x{}x{}", g.grid[0], g.grid[1], g.grid[2], g.block[0],
                       g.block[1], g.block[2]);
}

} // namespace


// 1. Retain the primary context and make it current; 2. its stream and the staging events;
// 3. pin the staging buffers (allocated once, in open()).
Result<void> GpuDevice::Impl::make_context() {
    if (CUresult r = cu.cuDevicePrimaryCtxRetain(&context, device); r != cuda::kSuccess)
        return tl::make_unexpected(refused("cuDevicePrimaryCtxRetain", r, Errc::no_device));
    retained = true;
    if (CUresult r = cu.cuCtxSetCurrent(context); r != cuda::kSuccess)
        return tl::make_unexpected(refused("cuCtxSetCurrent", r, Errc::no_device));
    // Non-blocking: the stream does not wait for work others put on the legacy default stream.
    if (CUresult r = cu.cuStreamCreate(&stream, cuda::kStreamNonBlocking); r != cuda::kSuccess)
        return tl::make_unexpected(refused("cuStreamCreate", r, Errc::no_device));
    for (auto& s : staging) {
        if (CUresult r = cu.cuEventCreate(&s.done, cuda::kEventDisableTiming); r != cuda::kSuccess)
            return tl::make_unexpected(refused("cuEventCreate", r, Errc::no_device));
        // Portable: pinned for every context. UCX could register this same memory later (e.g. to
        // send a region read straight from the staging buffer) without another copy.
        CUresult r =
            cu.cuMemHostRegister(s.host.get(), kStagingBytes, cuda::kMemHostRegisterPortable);
        // A registration may outlive a context reset: then it is already pinned, which is all we
        // need.
        if (r != cuda::kSuccess && r != cuda::kErrorHostMemoryAlreadyRegistered)
            return tl::make_unexpected(refused("cuMemHostRegister", r, Errc::no_device));
        s.registered = true;
    }
    return {};
}

/// Marks the context unusable for good (see gpu_device.hpp: the driver recovers no other way
/// than by the process's end) and returns what a failed call's message adds.
std::string GpuDevice::Impl::poison(std::string why) {
    if (poisoned.empty()) poisoned = std::move(why);
    return "; the GPU context is poisoned (the CUDA driver lets a process recover from this only "
           "by exiting)";
}

/// The start of every call that uses the driver: makes the context current on this thread (a
/// worker may run on any thread), unless the context is poisoned.
Result<void> GpuDevice::Impl::ready() {
    if (!poisoned.empty())
        return fail(Errc::no_device, fmt::format("{} is unusable: {}", where, poisoned));
    if (CUresult r = cu.cuCtxSetCurrent(context); r != cuda::kSuccess)
        return tl::make_unexpected(failed("cuCtxSetCurrent", r));
    return {};
}

/// A driver call's failure as an error of `code`.
Error GpuDevice::Impl::refused(std::string_view call, CUresult r, Errc code) const {
    return Error{code, fmt::format("{}: {} failed: {}", where, call, cu.said(r))};
}

/// The same, and a sticky error poisons the context; the message says so.
Error GpuDevice::Impl::failed(std::string_view call, CUresult r, Errc code) {
    Error error = refused(call, r, code);
    if (cuda::is_sticky(r)) error.message += poison(fmt::format("{} failed with {}", call, cu.said(r)));
    return error;
}

Result<void> GpuDevice::Impl::allocate_zeroed(CUdeviceptr& pointer, std::uint64_t size,
                                              std::string_view what) {
    if (CUresult r = cu.cuMemAlloc(&pointer, size); r != cuda::kSuccess) {
        pointer = 0;
        return fail(Errc::no_device, fmt::format("{}: cannot allocate {} of {} bytes: {}", where,
                                                 what, size, cu.said(r)));
    }
    if (CUresult r = cu.cuMemsetD8Async(pointer, 0, size, stream); r != cuda::kSuccess)
        return tl::make_unexpected(refused("cuMemsetD8Async", r, Errc::no_device));
    return {};
}

/// Makes `buffer` hold at least `size` bytes. The stream is idle between calls, so the old
/// buffer is free to go.
Result<void> GpuDevice::Impl::reserve(DeviceBuffer& buffer, std::size_t size,
                                      std::string_view what) {
    if (buffer.capacity >= size) return {};
    if (buffer.pointer != 0) cu.cuMemFree(buffer.pointer);
    buffer = DeviceBuffer{};
    if (CUresult r = cu.cuMemAlloc(&buffer.pointer, size); r != cuda::kSuccess) {
        buffer.pointer = 0;
        return tl::make_unexpected(
            failed(fmt::format("cuMemAlloc of {} bytes for the {}", size, what), r));
    }
    buffer.capacity = size;
    return {};
}

Result<void> GpuDevice::Impl::load(const CodeHash& hash, Module& module) {
    std::string log(kJitLogBytes, '\0');
    int options[] = {cuda::kJitErrorLogBuffer, cuda::kJitErrorLogBufferSizeBytes};
    // The size option's value is the number itself, carried in the pointer (cuda.h: "Option
    // type: unsigned int").
    void* values[] = {log.data(), reinterpret_cast<void*>(static_cast<std::uintptr_t>(log.size()))};
    // std::string's c_str() is NUL-terminated, as the driver reads PTX text.
    CUresult r = cu.cuModuleLoadDataEx(&module.handle, module.ptx.c_str(), std::size(options),
                                       options, values);
    if (r == cuda::kSuccess) return {};
    module.handle = nullptr;
    log.resize(::strnlen(log.data(), log.size()));
    while (!log.empty() && (log.back() == '\n' || log.back() == ' '))
        log.pop_back();
    auto error = failed(fmt::format("loading the PTX of module {}", to_hex(hash, kHashDigitsInMessages)), r,
                        Errc::compile_failed);
    if (!log.empty()) error.message += ": " + log;
    return tl::make_unexpected(std::move(error));
}

Result<cuda::CUfunction> GpuDevice::Impl::function(const CodeHash& hash, std::string_view entry) {
    auto m = modules.find(hash);
    if (m == modules.end())
        return fail(Errc::entry_not_found,
                    fmt::format("{}: module {} is not loaded", where, to_hex(hash, kHashDigitsInMessages)));
    Module& module = m->second;
    if (auto f = module.functions.find(entry); f != module.functions.end()) return f->second;
    cuda::CUfunction f = nullptr;
    const std::string name(entry);
    if (CUresult r = cu.cuModuleGetFunction(&f, module.handle, name.c_str()); r != cuda::kSuccess) {
        if (r == cuda::kErrorNotFound)
            return fail(Errc::entry_not_found,
                        fmt::format("{}: module {} has no kernel '{}'", where,
                                    to_hex(hash, kHashDigitsInMessages), entry));
        return tl::make_unexpected(failed(fmt::format("cuModuleGetFunction('{}')", entry), r));
    }
    module.functions.emplace(name, f);
    return f;
}

// Polls the stream: spinning at first, then sleeping in growing steps, until the kernel (and
// the copies queued before it) are done, it fails, or `timeout` passes since `start`.
Result<void> GpuDevice::Impl::wait_for_kernel(std::string_view entry,
                                              std::chrono::steady_clock::time_point start,
                                              std::chrono::milliseconds timeout) {
    auto pause = kFirstPollSleep;
    for (;;) {
        const CUresult r = cu.cuStreamQuery(stream);
        if (r == cuda::kSuccess) return {};
        if (r != cuda::kErrorNotReady) {
            const bool sticky = cuda::is_sticky(r);
            std::string message =
                fmt::format("{}: kernel '{}' failed: {}", where, entry, cu.said(r));
            if (sticky) message += poison(fmt::format("kernel '{}' failed with {}", entry, cu.said(r)));
            const Errc code = r == cuda::kErrorLaunchTimeout ? Errc::kernel_timeout
                              : sticky                       ? Errc::kernel_crashed
                                                             : Errc::internal;
            return fail(code, std::move(message));
        }
        const auto waited = std::chrono::steady_clock::now() - start;
        if (waited >= timeout)
            return fail(Errc::kernel_timeout,
                        fmt::format("{}: kernel '{}' still running after {} ms{}", where, entry,
                                    timeout.count(),
                                    poison(fmt::format("kernel '{}' still runs", entry))));
        if (waited < kSpinFor) {
            cpu_pause();
        } else {
            std::this_thread::sleep_for(pause);
            pause = std::min(pause * 2, kMaxPollSleep);
        }
    }
}

const GpuDevice::Impl::Region* GpuDevice::Impl::find_region(std::string_view region_name) const {
    auto it = std::find_if(regions.begin(), regions.end(),
                           [&](const Region& r) { return r.name == region_name; });
    return it == regions.end() ? nullptr : &*it;
}

GpuDevice::Impl::~Impl() {
    // A poisoned context is left as it is: the driver lets the process do nothing more with the
    // GPU, and a release could wait forever for a kernel that still runs; the process's end
    // tears it down. The staging memory is freed without unregistering it: no copy can still
    // target it (uploads finish before a kernel runs, and no download is queued behind one that
    // failed or never ended). bitship-gpu does not get here: a poisoned process exits at once.
    if (!poisoned.empty()) return;
    // Frees what exists, in reverse order of making; a half-made context may refuse some of it,
    // which changes nothing: releasing the last reference resets the context.
    if (retained && cu.cuCtxSetCurrent(context) == cuda::kSuccess) {
        if (stream != nullptr) cu.cuStreamSynchronize(stream);
        for (auto& [hash, module] : modules)
            if (module.handle != nullptr) cu.cuModuleUnload(module.handle);
        for (const auto* buffer : {&args, &result, &table})
            if (buffer->pointer != 0) cu.cuMemFree(buffer->pointer);
        for (const auto& region : regions)
            if (region.pointer != 0) cu.cuMemFree(region.pointer);
        for (auto& s : staging) {
            if (s.done != nullptr) cu.cuEventDestroy(s.done);
            if (s.registered) cu.cuMemHostUnregister(s.host.get());
        }
        if (!pinned.empty()) cu.cuMemHostUnregister(pinned.data());
        if (stream != nullptr) cu.cuStreamDestroy(stream);
    } else {
        for (auto& s : staging)
            if (s.registered) cu.cuMemHostUnregister(s.host.get());
        if (!pinned.empty()) cu.cuMemHostUnregister(pinned.data());
    }
    if (retained) cu.cuDevicePrimaryCtxRelease(device);
    // The staging memory itself goes with `staging`, after its registration.
}

Result<std::unique_ptr<GpuDevice>> GpuDevice::open(std::shared_ptr<const CudaApi> api,
                                                   int ordinal) {
    if (api == nullptr)
        return fail(Errc::no_device, fmt::format("GPU {}: no CUDA driver", ordinal));
    auto impl = std::make_unique<Impl>(std::move(api), ordinal);
    const CudaApi& cu = impl->cu;
    auto refused = [&](std::string_view call, CUresult r) {
        return fail(Errc::no_device,
                    fmt::format("{}: {} failed: {}", impl->where, call, cu.said(r)));
    };

    // 1. The device and what it can do.
    if (CUresult r = cu.cuDeviceGet(&impl->device, ordinal); r != cuda::kSuccess)
        return refused("cuDeviceGet", r);
    char name[cuda::kDeviceNameLength] = {};
    if (CUresult r = cu.cuDeviceGetName(name, cuda::kDeviceNameLength - 1, impl->device); r != cuda::kSuccess)
        return refused("cuDeviceGetName", r);
    impl->name = name;
    char bus_id[kBusIdLength] = {};
    if (CUresult r = cu.cuDeviceGetPCIBusId(bus_id, kBusIdLength - 1, impl->device); r == cuda::kSuccess)
        impl->pci_bus_id = bus_id; // only to place it among NUMA nodes: not worth refusing the GPU over
    auto attribute = [&](int which, std::string_view what) -> Result<std::uint32_t> {
        int value = 0;
        if (CUresult r = cu.cuDeviceGetAttribute(&value, which, impl->device); r != cuda::kSuccess)
            return refused(fmt::format("cuDeviceGetAttribute({})", what), r);
        return static_cast<std::uint32_t>(std::max(value, 0));
    };
    struct Wanted {
        int attribute;
        std::string_view what;
        std::uint32_t* into;
    };
    std::uint32_t cc_major = 0, cc_minor = 0, multiprocessors = 0, max_threads = 0;
    const Wanted wanted[] = {
        {cuda::kAttrComputeCapabilityMajor, "compute capability major", &cc_major},
        {cuda::kAttrComputeCapabilityMinor, "compute capability minor", &cc_minor},
        {cuda::kAttrMultiprocessorCount, "multiprocessors", &multiprocessors},
        {cuda::kAttrMaxThreadsPerBlock, "max threads per block", &max_threads},
        {cuda::kAttrMaxBlockDimX, "max block x", &impl->max_block[0]},
        {cuda::kAttrMaxBlockDimY, "max block y", &impl->max_block[1]},
        {cuda::kAttrMaxBlockDimZ, "max block z", &impl->max_block[2]},
        {cuda::kAttrMaxGridDimX, "max grid x", &impl->max_grid[0]},
        {cuda::kAttrMaxGridDimY, "max grid y", &impl->max_grid[1]},
        {cuda::kAttrMaxGridDimZ, "max grid z", &impl->max_grid[2]},
    };
    for (const auto& w : wanted) {
        auto value = attribute(w.attribute, w.what);
        if (!value) return tl::make_unexpected(value.error());
        *w.into = *value;
    }
    impl->sm = cc_major * 10 + cc_minor;
    impl->multiprocessors = multiprocessors;
    impl->max_threads_per_block = max_threads;
    std::size_t memory = 0;
    if (CUresult r = cu.cuDeviceTotalMem(&memory, impl->device); r != cuda::kSuccess)
        return refused("cuDeviceTotalMem", r);
    impl->memory_bytes = memory;

    // 2. The staging buffers, page-aligned (pinning works on whole pages).
    const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    for (auto& s : impl->staging) {
        void* p = nullptr;
        if (int e = ::posix_memalign(&p, page, kStagingBytes); e != 0)
            return fail(Errc::no_device,
                        fmt::format("{}: cannot allocate {} bytes of staging memory: {}",
                                    impl->where, kStagingBytes, std::strerror(e)));
        s.host.reset(static_cast<std::byte*>(p));
    }

    // 3. The context, its stream and the pinned staging buffers.
    std::lock_guard lock(impl->mutex);
    if (auto made = impl->make_context(); !made) return tl::make_unexpected(made.error());
    return std::unique_ptr<GpuDevice>(new GpuDevice(std::move(impl)));
}

GpuDevice::GpuDevice(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GpuDevice::~GpuDevice() = default;

int GpuDevice::ordinal() const noexcept {
    return impl_->ordinal;
}
const std::string& GpuDevice::name() const noexcept {
    return impl_->name;
}
const std::string& GpuDevice::pci_bus_id() const noexcept {
    return impl_->pci_bus_id;
}
unsigned GpuDevice::sm() const noexcept {
    return impl_->sm;
}
unsigned GpuDevice::multiprocessors() const noexcept {
    return impl_->multiprocessors;
}
std::uint64_t GpuDevice::memory_bytes() const noexcept {
    return impl_->memory_bytes;
}

GpuLimits GpuDevice::limits() const noexcept {
    GpuLimits l;
    l.multiprocessors = impl_->multiprocessors;
    l.max_threads_per_block = static_cast<std::uint32_t>(impl_->max_threads_per_block);
    for (std::size_t i = 0; i < kDims; ++i) {
        l.max_block[i] = impl_->max_block[i];
        l.max_grid[i] = impl_->max_grid[i];
    }
    return l;
}

GpuInfo GpuDevice::info() const {
    return GpuInfo{impl_->name, impl_->pci_bus_id, impl_->sm, limits(), impl_->memory_bytes};
}

GpuGeometry GpuDevice::geometry_for(const CodeHash& hash, std::string_view entry) const {
    std::lock_guard lock(impl_->mutex);
    auto it = impl_->modules.find(hash);
    return it == impl_->modules.end() ? default_geometry() : launch_geometry(limits(), it->second.ptx, entry);
}

GpuGeometry GpuDevice::default_geometry() const noexcept {
    return bitship::agent::default_geometry(limits());
}

GpuGeometry default_geometry(const GpuLimits& limits) {
    GpuGeometry g;
    g.block[0] = std::max<std::uint32_t>(
        1, std::min<std::uint64_t>({kDefaultBlockThreads, limits.max_threads_per_block, limits.max_block[0]}));
    g.grid[0] = std::max<std::uint32_t>(
        1, std::min<std::uint64_t>(std::uint64_t{kDefaultBlocksPerMultiprocessor} * limits.multiprocessors,
                                   limits.max_grid[0]));
    return g;
}

GpuGeometry launch_geometry(const GpuLimits& limits, std::string_view ptx, std::string_view entry) {
    auto declared = bitship::agent::declared_geometry(ptx, entry);
    if (!declared) return default_geometry(limits);
    GpuGeometry g; // as declared: launch() refuses it, naming it, when the device cannot have it
    g.block[0] = declared->threads;
    g.grid[0] = static_cast<std::uint32_t>(
        std::min<std::uint64_t>(std::uint64_t{declared->blocks_per_sm} * limits.multiprocessors, 0xffffffffu));
    return g;
}

Result<void> GpuDevice::add_region(const std::string& name, std::uint64_t size) {
    if (size == 0)
        return fail(Errc::invalid_argument,
                    fmt::format("{}: region '{}' has size 0", impl_->where, name));
    std::lock_guard lock(impl_->mutex);
    if (impl_->find_region(name) != nullptr)
        return fail(Errc::invalid_argument,
                    fmt::format("{}: there is a region '{}' already", impl_->where, name));
    if (auto r = impl_->ready(); !r) return r;
    Impl::Region region{name, size, 0};
    if (auto r = impl_->allocate_zeroed(region.pointer, size, "region '" + name + "'"); !r) {
        if (region.pointer != 0) impl_->cu.cuMemFree(region.pointer);
        return r;
    }
    if (CUresult r = impl_->cu.cuStreamSynchronize(impl_->stream); r != cuda::kSuccess) {
        impl_->cu.cuMemFree(region.pointer);
        return tl::make_unexpected(impl_->failed("cuStreamSynchronize", r));
    }
    impl_->regions.push_back(std::move(region));
    impl_->table_current = false;
    return {};
}

std::optional<GpuDevice::RegionView> GpuDevice::region(std::string_view name) const {
    std::lock_guard lock(impl_->mutex);
    const auto* r = impl_->find_region(name);
    if (r == nullptr) return std::nullopt;
    return RegionView{r->name, r->size, static_cast<std::size_t>(r - impl_->regions.data())};
}

std::vector<GpuDevice::RegionView> GpuDevice::regions() const {
    std::lock_guard lock(impl_->mutex);
    std::vector<RegionView> out;
    out.reserve(impl_->regions.size());
    for (std::size_t i = 0; i < impl_->regions.size(); ++i)
        out.push_back(RegionView{impl_->regions[i].name, impl_->regions[i].size, i});
    return out;
}

bool GpuDevice::has_module(const CodeHash& hash) const {
    std::lock_guard lock(impl_->mutex);
    return impl_->modules.contains(hash);
}

Result<void> GpuDevice::load_module(const CodeHash& hash, const std::string& ptx) {
    std::lock_guard lock(impl_->mutex);
    if (impl_->modules.contains(hash)) return {};
    if (auto r = impl_->ready(); !r) return r;
    Impl::Module module{ptx, nullptr, {}};
    if (auto r = impl_->load(hash, module); !r) return r;
    impl_->modules.emplace(hash, std::move(module));
    impl_->modules_loaded.fetch_add(1, std::memory_order_relaxed);
    return {};
}

Result<void> GpuDevice::unload_module(const CodeHash& hash) {
    std::lock_guard lock(impl_->mutex);
    auto it = impl_->modules.find(hash);
    if (it == impl_->modules.end()) return {};
    if (auto r = impl_->ready(); !r) return r;
    const auto handle = it->second.handle;
    impl_->modules.erase(it);
    if (handle != nullptr)
        if (CUresult r = impl_->cu.cuModuleUnload(handle); r != cuda::kSuccess)
            return tl::make_unexpected(impl_->failed("cuModuleUnload", r));
    return {};
}

// 1. check the geometry against the device's limits; 2. find (or reload) the kernel; 3. make
// the parameter buffers big enough and fill them: arguments, a zeroed result, the regions table;
// 4. launch; 5. wait; 6. copy the result out.
Result<Bytes> GpuDevice::launch(const CodeHash& hash, std::string_view entry,
                                std::span<const std::byte> args, std::uint32_t result_bytes,
                                const GpuGeometry& geometry, std::chrono::milliseconds timeout) {
    Impl& d = *impl_;
    std::uint64_t threads = 1;
    for (std::size_t i = 0; i < kDims; ++i) {
        if (geometry.grid[i] == 0 || geometry.block[i] == 0)
            return fail(Errc::invalid_argument,
                        fmt::format("{}: {}: every dimension must be at least 1", d.where,
                                    describe(geometry)));
        if (geometry.block[i] > d.max_block[i] || geometry.grid[i] > d.max_grid[i])
            return fail(
                Errc::invalid_argument,
                fmt::format("{}: {} is over the device's limits (grid {}x{}x{}, block {}x{}x{})",
                            d.where, describe(geometry), d.max_grid[0], d.max_grid[1],
                            d.max_grid[2], d.max_block[0], d.max_block[1], d.max_block[2]));
        threads *= geometry.block[i];
    }
    if (threads > d.max_threads_per_block)
        return fail(Errc::invalid_argument,
                    fmt::format("{}: {} has {} threads a block, over the device's {}", d.where,
                                describe(geometry), threads, d.max_threads_per_block));

    std::lock_guard lock(d.mutex);
    if (auto r = d.ready(); !r) return tl::make_unexpected(r.error());
    auto function = d.function(hash, entry);
    if (!function) return tl::make_unexpected(function.error());

    const std::size_t result_allocated = param_bytes(result_bytes);
    const std::size_t table_bytes =
        param_bytes(std::max<std::size_t>(d.regions.size(), 1) * sizeof(CUdeviceptr));
    for (auto [buffer, size, what] : {std::tuple{&d.args, param_bytes(args.size()), "arguments"},
                                      std::tuple{&d.result, result_allocated, "result"},
                                      std::tuple{&d.table, table_bytes, "regions table"}}) {
        const bool grows = buffer->capacity < size;
        if (auto r = d.reserve(*buffer, size, what); !r) return tl::make_unexpected(r.error());
        if (grows && buffer == &d.table) d.table_current = false;
    }
    if (!d.table_current) {
        std::vector<CUdeviceptr> pointers(std::max<std::size_t>(d.regions.size(), 1), 0);
        for (std::size_t i = 0; i < d.regions.size(); ++i)
            pointers[i] = d.regions[i].pointer;
        if (auto r = d.upload(d.table.pointer, std::as_bytes(std::span(pointers))); !r)
            return tl::make_unexpected(r.error());
        d.table_current = true;
    }
    if (auto r = d.upload(d.args.pointer, args); !r) return tl::make_unexpected(r.error());
    if (CUresult r = d.cu.cuMemsetD8Async(d.result.pointer, 0, result_allocated, d.stream);
        r != cuda::kSuccess)
        return tl::make_unexpected(d.failed("cuMemsetD8Async", r));

    // The kernel's three .param .u64: each entry of `params` points at one parameter's value.
    CUdeviceptr args_pointer = d.args.pointer, result_pointer = d.result.pointer,
                table_pointer = d.table.pointer;
    void* params[] = {&args_pointer, &result_pointer, &table_pointer};
    const auto start = std::chrono::steady_clock::now();
    if (CUresult r = d.cu.cuLaunchKernel(*function, geometry.grid[0], geometry.grid[1],
                                         geometry.grid[2], geometry.block[0], geometry.block[1],
                                         geometry.block[2], 0, d.stream, params, nullptr);
        r != cuda::kSuccess) {
        // Too many threads for the kernel's registers: a geometry this kernel cannot have.
        const Errc code =
            r == cuda::kErrorLaunchOutOfResources ? Errc::invalid_argument : Errc::internal;
        return tl::make_unexpected(
            d.failed(fmt::format("launching '{}' with {}", entry, describe(geometry)), r, code));
    }
    d.launches.fetch_add(1, std::memory_order_relaxed);
    if (auto r = d.wait_for_kernel(entry, start, timeout); !r)
        return tl::make_unexpected(r.error());

    Bytes out(result_bytes);
    if (auto r = d.download(d.result.pointer, out); !r) return tl::make_unexpected(r.error());
    return out;
}

std::string GpuDevice::poisoned() const {
    std::lock_guard lock(impl_->mutex);
    return impl_->poisoned;
}
std::uint64_t GpuDevice::launches() const noexcept {
    return impl_->launches.load(std::memory_order_relaxed);
}
std::uint64_t GpuDevice::modules_loaded() const noexcept {
    return impl_->modules_loaded.load(std::memory_order_relaxed);
}

} // namespace bitship::agent
