// The progress token counts, per thread, the tokens it holds, so the agent's counts written with
// a load and a store (core/held_count.hpp) can assert they are written by the holder. Only
// builds with assertions keep the count (the ASan build runs this test; others have no such test).

#include "core/progress_token.hpp"

#include <catch2/catch.hpp>
#include <mutex>
#include <thread>

namespace progress_token_test_cpp {

using bitship::ProgressToken;

#ifndef NDEBUG
TEST_CASE("a progress token is held by the thread that locked it and by no other", "[unit]") {
    ProgressToken token, other;
    CHECK_FALSE(ProgressToken::held_here());
    {
        std::unique_lock lock(token);
        CHECK(ProgressToken::held_here());
        bool elsewhere = true, taken = true;
        std::thread([&] {
            elsewhere = ProgressToken::held_here();
            taken = token.try_lock(); // held: refused, and counts nothing
            elsewhere = elsewhere || ProgressToken::held_here();
        }).join();
        CHECK_FALSE(elsewhere);
        CHECK_FALSE(taken);
        lock.unlock();
        CHECK_FALSE(ProgressToken::held_here());
        REQUIRE(lock.try_lock());
        CHECK(ProgressToken::held_here());
        {
            std::lock_guard both(other); // two engines' tokens, released one at a time
            CHECK(ProgressToken::held_here());
        }
        CHECK(ProgressToken::held_here());
    }
    CHECK_FALSE(ProgressToken::held_here());
}
#endif

}  // namespace progress_token_test_cpp
