#pragma once
// The kernel heap under xagent --sandbox sfi: malloc/calloc/realloc/free for one call at a time,
// in a range of the arena owned by one thread (so no lock: a kernel stopped in the middle of
// malloc leaves nothing held), with a quota, and reset when the call ends.
//
// The allocator keeps block headers inside its range, where the kernel can overwrite them: it
// checks every address it is about to write against its range and every header it reads, so
// whatever a kernel writes into the heap, the allocator never touches a byte outside it.

#include <cstddef>

namespace bitship::agent {

class KernelHeap {
public:
    /// `begin`: `quota` bytes, readable and writable (MAP_NORESERVE), 64-byte aligned.
    KernelHeap(std::byte* begin, std::size_t quota) noexcept;
    KernelHeap(const KernelHeap&) = delete;
    KernelHeap& operator=(const KernelHeap&) = delete;

    /// 16-byte aligned; nullptr when `bytes` would take the call past its quota.
    void* allocate(std::size_t bytes) noexcept;
    /// Zeroed; nullptr on overflow of count × size or past the quota.
    void* allocate_zeroed(std::size_t count, std::size_t size) noexcept;
    /// C realloc: nullptr `p` allocates, `bytes` 0 frees (returns nullptr). nullptr past the
    /// quota (the old block stays).
    void* reallocate(void* p, std::size_t bytes) noexcept;
    /// False when `p` is no live block of this call (a forged, stale or double free): nothing
    /// is changed then. nullptr is a no-op (true).
    bool release(void* p) noexcept;
    /// Every block freed; the pages the call touched are given back to the system.
    void reset() noexcept;

    [[nodiscard]] std::size_t in_use() const noexcept { return in_use_; }
    [[nodiscard]] std::size_t peak() const noexcept { return peak_; }
    [[nodiscard]] std::size_t quota() const noexcept { return quota_; }
    [[nodiscard]] bool touched() const noexcept { return top_ != 0; }

private:
    std::byte* begin_;
    std::size_t quota_;
    std::size_t top_ = 0; // bytes handed out from the bump pointer so far
    std::size_t in_use_ = 0;
    std::size_t peak_ = 0;
    static constexpr unsigned kClasses = 48;
    std::size_t free_[kClasses] = {}; // per size class: offset + 1 of the first free block, 0: none
};

} // namespace bitship::agent
