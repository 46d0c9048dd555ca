#include "sandbox_arena.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <new>

#include <fmt/format.h>

#include "kernel_heap.hpp"
#include "page_size.hpp"

namespace bitship::agent {
namespace {

constexpr std::size_t kGranule = std::size_t{2} << 20; // guards, regions and area parts
constexpr std::size_t kTopGuard = std::size_t{64} << 10;
constexpr std::size_t kCodeGuard = kGranule;           // between the arena's end and the code zone
constexpr std::size_t kCodeReach = std::size_t{2} << 30; // PC-relative reach of code model small
constexpr unsigned kMinSizeLog2 = 26;                  // 64 MiB
constexpr unsigned kMaxSizeLog2 = 46;                  // 64 TiB: half of x86-64's user space
// Room left above the unsafe stack's top (the first frame's alignment slack).
constexpr std::size_t kStackHeadroom = 64;

constexpr std::size_t mib(std::size_t bytes) noexcept { return bytes >> 20; }

std::atomic<std::uint64_t> g_next_arena_id{1};

// The arena whose area this thread used last: one compare on every call after the first.
struct ThreadClaim {
    std::uint64_t arena_id = 0;
    ThreadArea* area = nullptr;
};
thread_local ThreadClaim t_claim;

// Inside the reservation: replaces whatever is at [at, at + bytes) with fresh pages.
bool map_fixed(std::byte* at, std::size_t bytes, int prot) noexcept {
    void* p = ::mmap(at, bytes, prot, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == at;
}

// One thread area's parts, as offsets from the area's start (its leading guard).
struct AreaLayout {
    std::size_t stack = 0, stack_bytes = 0;
    std::size_t heap = 0, heap_bytes = 0;
    std::size_t call_buffer = 0, call_buffer_bytes = 0;
    std::size_t stride = 0;
};

AreaLayout area_layout(const ArenaOptions& o) {
    AreaLayout a;
    a.stack_bytes = round_up(o.stack_bytes + kStackHeadroom, kGranule);
    a.heap_bytes = round_up(std::max<std::size_t>(o.heap_bytes, 1), kGranule);
    a.call_buffer_bytes = round_up(std::max<std::size_t>(o.call_buffer_bytes, 1), kGranule);
    a.stack = kGranule;
    a.heap = a.stack + a.stack_bytes + kGranule;
    a.call_buffer = a.heap + a.heap_bytes + kGranule;
    a.stride = a.call_buffer + a.call_buffer_bytes;
    return a;
}

} // namespace

Result<std::unique_ptr<SandboxArena>> SandboxArena::reserve(const ArenaOptions& options) {
    if (options.size_log2 < kMinSizeLog2 || options.size_log2 > kMaxSizeLog2)
        return fail(Errc::invalid_argument, fmt::format("sandbox arena of 2^{} bytes: the size must be 2^{} to 2^{}",
                                                        options.size_log2, kMinSizeLog2, kMaxSizeLog2));
    if (options.max_threads == 0)
        return fail(Errc::invalid_argument, "sandbox arena for 0 threads: at least one thread must run kernels");
    const std::size_t size = std::size_t{1} << options.size_log2;
    // Each size is checked against the arena's before it is rounded, so nothing overflows.
    for (std::size_t part : {options.heap_bytes, options.stack_bytes, options.call_buffer_bytes, options.jit_data_bytes,
                             options.jit_code_bytes})
        if (part > size)
            return fail(Errc::invalid_argument,
                        fmt::format("sandbox arena of {} MiB cannot hold a part of {} MiB", mib(size), mib(part)));

    // 1. The layout, as offsets from the base.
    const AreaLayout area = area_layout(options);
    const std::size_t data_bytes = round_up(std::max<std::size_t>(options.jit_data_bytes, 1), kGranule);
    const std::size_t code_bytes = round_up(std::max<std::size_t>(options.jit_code_bytes, 1), kGranule);
    if (kTopGuard + data_bytes + kCodeGuard + code_bytes > kCodeReach)
        return fail(Errc::invalid_argument,
                    fmt::format("sandbox JIT zones of {} MiB data and {} MiB code are more than 2 GiB apart end to end: "
                                "code could not reach its data PC-relatively",
                                mib(data_bytes), mib(code_bytes)));
    const std::size_t data_begin = size - kTopGuard - data_bytes;
    const std::size_t areas_end = data_begin / kGranule * kGranule - kGranule; // a guard before the data
    const std::size_t areas_bytes = std::size_t{options.max_threads} * area.stride;
    const std::size_t regions_begin = kGranule;
    if (data_begin < kGranule * 2 || areas_end < regions_begin + kGranule + areas_bytes)
        return fail(Errc::invalid_argument,
                    fmt::format("sandbox arena of {} MiB is too small for {} thread areas of {} MiB each and {} MiB of "
                                "JIT data, with room for regions",
                                mib(size), options.max_threads, mib(area.stride), mib(data_bytes)));
    const std::size_t areas_begin = areas_end - areas_bytes;

    // 2. Address space: twice the arena, so that a size-aligned arena fits, plus the code zone.
    const std::size_t tail = kCodeGuard + code_bytes;
    const std::size_t reserve_bytes = 2 * size + tail;
    void* p = ::mmap(nullptr, reserve_bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        int err = errno;
        return fail(Errc::too_large,
                    fmt::format("cannot reserve {} GiB of address space for the sandbox arena (2^{} bytes, aligned to "
                                "its size, and its code zone): {}; choose a smaller arena or raise the address-space "
                                "limit (ulimit -v)",
                                reserve_bytes >> 30, options.size_log2, std::strerror(err)));
    }
    auto* first = static_cast<std::byte*>(p);
    auto start = reinterpret_cast<std::uintptr_t>(first);
    auto* base = reinterpret_cast<std::byte*>(round_up(start, size));
    // 3. Trim to [base, base + size + tail): nothing else of the reservation stays.
    if (base > first) ::munmap(first, static_cast<std::size_t>(base - first));
    std::byte* end = base + size + tail;
    if (end < first + reserve_bytes) ::munmap(end, static_cast<std::size_t>(first + reserve_bytes - end));

    std::unique_ptr<SandboxArena> arena(new SandboxArena);
    arena->options_ = options;
    arena->reservation_ = base;
    arena->reservation_size_ = size + tail;
    arena->base_ = base;
    arena->size_ = size;
    arena->zones_ = jit::CodeZones{base + data_begin, data_bytes, base + size + kCodeGuard, code_bytes};
    arena->regions_begin_ = regions_begin;
    arena->regions_end_ = areas_begin;
    arena->free_regions_.push_back({regions_begin, areas_begin - regions_begin});
    arena->areas_begin_ = areas_begin;
    arena->area_stride_ = area.stride;
    arena->id_ = g_next_arena_id.fetch_add(1, std::memory_order_relaxed);
    return arena;
}

SandboxArena::~SandboxArena() {
    if (reservation_) ::munmap(reservation_, reservation_size_);
}

Result<std::byte*> SandboxArena::allocate_region(std::size_t bytes) {
    if (bytes == 0) return fail(Errc::invalid_argument, "a region of 0 bytes");
    std::lock_guard lock(mutex_);
    const std::size_t zone = regions_end_ - regions_begin_;
    if (bytes <= zone) {
        const std::size_t want = round_up(bytes, kGranule);
        for (auto it = free_regions_.begin(); it != free_regions_.end(); ++it) {
            if (it->size < want) continue;
            std::size_t offset = it->offset;
            it->offset += want;
            it->size -= want;
            if (it->size == 0) free_regions_.erase(it);
            used_regions_.emplace(offset, want);
            return base_ + offset;
        }
    }
    std::size_t free_bytes = 0, largest = 0;
    for (const auto& s : free_regions_) {
        free_bytes += s.size;
        largest = std::max(largest, s.size);
    }
    return fail(Errc::too_large,
                fmt::format("the sandbox arena has no room for a region of {} bytes: its regions' zone of {} MiB has {} "
                            "MiB free, {} MiB at most in one piece (start the agent with a larger arena)",
                            bytes, mib(zone), mib(free_bytes), mib(largest)));
}

void SandboxArena::release_region(std::byte* at, std::size_t /*bytes*/) noexcept {
    std::lock_guard lock(mutex_);
    if (at < base_ || at >= base_ + size_) return;
    auto used = used_regions_.find(static_cast<std::size_t>(at - base_));
    if (used == used_regions_.end()) return;
    Span span{used->first, used->second};
    used_regions_.erase(used);
    // Fresh PROT_NONE pages in its place: the range stays reserved, and its old contents are gone.
    map_fixed(at, span.size, PROT_NONE);
    auto next = std::lower_bound(free_regions_.begin(), free_regions_.end(), span.offset,
                                 [](const Span& s, std::size_t offset) { return s.offset < offset; });
    next = free_regions_.insert(next, span);
    if (auto after = next + 1; after != free_regions_.end() && next->offset + next->size == after->offset) {
        next->size += after->size;
        free_regions_.erase(after);
    }
    if (next != free_regions_.begin()) {
        auto before = next - 1;
        if (before->offset + before->size == next->offset) {
            before->size += next->size;
            free_regions_.erase(next);
        }
    }
}

Result<ThreadArea*> SandboxArena::this_thread() {
    if (t_claim.arena_id == id_) return t_claim.area;
    const auto me = std::this_thread::get_id();
    std::lock_guard lock(mutex_);
    for (std::size_t i = 0; i < owners_.size(); ++i)
        if (owners_[i] == me) {
            t_claim = {id_, areas_[i].get()};
            return t_claim.area;
        }
    if (areas_.size() >= options_.max_threads)
        return fail(Errc::too_large, fmt::format("the sandbox arena's {} thread areas are all claimed: no more threads "
                                                 "can run kernels in it",
                                                 options_.max_threads));
    // Each part's slot is 2 MiB granular; only the pages the options ask for are mapped in it
    // (the stack's at the slot's top, where it starts), the rest stays guard.
    const AreaLayout layout = area_layout(options_);
    std::byte* at = base_ + areas_begin_ + areas_.size() * area_stride_;
    const std::size_t stack_bytes = round_up(options_.stack_bytes + kStackHeadroom, kPage);
    const std::size_t heap_bytes = round_up(options_.heap_bytes, kPage);
    const std::size_t call_buffer_bytes = round_up(options_.call_buffer_bytes, kPage);
    std::byte* stack = at + layout.stack + layout.stack_bytes - stack_bytes;
    std::byte* heap = at + layout.heap;
    std::byte* call_buffer = at + layout.call_buffer;
    if (!map_fixed(stack, stack_bytes, PROT_READ | PROT_WRITE) || !map_fixed(heap, heap_bytes, PROT_READ | PROT_WRITE) ||
        !map_fixed(call_buffer, call_buffer_bytes, PROT_READ | PROT_WRITE)) {
        int err = errno;
        map_fixed(at, area_stride_, PROT_NONE);
        return fail(Errc::too_large, fmt::format("cannot map a sandbox thread area of {} MiB: {}", mib(area_stride_),
                                                 std::strerror(err)));
    }
    // The heap quota is the option's, not its 2 MiB rounding: a call gets what the operator said.
    heaps_.push_back(std::make_unique<KernelHeap>(heap, options_.heap_bytes));
    auto area = std::make_unique<ThreadArea>();
    area->stack_limit = stack;
    area->stack_top = stack + stack_bytes - kStackHeadroom;
    area->unsafe_stack = jit::UnsafeStack{area->stack_top, area->stack_limit};
    area->stack = &area->unsafe_stack;
    area->call_buffer = call_buffer;
    area->call_buffer_bytes = options_.call_buffer_bytes;
    area->heap = heaps_.back().get();
    areas_.push_back(std::move(area));
    owners_.push_back(me);
    t_claim = {id_, areas_.back().get()};
    return t_claim.area;
}

} // namespace bitship::agent
