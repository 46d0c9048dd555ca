// Landing slots for large call arguments in the sandbox arena (agents/args_landing.*): where
// the engine receives a split RUN's arguments for a sandboxed kernel to read in place.
#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include <catch2/catch.hpp>

#include "args_landing.hpp"
#include "sandbox_arena.hpp"

namespace args_landing_test_cpp {

using namespace bitship::agent;

namespace {

constexpr std::size_t kSlot = 100'000; // rounded up to whole pages

std::unique_ptr<SandboxArena> small_arena() {
    ArenaOptions o;
    o.size_log2 = 30;
    o.heap_bytes = 1 << 20;
    o.stack_bytes = 1 << 20;
    o.call_buffer_bytes = 64 << 10;
    o.max_threads = 2;
    o.jit_data_bytes = 16 << 20;
    o.jit_code_bytes = 16 << 20;
    auto arena = SandboxArena::reserve(o);
    REQUIRE(arena);
    return std::move(*arena);
}

bool all_zero(std::span<const std::byte> bytes) {
    return std::all_of(bytes.begin(), bytes.end(), [](std::byte b) { return b == std::byte{0}; });
}

} // namespace

TEST_CASE("landing slots lie in the arena, are taken once each, and come back wiped", "[unit]") {
    auto arena = small_arena();
    auto landing = ArgsLanding::create(*arena, 2, kSlot);
    REQUIRE(landing);
    auto& l = **landing;
    CHECK(l.slots() == 2);
    CHECK(l.slot_bytes() == 102'400);

    auto a = l.take(kSlot);
    auto b = l.take(50);
    REQUIRE(a);
    REQUIRE(b);
    CHECK(a->at.size() == kSlot);
    CHECK(b->at.size() == 50);
    CHECK(arena->contains(a->at.data(), a->at.size()));
    CHECK(arena->contains(b->at.data(), b->at.size()));
    CHECK(a->at.data() != b->at.data());
    CHECK(reinterpret_cast<std::uintptr_t>(a->at.data()) % 4096 == 0);
    CHECK_FALSE(l.take(10));       // both slots taken

    std::memset(a->at.data(), 0xab, a->at.size());
    auto* where = a->at.data();
    a.reset(); // the call lets its arguments go: the slot is wiped, and free again
    auto again = l.take(kSlot);
    REQUIRE(again);
    CHECK(again->at.data() == where);
    CHECK(all_zero(again->at));

    // Nothing larger than a slot, and nothing empty, lands.
    again.reset();
    CHECK_FALSE(l.take(l.slot_bytes() + 1));
    CHECK_FALSE(l.take(0));
    CHECK(l.take(l.slot_bytes()));
}

TEST_CASE("a landing slot held past the landing's end is let go without touching its memory", "[unit]") {
    auto arena = small_arena();
    auto landing = ArgsLanding::create(*arena, 1, kSlot);
    REQUIRE(landing);
    auto held = (*landing)->take(1000);
    REQUIRE(held);
    landing->reset(); // its region is PROT_NONE again: a wipe now would fault
    held.reset();
    SUCCEED("let go");
}

TEST_CASE("a landing the arena has no room for is refused, naming why", "[unit]") {
    auto arena = small_arena();
    auto landing = ArgsLanding::create(*arena, 64, std::size_t{64} << 20); // 4 GiB in a 1 GiB arena
    REQUIRE_FALSE(landing);
    CHECK(landing.error().code == bitship::Errc::too_large);
    CHECK_THAT(landing.error().message, Catch::Contains("region"));
    CHECK_FALSE(ArgsLanding::create(*arena, 0, kSlot));
}

TEST_CASE("an agent keeps a landing slot per kernel thread: 4 to 16 of them and 64 MiB at most", "[unit]") {
    constexpr std::size_t kMiB = std::size_t{1} << 20;
    CHECK(ArgsLanding::slots_for(3, kMiB) == 4);    // a 1-worker agent: its worker and leader, and calls queued
    CHECK(ArgsLanding::slots_for(10, kMiB) == 10);
    CHECK(ArgsLanding::slots_for(130, kMiB) == 16);
    CHECK(ArgsLanding::slots_for(10, 16 * kMiB) == 4); // --max-args 16 MiB: 64 MiB in 4
    CHECK(ArgsLanding::slots_for(10, 48 * kMiB) == 1);
    CHECK(ArgsLanding::slots_for(10, 65 * kMiB) == 0); // none that large: the old way
    CHECK(ArgsLanding::slots_for(0, 0) == 4);
}

} // namespace args_landing_test_cpp
