// IdTable (the client's calls in flight by request id) and ByteWriter/SpareBytes (the message
// buffers): they behave as the unordered_map and the vector they stand in for, wherever an id
// lands (the ring, or the overflow when its slot is taken) and whatever size a message has.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "core/byte_io.hpp"
#include "core/id_table.hpp"
#include "core/spare_bytes.hpp"

namespace id_table_test_cpp {

using namespace bitship;
using Table = IdTable<std::shared_ptr<int>>;

std::map<std::uint64_t, int> contents(Table& t) {
    std::map<std::uint64_t, int> out;
    for (auto& [id, v] : t) out[id] = *v;
    return out;
}

TEST_CASE("ids that share a ring slot are all kept, found and erased") {
    Table t;
    const std::uint64_t a = 5, b = 5 + Table::kSlots, c = 5 + 3 * Table::kSlots; // one slot
    t[a] = std::make_shared<int>(1);
    t[b] = std::make_shared<int>(2);
    t[c] = std::make_shared<int>(3);
    REQUIRE(t.find(a) != t.end());
    REQUIRE(t.find(b) != t.end());
    REQUIRE(t.find(c) != t.end());
    CHECK(*t.find(b)->second == 2);
    CHECK(t.find(a)->first == a);
    CHECK(t.find(5 + 2 * Table::kSlots) == t.end());
    CHECK(contents(t) == std::map<std::uint64_t, int>{{a, 1}, {b, 2}, {c, 3}});
    CHECK(t.erase(a) == 1);
    CHECK(t.erase(a) == 0);
    CHECK(!t.contains(a));
    CHECK(*t.find(c)->second == 3); // overflowed ones are still found with their slot free
    // A later id for the freed slot takes it; the overflowed ones stay where they are.
    t[a + 4 * Table::kSlots] = std::make_shared<int>(4);
    CHECK(contents(t) == std::map<std::uint64_t, int>{{b, 2}, {c, 3}, {a + 4 * Table::kSlots, 4}});
    t.clear();
    CHECK(t.begin() == t.end());
    CHECK(!t.contains(b));
}

TEST_CASE("id 0 is kept too, though it marks a free slot in the ring") {
    Table t;
    t[0] = std::make_shared<int>(9);
    CHECK(t.contains(0));
    CHECK(*t.find(0)->second == 9);
    CHECK(contents(t) == std::map<std::uint64_t, int>{{0, 9}});
    CHECK(t.erase(0) == 1);
    CHECK(t.begin() == t.end());
}

TEST_CASE("erasing while iterating visits every entry once, in the ring and the overflow") {
    Table t;
    std::map<std::uint64_t, int> expected;
    std::mt19937_64 rng(42);
    for (int i = 0; i < 3000; ++i) { // more than the ring holds: many overflow
        const std::uint64_t id = rng() % (8 * Table::kSlots) + 1;
        t[id] = std::make_shared<int>(i);
        expected[id] = i;
    }
    CHECK(contents(t) == expected);
    // Erase every odd id through the iterator, as the client's deadline sweep does.
    std::map<std::uint64_t, int> seen;
    for (auto it = t.begin(); it != t.end();) {
        seen[it->first] = *it->second;
        if (it->first % 2) it = t.erase(it);
        else ++it;
    }
    CHECK(seen == expected);
    std::erase_if(expected, [](const auto& kv) { return kv.first % 2 != 0; });
    CHECK(contents(t) == expected);
    for (const auto& [id, v] : expected) CHECK(t.contains(id));
}

TEST_CASE("an erased entry lets its value go at once") {
    Table t;
    auto v = std::make_shared<int>(1);
    t[7] = v;
    t[7 + Table::kSlots] = v;
    CHECK(v.use_count() == 3);
    t.erase(7);
    t.erase(7 + Table::kSlots);
    CHECK(v.use_count() == 1);
}

TEST_CASE("a message written field by field reads back the same whatever its size") {
    // Small messages go into the room reserve() makes ready; past it (or past kSlackMax), the
    // writer appends. Both give the same bytes.
    for (std::size_t blob : {std::size_t{0}, std::size_t{3}, std::size_t{100}, ByteWriter::kSlackMax, std::size_t{70000}}) {
        for (bool reserve : {false, true}) {
            std::vector<std::byte> bytes(blob);
            for (std::size_t i = 0; i < blob; ++i) bytes[i] = std::byte(i * 7);
            ByteWriter w;
            if (reserve) w.reserve(2 + 8 + 4 + blob + 16);
            w.u16(0xbeef);
            w.u64(0x0102030405060708);
            w.blob32(bytes);
            w.align(16);
            w.u8(0x5a);
            const auto at = w.size();
            w.u64(0);
            w.patch_u64(at, 77);
            auto out = std::move(w).take();
            REQUIRE(out.size() == at + 8);
            ByteReader r(out);
            CHECK(r.u16() == 0xbeef);
            CHECK(r.u64() == 0x0102030405060708u);
            auto got = r.blob32();
            REQUIRE(got);
            CHECK(std::equal(got->begin(), got->end(), bytes.begin(), bytes.end()));
            REQUIRE(r.align(16));
            for (std::size_t i = 2 + 8 + 4 + blob; i < r.position(); ++i) CHECK(out[i] == std::byte{0}); // padding
            CHECK(r.u8() == 0x5a);
            CHECK(r.u64() == 77u);
            CHECK(r.remaining() == 0);
        }
    }
}

TEST_CASE("a thread's spare message buffer is taken again empty, and large ones are not kept") {
    for (std::size_t i = 0; i < SpareBytes::kKeptBuffers; ++i) SpareBytes::take(); // whatever this thread kept before
    std::vector<std::byte> small(200, std::byte{1});
    const auto* at = small.data();
    SpareBytes::give(std::move(small));
    auto again = SpareBytes::take();
    CHECK(again.empty());
    CHECK(again.data() == at);
    CHECK(again.capacity() >= 200);
    CHECK(SpareBytes::take().capacity() == 0); // taken once
    SpareBytes::give(std::vector<std::byte>(SpareBytes::kMaxKept + 1));
    CHECK(SpareBytes::take().capacity() == 0);
    // Two are kept, the roomier taken first; a third (smaller than both) is freed.
    std::vector<std::byte> a(100), b(300), c(50);
    const auto* a_at = a.data();
    const auto* b_at = b.data();
    SpareBytes::give(std::move(a));
    SpareBytes::give(std::move(b));
    SpareBytes::give(std::move(c));
    CHECK(SpareBytes::take().data() == b_at);
    CHECK(SpareBytes::take().data() == a_at);
    CHECK(SpareBytes::take().capacity() == 0);
    // A writer on this thread starts from the kept buffer.
    SpareBytes::give(std::move(again));
    ByteWriter w;
    w.reserve(16);
    w.u64(1);
    CHECK(std::move(w).take().data() == at);
}

} // namespace id_table_test_cpp
