#pragma once
// A fake CUDA driver for GpuDevice's tests, in process: a CudaApi whose entry points act on a
// Driver the test holds (fake::Scope). Device memory is host memory; work put on a stream runs
// only when the stream or an event is waited for (as a real DMA engine runs behind the host),
// and reads host memory when it runs, not when it is queued: a device that reuses a staging
// buffer too early copies the wrong bytes here too. What the device does against the driver's
// rules is listed in `violations`. One test at a time.
//
// Its kernels, by entry name (kFakePtx declares them): sum_u64, fill_region, geometry,
// bad_address (poisons the context), spin_forever (never finishes), slow (takes kSlowPolls
// stream queries), heavy (out of resources over kHeavyMaxThreads threads a block).
// The shared-library fake that xagent can open is fake_libcuda.cpp; what the two say alike
// (the GPU's limits, the error names) is fake_gpu.hpp.

#include "cuda_api.hpp"

#include <catch2/catch.hpp>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

namespace bitship::test::fake {

namespace cuda = agent::cuda;
using cuda::CUcontext;
using cuda::CUdevice;
using cuda::CUdeviceptr;
using cuda::CUevent;
using cuda::CUfunction;
using cuda::CUmodule;
using cuda::CUresult;
using cuda::CUstream;

constexpr std::size_t kMemoryLimit = std::size_t{1} << 30;
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
    std::vector<const void*> host_copies; ///< the host address of every copy, in order
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

/// The fake the entry points act on: the current Scope's.
extern Driver* driver;
std::unique_lock<std::mutex> lock();

/// The fake driver's table.
std::shared_ptr<const agent::CudaApi> api();

/// A fresh fake driver for one test, and its checks when the test is done with it.
struct Scope {
    Driver state;
    std::shared_ptr<const agent::CudaApi> table = api();
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
    /// After a test's device is closed: all released, and no rule of the driver broken.
    void check_closed_cleanly() {
        check_all_released();
        CHECK(violations().empty());
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

} // namespace bitship::test::fake
