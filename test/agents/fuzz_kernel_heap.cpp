// libFuzzer target for the kernel heap (agents/kernel_heap.*), the allocator behind sandboxed
// kernels' malloc. The input is a program of heap calls and of writes a kernel makes into the
// heap (over headers, free list links, anything). Beyond "no crash, no sanitizer report": the
// allocator never writes outside its range (a canary page on each side keeps its bytes), every
// block it hands out is 16-byte aligned, inside the range and at least as large as asked, and
// in_use() never passes the quota.
// Built with BITSHIP_FUZZ=ON (clang):  ./build-fuzz/test/agents/fuzz_kernel_heap -max_total_time=60
#include <sys/mman.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernel_heap.hpp"
#include "page_size.hpp"

namespace {

using bitship::agent::kPage;
constexpr std::size_t kQuota = std::size_t{512} << 10; // room for large blocks (> 128 KiB) too
constexpr unsigned char kCanary = 0xa5;

void check(bool ok) {
    if (!ok) std::abort(); // a broken property: libFuzzer saves the input
}

struct Range {
    std::byte* first = nullptr; // canary page, heap range, canary page
    Range() {
        void* p = ::mmap(nullptr, kQuota + 2 * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        check(p != MAP_FAILED);
        first = static_cast<std::byte*>(p);
        std::memset(first, kCanary, kPage);
        std::memset(first + kPage + kQuota, kCanary, kPage);
    }
    [[nodiscard]] std::byte* begin() const { return first + kPage; }
    [[nodiscard]] bool canaries_intact() const {
        static const std::vector<unsigned char> expected(kPage, kCanary);
        return std::memcmp(first, expected.data(), kPage) == 0 &&
               std::memcmp(first + kPage + kQuota, expected.data(), kPage) == 0;
    }
};

// Reads the program's operands; past its end, zeros.
struct Reader {
    const std::uint8_t* data;
    std::size_t size;
    std::size_t at = 0;
    bool done() const { return at >= size; }
    std::uint8_t u8() { return at < size ? data[at++] : 0; }
    std::uint32_t u24() { return u8() | (std::uint32_t{u8()} << 8) | (std::uint32_t{u8()} << 16); }
};

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    static Range range; // one mapping for the process; the heap starts from scratch each input
    std::memset(range.begin(), 0, kQuota);
    bitship::agent::KernelHeap heap(range.begin(), kQuota);
    std::vector<std::byte*> handed;
    Reader in{data, size};

    auto size_operand = [&]() -> std::size_t {
        std::uint8_t scale = in.u8();
        std::uint32_t v = in.u24();
        switch (scale % 4) {
        case 0: return v % 128;
        case 1: return v % 8192;
        case 2: return v % (kQuota + 4096);
        default: return (std::size_t{v} << 40) | v; // absurd
        }
    };
    auto pointer_operand = [&]() -> void* {
        std::uint8_t kind = in.u8();
        if (kind % 3 == 0 && !handed.empty()) return handed[in.u8() % handed.size()];
        if (kind % 3 == 1 && !handed.empty()) return handed[in.u8() % handed.size()] + 16 * (in.u8() % 9) - 64;
        return range.first + in.u24() % (kQuota + 2 * kPage); // anywhere in or around the range
    };
    auto handed_out = [&](void* p, std::size_t n) {
        if (!p) return;
        auto* b = static_cast<std::byte*>(p);
        check(reinterpret_cast<std::uintptr_t>(b) % 16 == 0);
        check(b >= range.begin() && n <= kQuota && b + n <= range.begin() + kQuota);
        check(heap.usable_size(p) >= n);
        handed.push_back(b);
    };

    while (!in.done()) {
        switch (in.u8() % 8) {
        case 0:
        case 1: {
            std::size_t n = size_operand();
            handed_out(heap.allocate(n), n);
            break;
        }
        case 2: (void)heap.release(pointer_operand()); break;
        case 3: {
            void* p = pointer_operand();
            std::size_t n = size_operand();
            void* q = heap.reallocate(p, n);
            if (n) handed_out(q, n);
            break;
        }
        case 4: {
            std::size_t count = in.u8(), each = in.u24() % 4096;
            auto* z = static_cast<unsigned char*>(heap.allocate_zeroed(count, each));
            handed_out(z, count * each);
            static const std::vector<unsigned char> zeros(255 * 4096);
            if (z) check(std::memcmp(z, zeros.data(), count * each) == 0);
            break;
        }
        case 5: { // the kernel writes input bytes into the heap: anywhere, or over a block's header
            std::size_t offset = in.u24() % kQuota;
            if (in.u8() % 2 && !handed.empty())
                offset = static_cast<std::size_t>(handed[in.u8() % handed.size()] - range.begin()) - 16;
            std::size_t n = std::min<std::size_t>(in.u8() % 40, kQuota - offset);
            for (std::size_t i = 0; i < n; ++i) range.begin()[offset + i] = std::byte{in.u8()};
            break;
        }
        case 6: { // the kernel copies one block's header over another place: a plausible forgery
            if (handed.empty()) break;
            std::byte* from = handed[in.u8() % handed.size()] - 16;
            std::size_t to = (in.u24() % kQuota) & ~std::size_t{15};
            if (to + 16 <= kQuota) std::memmove(range.begin() + to, from, 16);
            break;
        }
        default:
            if (in.u8() < 32) {
                heap.reset();
                handed.clear();
            }
        }
        check(heap.in_use() <= kQuota);
        check(range.canaries_intact());
    }
    return 0;
}
