// RecyclingAllocator: a block a thread lets go serves that thread's next allocation of the same
// type, up to kKept of them; the rest, and what a thread keeps when it ends, go back to the heap
// (the ASan stage's leak check sees any that did not).
#include <catch2/catch.hpp>

#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "core/recycling_allocator.hpp"

namespace recycling_allocator_test_cpp {

using namespace bitship;

struct Request {
    int value = 0;
    std::vector<int> items{1, 2, 3}; // a member of its own on the heap, freed as usual
};

std::shared_ptr<Request> make(int value) {
    auto r = std::allocate_shared<Request>(RecyclingAllocator<Request>{});
    r->value = value;
    return r;
}

TEST_CASE("a recycled block serves the same thread's next allocation, and holds a fresh object", "[unit]") {
    auto first = make(7);
    const void* block = first.get();
    first.reset();
    auto second = make(8);
    CHECK(static_cast<const void*>(second.get()) == block);
    CHECK(second->value == 8);
    CHECK(second->items == std::vector<int>{1, 2, 3}); // constructed again, not left over
}

TEST_CASE("a thread keeps at most kKept blocks, and more in flight at once come from the heap and go back", "[unit]") {
    constexpr unsigned kKept = RecyclingAllocator<Request>::kKept;
    std::vector<std::shared_ptr<Request>> live;
    for (unsigned i = 0; i < 3 * kKept; ++i) live.push_back(make(static_cast<int>(i)));
    std::set<const void*> blocks;
    for (const auto& r : live) blocks.insert(r.get());
    CHECK(blocks.size() == live.size()); // every live object has a block of its own
    std::set<const void*> kept;
    for (unsigned i = 0; i < kKept; ++i) kept.insert(live[i].get());
    live.clear(); // the first kKept let go are kept, the rest freed
    std::vector<std::shared_ptr<Request>> again;
    unsigned reused = 0;
    for (unsigned i = 0; i < 3 * kKept; ++i) {
        again.push_back(make(static_cast<int>(i)));
        reused += kept.contains(again.back().get());
    }
    CHECK(reused == kKept);
    for (unsigned i = 0; i < again.size(); ++i) CHECK(again[i]->value == static_cast<int>(i));
}

TEST_CASE("a block let go on another thread is kept there, and a thread's kept blocks are freed when it ends", "[unit]") {
    auto made_here = make(1);
    const void* block = made_here.get();
    std::thread other([&] {
        made_here.reset(); // kept by this thread
        auto there = make(2);
        CHECK(static_cast<const void*>(there.get()) == block);
        there.reset(); // kept again, then freed as the thread ends
    });
    other.join();
    auto here = make(3);
    CHECK(here->value == 3);
}

} // namespace recycling_allocator_test_cpp
