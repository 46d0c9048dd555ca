#include <catch2/catch.hpp>

#include <set>

#include "core/bulk_window.hpp"

namespace bulk_window_test_cpp {

using namespace bitship;

TEST_CASE("a window's slots are taken once each, come back when given back, and never overlap", "[unit]") {
    WindowSlots slots(16u << 20, 8);
    REQUIRE(slots.count() == 8);
    CHECK(slots.slot_bytes() == 2u << 20);
    std::set<std::uint64_t> offsets;
    for (unsigned i = 0; i < 8; ++i) {
        auto s = slots.take();
        REQUIRE(s);
        offsets.insert(slots.offset_of(*s));
        CHECK(slots.offset_of(*s) + slots.slot_bytes() <= 16u << 20);
    }
    CHECK(offsets.size() == 8);
    CHECK_FALSE(slots.take());
    CHECK(slots.free_count() == 0);
    slots.give_back(5);
    slots.give_back(5); // twice: still one slot
    slots.give_back(64); // out of range: ignored
    CHECK(slots.free_count() == 1);
    auto again = slots.take();
    REQUIRE(again);
    CHECK(*again == 5);
}

TEST_CASE("slots are whole 64-byte lines, and a window too small or a count out of range gives none", "[unit]") {
    WindowSlots odd(1000, 3);
    CHECK(odd.slot_bytes() % 64 == 0);
    CHECK(odd.slot_bytes() * 3 <= 1000);
    CHECK(WindowSlots(100, 8).count() == 0);
    CHECK(WindowSlots(1 << 20, 0).count() == 0);
    CHECK(WindowSlots(1 << 20, 65).count() == 0);
    WindowSlots all(64 << 12, 64);
    CHECK(all.free_count() == 64);
}

}  // namespace bulk_window_test_cpp
