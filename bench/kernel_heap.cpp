// kernel_heap: what malloc and free cost a sandboxed kernel (xagent --sandbox sfi), against the
// agent's own glibc malloc, and what ending a call (KernelHeap::reset) costs after it touched
// so much heap. Three allocators per row set: the KernelHeap alone; the kernel's malloc/free
// exports as the JIT links them (a thread_local, the call's heap, the quota check); glibc.
// No agent, no UCX: one thread, in this process.

#include <sys/mman.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "kernel_heap.hpp"
#include "options.hpp"
#include "runtime.hpp"
#include "sandbox_arena.hpp"
#include "sandbox_runtime.hpp"
#include "stats.hpp"

namespace {

using namespace bitship;
using Clock = std::chrono::steady_clock;

constexpr unsigned kOpsPerSample = 1000;

double micros(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

struct Allocator {
    std::string name;
    void* (*malloc_fn)(std::size_t) = nullptr;
    void (*free_fn)(void*) = nullptr;
};

// 1000 malloc+free pairs of `bytes` (each freed at once), in µs: the same number as ns per pair.
double pairs(const Allocator& a, std::size_t bytes) {
    auto start = Clock::now();
    for (unsigned i = 0; i < kOpsPerSample; ++i) {
        void* p = a.malloc_fn(bytes);
        asm volatile("" : : "r"(p) : "memory");
        a.free_fn(p);
    }
    return micros(Clock::now() - start);
}

// 1000 mallocs of `bytes`, then 1000 frees in reverse, in µs: ns per malloc+free.
double batch(const Allocator& a, std::size_t bytes, std::vector<void*>& held) {
    held.clear();
    auto start = Clock::now();
    for (unsigned i = 0; i < kOpsPerSample; ++i) held.push_back(a.malloc_fn(bytes));
    for (auto it = held.rbegin(); it != held.rend(); ++it) a.free_fn(*it);
    return micros(Clock::now() - start);
}

// The KernelHeap alone, through plain function pointers like the others.
agent::KernelHeap* g_heap = nullptr;
void* heap_malloc(std::size_t n) { return g_heap->allocate(n); }
void heap_free(void* p) { (void)g_heap->release(p); }

} // namespace

int main(int argc, char** argv) {
    bench::Options options{"malloc/free cost of the sandboxed kernel heap against glibc, and the cost of a call's reset"};
    unsigned repetitions = 300, warmup = 20;
    std::size_t heap_mib = 64;
    std::string csv;
    options.add("--repetitions", repetitions, "samples per row (each: 1000 operations)");
    options.add("--warmup", warmup, "samples thrown away first");
    options.add("--heap-mib", heap_mib, "the kernel heap's quota (xagent --kernel-heap-mib)");
    options.add("--csv", csv, "write the rows here");
    if (auto status = options.parse(argc, argv)) return *status;

    agent::ArenaOptions arena_options;
    arena_options.heap_bytes = heap_mib << 20;
    arena_options.max_threads = 1;
    auto arena = agent::SandboxArena::reserve(arena_options);
    if (!arena) {
        fmt::print(stderr, "{}\n", arena.error().describe());
        return 1;
    }
    auto area = (*arena)->this_thread();
    if (!area) {
        fmt::print(stderr, "{}\n", area.error().describe());
        return 1;
    }
    g_heap = (*area)->heap;
    void* (*sandboxed_malloc)(std::size_t) = nullptr;
    void (*sandboxed_free)(void*) = nullptr;
    for (const auto& e : agent::sandboxed_exports(**arena)) {
        if (e.name == "malloc") sandboxed_malloc = reinterpret_cast<void* (*)(std::size_t)>(e.address);
        if (e.name == "free") sandboxed_free = reinterpret_cast<void (*)(void*)>(e.address);
    }
    bs_ctx ctx;
    if (auto entered = agent::SandboxedCall::enter(**arena, ctx); !entered) {
        fmt::print(stderr, "{}\n", entered.error().describe());
        return 1;
    }

    const std::vector<Allocator> allocators = {
        {"kernel_heap", &heap_malloc, &heap_free},
        {"sandboxed_export", sandboxed_malloc, sandboxed_free},
        {"glibc", &std::malloc, &std::free},
    };
    const std::vector<std::size_t> sizes = {16, 64, 256, 4096, 65536, std::size_t{1} << 20};

    fmt::print("kernel_heap: {} | one thread | quota {} MiB | {} samples per row after {} warm-up, each {} operations: "
               "a sample in us is ns per malloc+free\n\n",
               bench::cpu_description(), heap_mib, repetitions, warmup, kOpsPerSample);
    fmt::print("{:<18} {:<8} {:>9} {:>14} {:>14} {:>10}\n", "allocator", "pattern", "bytes", "median ns/op", "p99 ns/op",
               "min");
    std::vector<bench::Row> rows;
    std::vector<void*> held;
    held.reserve(kOpsPerSample);
    for (const auto& a : allocators) {
        for (const char* pattern : {"pair", "batch"}) {
            for (std::size_t bytes : sizes) {
                if (std::string_view(pattern) == "batch" && bytes >= 65536) continue; // 1000 × 64 KiB: past the quota
                std::vector<double> samples;
                for (unsigned r = 0; r < warmup + repetitions; ++r) {
                    double us = std::string_view(pattern) == "pair" ? pairs(a, bytes) : batch(a, bytes, held);
                    if (r >= warmup) samples.push_back(us);
                }
                auto s = bench::summarise(samples);
                fmt::print("{:<18} {:<8} {:>9} {:>14.1f} {:>14.1f} {:>10.1f}\n", a.name, pattern, bytes, s.median, s.p99,
                           s.min);
                rows.push_back({{{"allocator", a.name}, {"pattern", pattern}, {"bytes", std::to_string(bytes)}}, s, {}});
            }
        }
    }

    // A call's end: the heap given back after the call touched `bytes` of it.
    fmt::print("\n{:<18} {:>12} {:>12} {:>12}\n", "reset after", "median us", "p99 us", "min us");
    for (std::size_t touched : {std::size_t{4096}, std::size_t{64} << 10, std::size_t{1} << 20, std::size_t{16} << 20}) {
        if (touched > (heap_mib << 20)) continue;
        std::vector<double> samples;
        for (unsigned r = 0; r < warmup + repetitions; ++r) {
            void* p = g_heap->allocate(touched - 64);
            if (!p) break;
            std::memset(p, 1, touched - 64);
            auto start = Clock::now();
            g_heap->reset();
            if (r >= warmup) samples.push_back(micros(Clock::now() - start));
        }
        auto s = bench::summarise(samples);
        fmt::print("{:<18} {:>12.2f} {:>12.2f} {:>12.2f}\n", fmt::format("{} KiB", touched >> 10), s.median, s.p99, s.min);
        rows.push_back({{{"allocator", "kernel_heap_reset"}, {"pattern", "reset"}, {"bytes", std::to_string(touched)}}, s, {}});
    }
    agent::SandboxedCall::leave();
    if (!csv.empty()) bench::write_csv(csv, rows);
    return 0;
}
