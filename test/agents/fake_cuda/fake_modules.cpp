// The fake CUDA driver's modules and launches, and the table of kernels it "runs" by name
// (fake_libcuda.cpp says what the driver does).
#include "fake_ptx.hpp"
#include "fake_state.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

using namespace bitship::test::fake_cuda;

namespace {

namespace fake_ptx = bitship::test::fake_ptx;

// The kernels, run at once on the launch.

struct Params {
    CUdeviceptr args = 0, result = 0, regions = 0;
};

/// Runs table kernel `name`: the device failure it ends with, or success.
CUresult run(CUctx_st* ctx, const std::string& name, const Params& p, const unsigned grid[3],
             const unsigned block[3], CUstream_st* stream) {
    auto u64s = [&](CUdeviceptr at, std::uint64_t count) -> std::uint64_t* {
        if (count > SIZE_MAX / sizeof(std::uint64_t)) return nullptr;
        return reinterpret_cast<std::uint64_t*>(
            device_bytes(ctx, at, count * sizeof(std::uint64_t)));
    };
    auto region0 = [&]() -> const std::uint64_t* { return u64s(p.regions, 1); };
    if (name == "twice") {
        auto* in = u64s(p.args, 1);
        auto* out = u64s(p.result, 1);
        if (in == nullptr || out == nullptr) return cuda::kErrorIllegalAddress;
        *out = 2 * *in;
    } else if (name == "sum_u64") {
        auto* in = u64s(p.args, 1);
        auto* out = u64s(p.result, 1);
        const auto* table = region0();
        if (in == nullptr || out == nullptr || table == nullptr) return cuda::kErrorIllegalAddress;
        if (*in == 0) return cuda::kSuccess;
        const auto* data = u64s(*table, *in);
        if (data == nullptr) return cuda::kErrorIllegalAddress;
        std::uint64_t sum = 0;
        for (std::uint64_t i = 0; i < *in; ++i)
            sum += data[i];
        *out += sum;
    } else if (name == "fill_u64") {
        auto* in = u64s(p.args, 3);
        const auto* table = region0();
        if (in == nullptr || table == nullptr) return cuda::kErrorIllegalAddress;
        if (in[0] == 0) return cuda::kSuccess;
        auto* data = u64s(*table, in[0]);
        if (data == nullptr) return cuda::kErrorIllegalAddress;
        for (std::uint64_t i = 0; i < in[0]; ++i)
            data[i] = i * in[1] + in[2];
    } else if (name == "where" || name == "where_declared") {
        auto* out = u64s(p.result, 3);
        if (out == nullptr) return cuda::kErrorIllegalAddress;
        out[0] = 1;
        out[1] = grid[0];
        out[2] = block[0];
    } else if (name == "sees_data") {
        const auto* table = region0();
        auto* out = u64s(p.result, 1);
        if (table == nullptr || out == nullptr) return cuda::kErrorIllegalAddress;
        *out = *table != 0;
    } else if (name == "fault") {
        return cuda::kErrorIllegalAddress;
    } else if (name == "spin_forever") {
        stream->spinning = true;
    } else {
        return cuda::kErrorLaunchFailed;
    }
    return cuda::kSuccess;
}

} // namespace

// Modules and launches.

FAKE_CUDA_EXPORT CUresult cuModuleLoadDataEx(cuda::CUmodule* module, const void* image,
                                             unsigned option_count, int* options,
                                             void** option_values) {
    if (module == nullptr || image == nullptr) return cuda::kErrorInvalidValue;
    if (option_count != 0 && (options == nullptr || option_values == nullptr))
        return cuda::kErrorInvalidValue;
    auto& s = state();
    std::lock_guard lock(s.mutex);
    CUctx_st* ctx = nullptr;
    if (CUresult r = current_context(s, ctx); r != cuda::kSuccess) return r;
    char* log = nullptr;
    std::size_t log_bytes = 0;
    int log_size_option = -1;
    for (unsigned i = 0; i < option_count; ++i) {
        if (options[i] == cuda::kJitErrorLogBuffer) log = static_cast<char*>(option_values[i]);
        if (options[i] == cuda::kJitErrorLogBufferSizeBytes) {
            log_bytes = reinterpret_cast<std::uintptr_t>(option_values[i]);
            log_size_option = static_cast<int>(i);
        }
    }
    std::string ptx = static_cast<const char*>(image);
    if (std::string why = fake_ptx::refusal(ptx, kSm); !why.empty()) {
        if (log != nullptr && log_bytes > 0) {
            const std::size_t n = std::min(why.size(), log_bytes - 1);
            std::memcpy(log, why.data(), n);
            log[n] = '\0';
            // The size option is in and out: the driver writes back what it filled.
            option_values[log_size_option] =
                reinterpret_cast<void*>(static_cast<std::uintptr_t>(n));
        }
        return kErrorInvalidPtx;
    }
    s.modules.push_back(std::make_unique<CUmod_st>());
    auto* made = s.modules.back().get();
    made->context = ctx;
    made->entries = fake_ptx::entries_of(fake_ptx::without_comments(ptx));
    made->ptx = std::move(ptx);
    ctx->modules.push_back(made);
    ++s.loads;
    *module = made;
    return cuda::kSuccess;
}

FAKE_CUDA_EXPORT CUresult cuModuleGetFunction(cuda::CUfunction* function, cuda::CUmodule module,
                                              const char* name) {
    if (function == nullptr || name == nullptr) return cuda::kErrorInvalidValue;
    if (module == nullptr) return kErrorInvalidHandle;
    auto& s = state();
    std::lock_guard lock(s.mutex);
    if (CUresult r = usable(s, module); r != cuda::kSuccess) return r;
    if (auto f = module->functions.find(name); f != module->functions.end()) {
        *function = f->second;
        return cuda::kSuccess;
    }
    auto entry = module->entries.find(name);
    if (entry == module->entries.end()) return cuda::kErrorNotFound;
    s.functions.push_back(std::make_unique<CUfunc_st>());
    auto* made = s.functions.back().get();
    made->module = module;
    made->name = name;
    made->bitship_abi = entry->second;
    module->functions.emplace(made->name, made);
    *function = made;
    return cuda::kSuccess;
}

FAKE_CUDA_EXPORT CUresult cuModuleUnload(cuda::CUmodule module) {
    if (module == nullptr) return kErrorInvalidHandle;
    auto& s = state();
    std::lock_guard lock(s.mutex);
    if (CUresult r = usable(s, module); r != cuda::kSuccess) return r;
    module->alive = false;
    return cuda::kSuccess;
}

FAKE_CUDA_EXPORT CUresult cuLaunchKernel(cuda::CUfunction function, unsigned grid_x,
                                         unsigned grid_y, unsigned grid_z, unsigned block_x,
                                         unsigned block_y, unsigned block_z, unsigned shared_bytes,
                                         cuda::CUstream stream, void** params, void** extra) {
    if (function == nullptr) return kErrorInvalidHandle;
    auto& s = state();
    std::lock_guard lock(s.mutex);
    if (!s.initialized) return kErrorNotInitialized;
    if (!function->module->alive) return kErrorInvalidHandle;
    if (CUresult r = usable_stream(s, stream); r != cuda::kSuccess) return r;
    CUctx_st* ctx = function->module->context;
    if (stream->context != ctx) return kErrorInvalidHandle;
    const unsigned grid[3] = {grid_x, grid_y, grid_z};
    const unsigned block[3] = {block_x, block_y, block_z};
    std::uint64_t threads = 1;
    for (int i = 0; i < 3; ++i) {
        if (grid[i] == 0 || block[i] == 0 || grid[i] > kMaxGrid[i] || block[i] > kMaxBlock[i])
            return cuda::kErrorInvalidValue;
        threads *= block[i];
    }
    if (threads > kMaxThreadsPerBlock || shared_bytes > kMaxSharedBytes)
        return cuda::kErrorInvalidValue;
    if (extra != nullptr || params == nullptr || !function->bitship_abi)
        return cuda::kErrorInvalidValue;
    Params p;
    CUdeviceptr* values[] = {&p.args, &p.result, &p.regions};
    for (std::size_t i = 0; i < fake_ptx::kBitshipParams; ++i) {
        if (params[i] == nullptr) return cuda::kErrorInvalidValue;
        std::memcpy(values[i], params[i], sizeof(CUdeviceptr));
    }
    if (held_up(stream)) return cuda::kSuccess; // queued behind a kernel that never ends
    if (CUresult failed = run(ctx, function->name, p, grid, block, stream);
        failed != cuda::kSuccess)
        stream->failure = failed; // seen by the next query or synchronisation
    return cuda::kSuccess;
}
