#pragma once
// The kernel heap under xagent --sandbox sfi: malloc/calloc/realloc/free for one call at a time,
// in a range of the arena owned by one thread (so no lock: a kernel stopped in the middle of
// malloc leaves nothing held), with a quota, and reset when the call ends.
//
// The allocator keeps block headers inside its range, where the kernel can overwrite them: it
// checks every address it is about to write against its range and every header it reads, so
// whatever a kernel writes into the heap, the allocator never touches a byte outside it. A free
// list whose links or headers were overwritten is dropped, not followed (its blocks are lost
// until the call ends).
//
// Blocks of up to 128 KiB (header included) come in 47 size classes (16-byte steps up to 128,
// then four per power of two), each with a free list threaded through its freed blocks. Larger
// blocks are page multiples: freed ones go on one first-fit list (split on reuse), and the block
// on top of the bump pointer is given back to it.

#include <cstddef>
#include <cstdint>

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
    /// quota (the old block stays), and when `p` is no live block (nothing changed then: check
    /// usable_size first to tell the two apart).
    void* reallocate(void* p, std::size_t bytes) noexcept;
    /// False when `p` is no live block of this call (a forged, stale or double free): nothing
    /// is changed then. nullptr is a no-op (true).
    bool release(void* p) noexcept;
    /// The bytes usable at `p`, a live block of this call; 0 when it is none (as far as its
    /// header, which the kernel can overwrite, tells).
    [[nodiscard]] std::size_t usable_size(const void* p) const noexcept;
    /// Every block freed; the pages the call touched are given back to the system (small
    /// touched ranges are zeroed instead: cheaper than a page fault per page next call).
    void reset() noexcept;

    [[nodiscard]] std::size_t in_use() const noexcept { return in_use_; }
    [[nodiscard]] std::size_t peak() const noexcept { return peak_; }
    [[nodiscard]] std::size_t quota() const noexcept { return quota_; }
    [[nodiscard]] bool touched() const noexcept { return high_ != 0; }
    [[nodiscard]] const std::byte* begin() const noexcept { return begin_; }

    /// The largest block (header included) served from a size class.
    static constexpr std::size_t kMaxSmallBlock = std::size_t{128} << 10;
    static constexpr unsigned kClasses = 47;

private:
    struct Block { // a header as read once from heap memory, then checked
        std::size_t offset = 0; // of the header, from begin_
        std::size_t size = 0;   // header included
        std::uint32_t cls = 0;
    };
    [[nodiscard]] bool read_live(const void* p, Block& out) const noexcept;
    [[nodiscard]] bool read_free(std::size_t offset, Block& out) const noexcept;
    /// The header at `offset` (already checked to lie in the heap), if it is a well-formed
    /// header of a live (or free) block.
    [[nodiscard]] bool read_header(std::size_t offset, bool live, Block& out) const noexcept;
    /// Points a large free-list link at `value`: the one in the heap at `heap_link`, or
    /// large_free_ when `heap_link` is nullptr (the list's head).
    void relink(std::byte* heap_link, std::size_t value) noexcept;
    [[nodiscard]] bool plausible(std::size_t offset, std::size_t size) const noexcept;
    void write_header(std::size_t offset, std::size_t size, std::uint32_t cls, bool live) noexcept;
    void* take_small(unsigned cls) noexcept;
    void* take_large(std::size_t size) noexcept;
    void* bump(std::size_t size, std::uint32_t cls) noexcept;
    void* hand_out(std::size_t offset, std::size_t size, std::uint32_t cls) noexcept;
    void give_back_large(std::size_t offset, std::size_t size) noexcept;
    void lower_top() noexcept;

    std::byte* begin_;
    std::size_t quota_;
    std::size_t top_ = 0;  // bytes handed out from the bump pointer so far
    std::size_t high_ = 0; // the highest top_ since the last reset: what reset() clears
    std::size_t in_use_ = 0;
    std::size_t peak_ = 0;
    std::size_t free_[kClasses] = {}; // per size class: offset + 1 of the first free block, 0: none
    std::size_t large_free_ = 0;      // offset + 1 of the first free large block, 0: none
};

} // namespace bitship::agent
