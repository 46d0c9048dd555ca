// The sandbox arena (agents/sandbox_arena.*): the one range of address space sandboxed kernels
// can reach.
#include <sys/mman.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "kernel_heap.hpp"
#include "sandbox_arena.hpp"

namespace sandbox_arena_test_cpp {

using bitship::Errc;
using namespace bitship::agent;

namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

ArenaOptions small_arena() {
    ArenaOptions o;
    o.size_log2 = 30; // 1 GiB
    o.heap_bytes = 4 * kMiB;
    o.stack_bytes = 1 * kMiB;
    o.call_buffer_bytes = 64 << 10;
    o.max_threads = 3;
    o.jit_data_bytes = 16 * kMiB;
    o.jit_code_bytes = 16 * kMiB;
    return o;
}

struct Mapping {
    std::uintptr_t begin = 0, end = 0;
    std::string perms;
};

std::vector<Mapping> mappings_within(const void* from, std::size_t bytes) {
    auto lo = reinterpret_cast<std::uintptr_t>(from);
    auto hi = lo + bytes;
    std::vector<Mapping> out;
    std::ifstream maps("/proc/self/maps");
    std::string line;
    while (std::getline(maps, line)) {
        std::istringstream in(line);
        std::string range, perms;
        in >> range >> perms;
        Mapping m;
        m.begin = std::stoull(range.substr(0, range.find('-')), nullptr, 16);
        m.end = std::stoull(range.substr(range.find('-') + 1), nullptr, 16);
        m.perms = perms;
        if (m.end > lo && m.begin < hi) out.push_back(m);
    }
    return out;
}

bool inside(std::uintptr_t b, std::uintptr_t e, const void* at, std::size_t n) {
    auto lo = reinterpret_cast<std::uintptr_t>(at);
    return b >= lo && e <= lo + n;
}

} // namespace

TEST_CASE("the sandbox arena is aligned to its size, and contains() takes exactly its bytes", "[unit]") {
    auto arena = SandboxArena::reserve(small_arena());
    REQUIRE(arena.has_value());
    auto& a = **arena;
    const std::size_t size = std::size_t{1} << 30;
    CHECK(a.size() == size);
    CHECK(a.mask() == size - 1);
    CHECK(reinterpret_cast<std::uintptr_t>(a.base()) % size == 0);
    // A confined address: any pointer, masked and based, lands inside.
    auto confine = [&](std::uintptr_t p) { return reinterpret_cast<void*>((p & a.mask()) | reinterpret_cast<std::uintptr_t>(a.base())); };
    CHECK(a.contains(confine(0xdead'beef'cafe'f00dULL), 1));
    CHECK(a.contains(confine(0), 1));

    CHECK(a.contains(a.base(), size));
    CHECK(a.contains(a.base(), 0));
    CHECK(a.contains(a.base() + size - 1, 1));
    CHECK(a.contains(a.base() + size, 0));
    CHECK_FALSE(a.contains(a.base(), size + 1));
    CHECK_FALSE(a.contains(a.base() + size - 1, 2));
    CHECK_FALSE(a.contains(a.base() + size, 1));
    CHECK_FALSE(a.contains(a.base() - 1, 1));
    CHECK_FALSE(a.contains(a.base() + 1, SIZE_MAX));
    CHECK_FALSE(a.contains(nullptr, 0));
    CHECK_FALSE(a.contains(reinterpret_cast<void*>(UINTPTR_MAX), 1));
}

TEST_CASE("the sandbox arena's JIT data lies inside it and its code outside, within 2 GiB", "[unit]") {
    auto arena = SandboxArena::reserve(small_arena());
    REQUIRE(arena.has_value());
    auto& a = **arena;
    auto z = a.zones();
    CHECK(a.contains(z.data, z.data_size));
    CHECK(z.data_size >= 16 * kMiB);
    CHECK(reinterpret_cast<std::uintptr_t>(z.data) % 4096 == 0);
    CHECK(z.data + z.data_size <= a.base() + a.size() - (64 << 10)); // the top guard
    CHECK(z.code >= a.base() + a.size() + 4096);                      // a guard, then code
    CHECK(z.code_size >= 16 * kMiB);
    CHECK(static_cast<std::size_t>(z.code + z.code_size - z.data) <= (std::size_t{2} << 30));
    // Both zones are reserved: mapped, inaccessible, until the JIT maps pages in them.
    for (const auto& m : mappings_within(z.code, z.code_size)) CHECK(m.perms == "---p");
    for (const auto& m : mappings_within(z.data, z.data_size)) CHECK(m.perms == "---p");

    // The default arena (64 GiB, 512 MiB zones) keeps them within reach too.
    auto big = SandboxArena::reserve(ArenaOptions{});
    REQUIRE(big.has_value());
    auto zb = (*big)->zones();
    CHECK(static_cast<std::size_t>(zb.code + zb.code_size - zb.data) <= (std::size_t{2} << 30));
    CHECK((*big)->contains(zb.data, zb.data_size));
}

TEST_CASE("sandbox arena regions are 2 MiB granular, first fit, and reused after release", "[unit]") {
    auto arena = SandboxArena::reserve(small_arena());
    REQUIRE(arena.has_value());
    auto& a = **arena;
    auto r1 = a.allocate_region(1);
    auto r2 = a.allocate_region(3 * kMiB);
    auto r3 = a.allocate_region(kMiB);
    REQUIRE(r1.has_value());
    REQUIRE(r2.has_value());
    REQUIRE(r3.has_value());
    CHECK(*r1 == a.base() + 2 * kMiB); // after the 2 MiB guard at the base
    CHECK(*r2 == *r1 + 2 * kMiB);
    CHECK(*r3 == *r2 + 4 * kMiB);
    for (auto* r : {*r1, *r2, *r3}) CHECK(reinterpret_cast<std::uintptr_t>(r) % (2 * kMiB) == 0);

    // The caller maps a region's pages; release puts PROT_NONE back.
    REQUIRE(::mmap(*r2, 4 * kMiB, PROT_READ | PROT_WRITE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) == *r2);
    std::memset(*r2, 1, 4 * kMiB);
    a.release_region(*r2, 3 * kMiB);
    for (const auto& m : mappings_within(*r2, 4 * kMiB)) CHECK(m.perms == "---p");
    a.release_region(*r2, 3 * kMiB); // twice: ignored
    a.release_region(a.base() + 123, kMiB); // never handed out: ignored

    auto again = a.allocate_region(2 * kMiB);
    REQUIRE(again.has_value());
    CHECK(*again == *r2); // first fit: the freed range
    auto after = a.allocate_region(4 * kMiB);
    REQUIRE(after.has_value());
    CHECK(*after > *r3);

    // Released neighbours merge: r1 and what is left of r2's range make one 4 MiB span.
    a.release_region(*r1, 1);
    a.release_region(*again, 2 * kMiB);
    auto merged = a.allocate_region(4 * kMiB);
    REQUIRE(merged.has_value());
    CHECK(*merged == *r1);

    auto zero = a.allocate_region(0);
    REQUIRE_FALSE(zero.has_value());
    CHECK(zero.error().code == Errc::invalid_argument);
    auto huge = a.allocate_region(std::size_t{1} << 30);
    REQUIRE_FALSE(huge.has_value());
    CHECK(huge.error().code == Errc::too_large);
    CHECK_THAT(huge.error().message, Catch::Contains("no room for a region"));
    auto absurd = a.allocate_region(SIZE_MAX);
    REQUIRE_FALSE(absurd.has_value());
    CHECK(absurd.error().code == Errc::too_large);
}

TEST_CASE("each thread claims its own sandbox area once, until max_threads", "[unit]") {
    auto arena = SandboxArena::reserve(small_arena());
    REQUIRE(arena.has_value());
    auto& a = **arena;
    auto mine = a.this_thread();
    REQUIRE(mine.has_value());
    CHECK(*a.this_thread() == *mine);
    ThreadArea& area = **mine;

    // Its parts lie in the arena and are writable; the stack pointer's home is outside it, where
    // no confined store reaches.
    CHECK(a.contains(area.stack_limit, static_cast<std::size_t>(area.stack_top - area.stack_limit)));
    CHECK_FALSE(a.contains(area.stack, 1));
    CHECK(area.stack->sp == area.stack_top);
    CHECK(area.stack->limit == area.stack_limit);
    CHECK(reinterpret_cast<std::uintptr_t>(area.stack_top) % 16 == 0);
    CHECK(a.contains(area.call_buffer, area.call_buffer_bytes));
    CHECK(area.call_buffer_bytes == (64 << 10));
    CHECK(reinterpret_cast<std::uintptr_t>(area.call_buffer) % 16 == 0);
    REQUIRE(area.heap != nullptr);
    CHECK(area.heap->quota() == 4 * kMiB);
    CHECK(a.contains(area.heap->begin(), area.heap->quota()));
    std::memset(area.stack_limit, 1, static_cast<std::size_t>(area.stack_top - area.stack_limit));
    std::memset(area.call_buffer, 1, area.call_buffer_bytes);
    void* p = area.heap->allocate(1000);
    REQUIRE(p);
    std::memset(p, 1, 1000);
    area.heap->reset();

    // Other threads get other areas; the fourth live thread finds none left.
    std::vector<ThreadArea*> others;
    bitship::Result<ThreadArea*> refused = nullptr;
    std::mutex m;
    std::condition_variable cv;
    bool release = false;
    std::vector<std::thread> threads;
    std::atomic<int> claimed{0};
    for (int i = 0; i < 2; ++i)
        threads.emplace_back([&] {
            auto got = a.this_thread();
            {
                std::lock_guard lock(m);
                if (got) others.push_back(*got);
            }
            ++claimed;
            std::unique_lock lock(m);
            cv.wait(lock, [&] { return release; }); // alive while the next one asks
        });
    while (claimed < 2) std::this_thread::yield();
    std::thread([&] { refused = a.this_thread(); }).join();
    {
        std::lock_guard lock(m);
        release = true;
    }
    cv.notify_all();
    for (auto& t : threads) t.join();
    REQUIRE(others.size() == 2);
    CHECK(others[0] != others[1]);
    CHECK(others[0] != &area);
    CHECK(others[1] != &area);
    CHECK(others[0]->heap != others[1]->heap);
    REQUIRE_FALSE(refused.has_value());
    CHECK(refused.error().code == Errc::too_large);
    CHECK_THAT(refused.error().message, Catch::Contains("3 thread areas are all claimed"));
    CHECK(*a.this_thread() == &area); // this thread keeps its own
}

TEST_CASE("nothing inside the sandbox arena is accessible but what it handed out", "[unit]") {
    auto arena = SandboxArena::reserve(small_arena());
    REQUIRE(arena.has_value());
    auto& a = **arena;
    auto mine = a.this_thread();
    REQUIRE(mine.has_value());
    ThreadArea& area = **mine;
    auto region = a.allocate_region(5 * kMiB);
    REQUIRE(region.has_value());
    REQUIRE(::mmap(*region, 6 * kMiB, PROT_READ | PROT_WRITE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) == *region);

    const std::byte* stack_begin = area.stack_limit;
    std::size_t stack_bytes = static_cast<std::size_t>(area.stack_top - area.stack_limit) + 64;
    std::size_t accessible = 0;
    for (const auto& m : mappings_within(a.base(), a.size())) {
        INFO("mapping " << std::hex << m.begin << "-" << m.end << " " << m.perms);
        if (m.perms == "---p") continue; // reserved (merged with the code zone's guard at the top)
        accessible += m.end - m.begin;
        CHECK((inside(m.begin, m.end, stack_begin, stack_bytes) ||
               inside(m.begin, m.end, area.heap->begin(), area.heap->quota()) ||
               inside(m.begin, m.end, area.call_buffer, area.call_buffer_bytes) || inside(m.begin, m.end, *region, 6 * kMiB)));
    }
    CHECK(accessible == stack_bytes + area.heap->quota() + area.call_buffer_bytes + 6 * kMiB);
    // The base's guard is never mapped: a confined null pointer faults.
    for (const auto& m : mappings_within(a.base(), 2 * kMiB)) CHECK(m.perms == "---p");
}

TEST_CASE("a sandbox arena that cannot be had, or cannot hold its parts, is refused with the reason", "[unit]") {
    ArenaOptions o = small_arena();
    o.size_log2 = 46; // 2 × 64 TiB of address space: more than x86-64's user space
    auto huge = SandboxArena::reserve(o);
    REQUIRE_FALSE(huge.has_value());
    CHECK(huge.error().code == Errc::too_large);
    CHECK_THAT(huge.error().message, Catch::Contains("cannot reserve"));

    o = small_arena();
    o.size_log2 = 12;
    auto tiny = SandboxArena::reserve(o);
    REQUIRE_FALSE(tiny.has_value());
    CHECK(tiny.error().code == Errc::invalid_argument);

    o = small_arena();
    o.max_threads = 200; // 200 × 14 MiB areas in 1 GiB
    auto crowded = SandboxArena::reserve(o);
    REQUIRE_FALSE(crowded.has_value());
    CHECK(crowded.error().code == Errc::invalid_argument);
    CHECK_THAT(crowded.error().message, Catch::Contains("too small for 200 thread areas"));

    o = small_arena();
    o.size_log2 = 36;
    o.jit_data_bytes = std::size_t{1} << 30;
    o.jit_code_bytes = std::size_t{1} << 30;
    auto apart = SandboxArena::reserve(o);
    REQUIRE_FALSE(apart.has_value());
    CHECK(apart.error().code == Errc::invalid_argument);
    CHECK_THAT(apart.error().message, Catch::Contains("2 GiB"));
}

}  // namespace sandbox_arena_test_cpp
