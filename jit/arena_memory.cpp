// The JIT linker's memory in the arena's zones (see arena_memory.hpp).
#include "arena_memory.hpp"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <system_error>
#include <vector>

#include <fmt/format.h>

#include <llvm/ExecutionEngine/JITLink/JITLink.h>
#include <llvm/ExecutionEngine/Orc/Shared/AllocationActions.h>
#include <llvm/Support/Memory.h>
#include <llvm/Support/Process.h>

namespace bitship::jit {
namespace {

namespace jl = llvm::jitlink;
namespace orc = llvm::orc;

llvm::Error errno_error(const char* what) {
    const std::error_code code(errno, std::generic_category());
    return llvm::createStringError(code, fmt::format("{}: {}", what, code.message()));
}

/// One zone's pages: first-fit over a map of free spans (offset → length), page-granular.
class Zone {
public:
    Zone(std::byte* base, std::size_t size, std::size_t page) : base_(base), size_(size), page_(page) {
        if (size_ > 0) free_.emplace(0, size_);
    }

    /// `bytes` (a multiple of the page) at an offset aligned to `align` (a power of two, at
    /// least a page), mapped read-write; nullptr when no span fits.
    std::byte* take(std::size_t bytes, std::size_t align) {
        std::lock_guard lock(mutex_);
        const auto base = reinterpret_cast<std::uintptr_t>(base_);
        for (auto it = free_.begin(); it != free_.end(); ++it) {
            const std::size_t start = it->first;
            const std::size_t len = it->second;
            const std::size_t at = static_cast<std::size_t>(llvm::alignTo(base + start, align) - base);
            if (at - start > len || bytes > len - (at - start)) continue;
            auto* p = base_ + at;
            if (::mmap(p, bytes, PROT_READ | PROT_WRITE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) == MAP_FAILED)
                return nullptr;
            free_.erase(it);
            if (at > start) free_.emplace(start, at - start);
            if (at + bytes < start + len) free_.emplace(at + bytes, start + len - (at + bytes));
            return p;
        }
        return nullptr;
    }

    /// Gives [p, p + bytes) back: PROT_NONE pages mapped over it (never unmapped), its span
    /// merged with free neighbours.
    void give_back(std::byte* p, std::size_t bytes) noexcept {
        if (bytes == 0) return;
        (void)::mmap(p, bytes, PROT_NONE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        std::lock_guard lock(mutex_);
        std::size_t at = static_cast<std::size_t>(p - base_);
        std::size_t len = bytes;
        auto next = free_.lower_bound(at);
        if (next != free_.end() && next->first == at + len) {
            len += next->second;
            next = free_.erase(next);
        }
        if (next != free_.begin()) {
            auto prev = std::prev(next);
            if (prev->first + prev->second == at) {
                at = prev->first;
                len += prev->second;
                free_.erase(prev);
            }
        }
        free_.emplace(at, len);
    }

    [[nodiscard]] bool contains(const std::byte* p) const { return p >= base_ && p < base_ + size_; }

private:
    std::byte* base_;
    std::size_t size_;
    std::size_t page_;
    std::mutex mutex_;
    std::map<std::size_t, std::size_t> free_;
};

/// A segment's pages, and the zone they came from.
struct Pages {
    Zone* zone = nullptr;
    std::byte* at = nullptr;
    std::size_t bytes = 0;
};

/// The zones live managers use: two managers over one zone would map pages over each other's.
class ZonesInUse {
public:
    bool claim(const CodeZones& z) {
        std::lock_guard lock(mutex_);
        for (const auto& u : used_)
            if (overlaps(u.code, u.code_size, z.code, z.code_size) || overlaps(u.data, u.data_size, z.data, z.data_size) ||
                overlaps(u.code, u.code_size, z.data, z.data_size) || overlaps(u.data, u.data_size, z.code, z.code_size))
                return false;
        used_.push_back(z);
        return true;
    }
    void release(const CodeZones& z) noexcept {
        std::lock_guard lock(mutex_);
        for (auto it = used_.begin(); it != used_.end(); ++it)
            if (it->code == z.code && it->data == z.data) {
                used_.erase(it);
                return;
            }
    }

private:
    static bool overlaps(const std::byte* a, std::size_t an, const std::byte* b, std::size_t bn) {
        return a < b + bn && b < a + an;
    }
    std::mutex mutex_;
    std::vector<CodeZones> used_;
};

ZonesInUse& zones_in_use() {
    static ZonesInUse z;
    return z;
}

class ArenaMemory final : public jl::JITLinkMemoryManager {
public:
    /// `zones` claimed in zones_in_use() by the caller; given back here.
    ArenaMemory(const CodeZones& zones, std::size_t page)
        : zones_(zones), page_(page), code_(zones.code, zones.code_size, page),
          data_(zones.data, zones.data_size, page) {}
    ~ArenaMemory() override { zones_in_use().release(zones_); }
    ArenaMemory(const ArenaMemory&) = delete;
    ArenaMemory& operator=(const ArenaMemory&) = delete;

    void allocate(const jl::JITLinkDylib*, jl::LinkGraph& graph, OnAllocatedFunction on_allocated) override;
    void deallocate(std::vector<FinalizedAlloc> allocs, OnDeallocatedFunction on_deallocated) override;

    /// What a finalized allocation keeps until it is deallocated.
    struct Finalized {
        std::vector<Pages> pages;
        std::vector<orc::shared::WrapperFunctionCall> dealloc_actions;
    };

    static void release(std::vector<Pages>& pages) noexcept {
        for (auto& p : pages) p.zone->give_back(p.at, p.bytes);
        pages.clear();
    }

private:
    class InFlight;

    CodeZones zones_;
    std::size_t page_;
    Zone code_;
    Zone data_;
};

class ArenaMemory::InFlight final : public jl::JITLinkMemoryManager::InFlightAlloc {
public:
    InFlight(jl::LinkGraph& graph, jl::BasicLayout layout, std::vector<Pages> standard, std::vector<Pages> finalize,
             std::size_t page)
        : graph_(&graph), layout_(std::move(layout)), standard_(std::move(standard)), finalize_(std::move(finalize)),
          page_(page) {}

    ~InFlight() override {
        // Neither finalized nor abandoned (a link torn down midway): nothing may leak.
        ArenaMemory::release(standard_);
        ArenaMemory::release(finalize_);
    }

    void finalize(OnFinalizedFunction on_finalized) override {
        // Final permissions first (never W and X together), then the actions (eh-frame
        // registration and the like), which may read the now read-only data.
        if (auto err = protect()) return on_finalized(std::move(err));
        auto dealloc = orc::shared::runFinalizeActions(graph_->allocActions());
        if (!dealloc) return on_finalized(dealloc.takeError());
        ArenaMemory::release(finalize_);
        auto* kept = new Finalized{std::move(standard_), std::move(*dealloc)};
        standard_.clear();
        graph_ = nullptr;
        on_finalized(FinalizedAlloc(orc::ExecutorAddr::fromPtr(kept)));
    }

    void abandon(OnAbandonedFunction on_abandoned) override {
        ArenaMemory::release(finalize_);
        ArenaMemory::release(standard_);
        graph_ = nullptr;
        on_abandoned(llvm::Error::success());
    }

private:
    llvm::Error protect() {
        for (auto& [group, segment] : layout_.segments()) {
            const std::size_t bytes = llvm::alignTo(segment.ContentSize + segment.ZeroFillSize, page_);
            if (bytes == 0) continue;
            const auto flags = orc::toSysMemoryProtectionFlags(group.getMemProt());
            int prot = 0;
            if (flags & llvm::sys::Memory::MF_READ) prot |= PROT_READ;
            if (flags & llvm::sys::Memory::MF_WRITE) prot |= PROT_WRITE;
            if (flags & llvm::sys::Memory::MF_EXEC) prot |= PROT_EXEC;
            if ((prot & PROT_WRITE) && (prot & PROT_EXEC))
                return llvm::make_error<llvm::StringError>("a segment asks to be writable and executable",
                                                           llvm::inconvertibleErrorCode());
            if (::mprotect(segment.WorkingMem, bytes, prot) != 0) return errno_error("mprotect");
            if (prot & PROT_EXEC) llvm::sys::Memory::InvalidateInstructionCache(segment.WorkingMem, bytes);
        }
        return llvm::Error::success();
    }

    jl::LinkGraph* graph_;
    jl::BasicLayout layout_;
    std::vector<Pages> standard_;
    std::vector<Pages> finalize_;
    std::size_t page_;
};

void ArenaMemory::allocate(const jl::JITLinkDylib*, jl::LinkGraph& graph, OnAllocatedFunction on_allocated) {
    jl::BasicLayout layout(graph);
    std::vector<Pages> standard;
    std::vector<Pages> finalize;
    for (auto& [group, segment] : layout.segments()) {
        const std::uint64_t bytes = llvm::alignTo(segment.ContentSize + segment.ZeroFillSize, page_);
        if (bytes == 0) continue;
        const bool exec = (orc::toSysMemoryProtectionFlags(group.getMemProt()) & llvm::sys::Memory::MF_EXEC) != 0;
        Zone& zone = exec ? code_ : data_;
        const std::size_t align = std::max<std::size_t>(segment.Alignment.value(), page_);
        std::byte* at = zone.take(static_cast<std::size_t>(bytes), align);
        if (at == nullptr) {
            release(standard);
            release(finalize);
            return on_allocated(llvm::make_error<jl::JITLinkError>(
                fmt::format("the sandbox's {} zone has no room for {} bytes of graph {}", exec ? "code" : "data", bytes,
                            graph.getName())));
        }
        auto& list = group.getMemLifetime() == orc::MemLifetime::Standard ? standard : finalize;
        list.push_back({&zone, at, static_cast<std::size_t>(bytes)});
        segment.WorkingMem = reinterpret_cast<char*>(at);
        segment.Addr = orc::ExecutorAddr::fromPtr(at);
    }
    if (auto err = layout.apply()) {
        release(standard);
        release(finalize);
        return on_allocated(std::move(err));
    }
    on_allocated(std::make_unique<InFlight>(graph, std::move(layout), std::move(standard), std::move(finalize), page_));
}

void ArenaMemory::deallocate(std::vector<FinalizedAlloc> allocs, OnDeallocatedFunction on_deallocated) {
    llvm::Error errors = llvm::Error::success();
    for (auto& alloc : allocs) {
        std::unique_ptr<Finalized> kept(alloc.release().toPtr<Finalized*>());
        // Last action first, as LLVM's own manager runs them.
        if (auto err = orc::shared::runDeallocActions(kept->dealloc_actions))
            errors = llvm::joinErrors(std::move(errors), std::move(err));
        release(kept->pages);
    }
    on_deallocated(std::move(errors));
}

} // namespace

Result<std::unique_ptr<llvm::jitlink::JITLinkMemoryManager>> make_arena_memory(const CodeZones& zones) {
    const std::size_t page = llvm::sys::Process::getPageSizeEstimate();
    auto aligned = [&](const std::byte* p, std::size_t n) {
        return p != nullptr && n > 0 && reinterpret_cast<std::uintptr_t>(p) % page == 0 && n % page == 0;
    };
    if (!aligned(zones.code, zones.code_size) || !aligned(zones.data, zones.data_size))
        return fail(Errc::invalid_argument, "sandbox code zones must be non-empty and page-aligned");
    if (!zones_in_use().claim(zones))
        return fail(Errc::invalid_argument, "sandbox code zones overlap those of another live JIT");
    return std::unique_ptr<llvm::jitlink::JITLinkMemoryManager>(new ArenaMemory(zones, page));
}

} // namespace bitship::jit
