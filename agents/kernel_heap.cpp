#include "kernel_heap.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>

#include "page_size.hpp"

namespace bitship::agent {
namespace {

// Every block starts with a 16-byte header: its size (header included), its size class and a
// tag saying live or free, mixed with the block's offset so that a header copied elsewhere in
// the heap does not pass for that block's.
constexpr std::size_t kHeader = 16;
constexpr std::size_t kAlign = 16;
constexpr std::size_t kMinBlock = 32; // header + a free list link, rounded to kAlign
constexpr std::uint32_t kLargeClass = 0xffff'ffffU;
constexpr std::uint32_t kLiveTag = 0x6b68'6c76U; // "khlv"
constexpr std::uint32_t kFreeTag = 0x6b68'6672U; // "khfr"
// At most this many large free blocks are looked at per allocation or free: the list is the
// kernel's to overwrite, so no walk may be unbounded (a cycle).
constexpr unsigned kMaxLargeWalk = 256;
// reset(): up to this many touched bytes are zeroed in place; more are given back with madvise
// (a system call and later page faults, worth it only for large ranges).
constexpr std::size_t kZeroInPlace = std::size_t{64} << 10;

constexpr std::size_t class_size_of(unsigned cls) {
    if (cls < 7) return kMinBlock + kAlign * cls; // 32, 48, ..., 128
    unsigned k = cls - 7;
    unsigned lg = 7 + k / 4;
    return (std::size_t{1} << lg) + (k % 4 + 1) * (std::size_t{1} << (lg - 2));
}

constexpr auto kClassSize = [] {
    std::array<std::size_t, KernelHeap::kClasses> sizes{};
    for (unsigned c = 0; c < KernelHeap::kClasses; ++c) sizes[c] = class_size_of(c);
    return sizes;
}();
static_assert(kClassSize[6] == 128 && kClassSize[7] == 160 && kClassSize[10] == 256);
static_assert(kClassSize[KernelHeap::kClasses - 1] == KernelHeap::kMaxSmallBlock);

// `need`: a multiple of kAlign in [kMinBlock, kMaxSmallBlock].
inline unsigned class_of(std::size_t need) noexcept {
    if (need <= 128) return static_cast<unsigned>((need - kMinBlock) / kAlign);
    unsigned lg = 63U - static_cast<unsigned>(std::countl_zero(need - 1));
    std::size_t step_log2 = lg - 2;
    std::size_t sub = (need - (std::size_t{1} << lg) + (std::size_t{1} << step_log2) - 1) >> step_log2; // 1..4
    return 7 + (lg - 7) * 4 + static_cast<unsigned>(sub) - 1;
}

constexpr std::uint32_t tag_for(std::size_t offset, bool live) noexcept {
    return (live ? kLiveTag : kFreeTag) ^ static_cast<std::uint32_t>((offset >> 4) * 0x9e37'79b9U);
}

// Heap memory is the kernel's: any thread's kernel may write it while the allocator reads. Each
// word is read exactly once, and only the checked copy is used.
inline std::uint64_t load64(const std::byte* p) noexcept {
    return __atomic_load_n(reinterpret_cast<const std::uint64_t*>(p), __ATOMIC_RELAXED);
}
inline void store64(std::byte* p, std::uint64_t v) noexcept {
    __atomic_store_n(reinterpret_cast<std::uint64_t*>(p), v, __ATOMIC_RELAXED);
}

} // namespace

KernelHeap::KernelHeap(std::byte* begin, std::size_t quota) noexcept : begin_(begin), quota_(quota & ~(kAlign - 1)) {}

bool KernelHeap::plausible(std::size_t offset, std::size_t size) const noexcept {
    return offset % kAlign == 0 && offset < top_ && size >= kMinBlock && size <= top_ - offset;
}

void KernelHeap::write_header(std::size_t offset, std::size_t size, std::uint32_t cls, bool live) noexcept {
    // Callers pass an offset and size checked by plausible() or made by bump(): inside [0, top_).
    std::byte* h = begin_ + offset;
    store64(h, size);
    std::uint64_t word = std::uint64_t{cls} | (std::uint64_t{tag_for(offset, live)} << 32);
    store64(h + 8, word);
}

bool KernelHeap::read_header(std::size_t offset, bool live, Block& out) const noexcept {
    std::size_t size = load64(begin_ + offset);
    std::uint64_t word = load64(begin_ + offset + 8);
    auto cls = static_cast<std::uint32_t>(word);
    if (static_cast<std::uint32_t>(word >> 32) != tag_for(offset, live) || !plausible(offset, size)) return false;
    if (cls == kLargeClass) {
        if (size % kPage != 0 || size <= kMaxSmallBlock) return false;
    } else if (cls >= kClasses || size != kClassSize[cls]) {
        return false;
    }
    out = {offset, size, cls};
    return true;
}

bool KernelHeap::read_live(const void* p, Block& out) const noexcept {
    auto at = reinterpret_cast<std::uintptr_t>(p);
    auto first = reinterpret_cast<std::uintptr_t>(begin_);
    if (at < first + kHeader || at - first > top_ || (at - first) % kAlign != 0) return false;
    return read_header(at - first - kHeader, true, out);
}

bool KernelHeap::read_free(std::size_t offset, Block& out) const noexcept {
    if (offset % kAlign != 0 || offset >= top_ || top_ - offset < kMinBlock) return false;
    return read_header(offset, false, out);
}

void* KernelHeap::hand_out(std::size_t offset, std::size_t size, std::uint32_t cls) noexcept {
    write_header(offset, size, cls, true);
    // A kernel that overwrote its free lists can be handed one block twice: count at most the
    // range, which is all there is.
    in_use_ = std::min(in_use_ + size, quota_);
    peak_ = std::max(peak_, in_use_);
    return begin_ + offset + kHeader;
}

void* KernelHeap::bump(std::size_t size, std::uint32_t cls) noexcept {
    if (size > quota_ - top_) return nullptr;
    std::size_t offset = top_;
    top_ += size;
    high_ = std::max(high_, top_);
    return hand_out(offset, size, cls);
}

void* KernelHeap::take_small(unsigned cls) noexcept {
    std::size_t head = free_[cls];
    if (head == 0) return nullptr;
    Block b;
    if (!read_free(head - 1, b) || b.cls != cls) {
        free_[cls] = 0; // overwritten: dropped, never followed
        return nullptr;
    }
    free_[cls] = load64(begin_ + b.offset + kHeader); // checked when it is popped in turn
    return hand_out(b.offset, b.size, cls);
}

void* KernelHeap::take_large(std::size_t size) noexcept {
    // `heap_link`: where the current node's offset + 1 is kept (the previous node's payload,
    // which a read_free check put inside the heap), or nullptr for large_free_ itself.
    std::byte* heap_link = nullptr;
    std::size_t next = large_free_;
    for (unsigned steps = 0; next != 0 && steps < kMaxLargeWalk; ++steps) {
        Block b;
        if (!read_free(next - 1, b) || b.cls != kLargeClass) {
            // Corrupt from here on: cut the list.
            relink(heap_link, 0);
            return nullptr;
        }
        std::size_t after = load64(begin_ + b.offset + kHeader);
        if (b.size >= size) {
            std::size_t rest = b.size - size;
            std::size_t replacement = after;
            if (rest > kMaxSmallBlock) { // split: the tail stays on the list in this node's place
                std::size_t tail = b.offset + size;
                write_header(tail, rest, kLargeClass, false);
                store64(begin_ + tail + kHeader, after);
                replacement = tail + 1;
            } else {
                size = b.size;
            }
            relink(heap_link, replacement);
            return hand_out(b.offset, size, kLargeClass);
        }
        heap_link = begin_ + b.offset + kHeader;
        next = after;
    }
    return nullptr;
}

void KernelHeap::relink(std::byte* heap_link, std::size_t value) noexcept {
    if (heap_link) store64(heap_link, value);
    else large_free_ = value;
}

void KernelHeap::lower_top() noexcept {
    // Free large blocks that now end at the top go back to the bump pointer, as far as that goes.
    bool lowered = true;
    while (lowered) {
        lowered = false;
        std::byte* heap_link = nullptr;
        std::size_t next = large_free_;
        for (unsigned steps = 0; next != 0 && steps < kMaxLargeWalk; ++steps) {
            Block b;
            if (!read_free(next - 1, b) || b.cls != kLargeClass) {
                relink(heap_link, 0);
                return;
            }
            std::size_t after = load64(begin_ + b.offset + kHeader);
            if (b.offset + b.size == top_) {
                relink(heap_link, after);
                top_ = b.offset;
                lowered = true;
                break;
            }
            heap_link = begin_ + b.offset + kHeader;
            next = after;
        }
    }
}

void KernelHeap::give_back_large(std::size_t offset, std::size_t size) noexcept {
    if (offset + size == top_) {
        top_ = offset;
        lower_top();
        return;
    }
    write_header(offset, size, kLargeClass, false);
    store64(begin_ + offset + kHeader, large_free_);
    large_free_ = offset + 1;
}

void* KernelHeap::allocate(std::size_t bytes) noexcept {
    if (bytes > quota_) return nullptr;
    std::size_t need = std::max(round_up(bytes + kHeader, kAlign), kMinBlock);
    if (need <= kMaxSmallBlock) {
        unsigned cls = class_of(need);
        if (void* p = take_small(cls)) return p;
        return bump(kClassSize[cls], cls);
    }
    std::size_t size = round_up(need, kPage);
    if (void* p = take_large(size)) return p;
    return bump(size, kLargeClass);
}

void* KernelHeap::allocate_zeroed(std::size_t count, std::size_t size) noexcept {
    std::size_t bytes = 0;
    if (__builtin_mul_overflow(count, size, &bytes)) return nullptr;
    void* p = allocate(bytes);
    if (p) std::memset(p, 0, bytes);
    return p;
}

bool KernelHeap::release(void* p) noexcept {
    if (!p) return true;
    Block b;
    if (!read_live(p, b)) return false;
    in_use_ -= std::min(in_use_, b.size);
    if (b.cls == kLargeClass) {
        give_back_large(b.offset, b.size);
        return true;
    }
    write_header(b.offset, b.size, b.cls, false);
    store64(begin_ + b.offset + kHeader, free_[b.cls]);
    free_[b.cls] = b.offset + 1;
    return true;
}

std::size_t KernelHeap::usable_size(const void* p) const noexcept {
    Block b;
    return read_live(p, b) ? b.size - kHeader : 0;
}

void* KernelHeap::reallocate(void* p, std::size_t bytes) noexcept {
    if (!p) return allocate(bytes);
    Block b;
    if (!read_live(p, b)) return nullptr;
    if (bytes == 0) {
        release(p);
        return nullptr;
    }
    std::size_t usable = b.size - kHeader;
    if (bytes <= usable) return p;
    if (bytes > quota_) return nullptr;
    if (b.cls == kLargeClass && b.offset + b.size == top_) { // on top: grow in place
        std::size_t size = round_up(bytes + kHeader, kPage);
        std::size_t extra = size - b.size;
        if (extra > quota_ - top_) return nullptr;
        top_ += extra;
        high_ = std::max(high_, top_);
        in_use_ -= std::min(in_use_, b.size);
        hand_out(b.offset, size, kLargeClass);
        return p;
    }
    void* q = allocate(bytes);
    if (!q) return nullptr;
    // Both inside [0, top_): p's block was checked, q's is new (memmove: a forged free list may
    // have handed out a block that overlaps p's).
    std::memmove(q, p, usable);
    release(p);
    return q;
}

void KernelHeap::reset() noexcept {
    if (high_ != 0) {
        std::size_t bytes = std::min(round_up(high_, kPage), quota_);
        bool page_aligned = reinterpret_cast<std::uintptr_t>(begin_) % kPage == 0;
        if (bytes <= kZeroInPlace || !page_aligned || ::madvise(begin_, bytes, MADV_DONTNEED) != 0)
            std::memset(begin_, 0, bytes);
    }
    top_ = high_ = in_use_ = peak_ = 0;
    large_free_ = 0;
    std::fill(std::begin(free_), std::end(free_), std::size_t{0});
}

} // namespace bitship::agent
