// CoreSharing: a polling thread that keeps yielding its core to another thread moves itself to
// another core of its affinity mask, and leaves the mask as it found it.
#include <catch2/catch.hpp>

#include <sched.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <utility>

#include "core/core_sharing.hpp"

namespace core_sharing_test_cpp {

using namespace bitship;
using namespace std::chrono_literals;

namespace {

cpu_set_t affinity() {
    cpu_set_t set;
    CPU_ZERO(&set);
    REQUIRE(::sched_getaffinity(0, sizeof set, &set) == 0);
    return set;
}

/// Runs `body` on a thread of its own (the test's affinity changes stay there).
template <class F>
void on_thread(F body) {
    std::thread(body).join();
}

} // namespace

TEST_CASE("move_to_another_core moves the thread to another allowed core and keeps its mask") {
    on_thread([] {
        const cpu_set_t before = affinity();
        if (CPU_COUNT(&before) < 2) {
            CHECK(move_to_another_core() == -1);
            return;
        }
        const int here = ::sched_getcpu();
        const int there = move_to_another_core();
        REQUIRE(there >= 0);
        CHECK(there != here);
        CHECK(CPU_ISSET(there, &before));
        cpu_set_t after = affinity();
        CHECK(CPU_EQUAL(&before, &after));
    });
}

TEST_CASE("move_to_another_core does not move a thread pinned to one core") {
    on_thread([] {
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(::sched_getcpu(), &one);
        REQUIRE(::sched_setaffinity(0, sizeof one, &one) == 0);
        CHECK(move_to_another_core() == -1);
        cpu_set_t after = affinity();
        CHECK(CPU_EQUAL(&one, &after));
    });
}

TEST_CASE("CoreSharing moves after kSharedYields shared yields in a row, at most once per kMoveEvery") {
    on_thread([] {
        const cpu_set_t mask = affinity();
        const bool can_move = CPU_COUNT(&mask) >= 2;
        CoreSharing sharing;
        auto now = std::chrono::steady_clock::now() + 1h; // far from the first move's zero time
        const auto shared = CoreSharing::kSharedYield + 3us;
        const auto alone = CoreSharing::kSharedYield / 4;

        // One short of the count, then a yield that ran nobody else: the count starts over.
        for (unsigned i = 1; i < CoreSharing::kSharedYields; ++i) CHECK_FALSE(sharing.yielded(shared, now));
        CHECK_FALSE(sharing.yielded(alone, now));
        for (unsigned i = 1; i < CoreSharing::kSharedYields; ++i) CHECK_FALSE(sharing.yielded(shared, now));
        // The count reached: it moves (where the mask allows another core).
        CHECK(sharing.yielded(shared, now) == can_move);
        // The move helped (a yield alone after it), then shared yields again at once: not
        // within kMoveEvery of the last move.
        CHECK_FALSE(sharing.yielded(alone, now + 1ms));
        for (unsigned i = 0; i < 2 * CoreSharing::kSharedYields; ++i) CHECK_FALSE(sharing.yielded(shared, now + 1ms));
        // Later, it may move again.
        now += CoreSharing::kMoveEvery;
        bool moved = false;
        for (unsigned i = 0; i < CoreSharing::kSharedYields; ++i) moved = sharing.yielded(shared, now) || moved;
        CHECK(moved == can_move);
        cpu_set_t after = affinity();
        CHECK(CPU_EQUAL(&mask, &after));
    });
}

namespace {

/// The pair of an agent's leader and a client's caller, as two threads: each waits for its
/// turn polling, yields its core after 2 µs idle (Engine::kYieldAfter), and tells CoreSharing
/// how long the yield kept it off its core. Both start on one core (a mask of one, widened
/// once they run); on one core a round trip costs 8-11 µs on the 2-core test VM. `woken`:
/// both begin as just woken from a sleep, as a pair does after an idle spell, player 0 with
/// an agent's CoreSharing and player 1 with a client's. Returns the cores they ended on.
std::pair<int, int> ping_pong_from_one_core(const cpu_set_t& mask, int round_trips, bool woken) {
    int first = -1;
    for (int c = 0; c < CPU_SETSIZE && first < 0; ++c)
        if (CPU_ISSET(c, &mask)) first = c;
    std::atomic<int> turn{0};
    std::atomic<int> ready{0};
    std::atomic<bool> widen{false};
    std::atomic<int> cpu[2] = {-1, -1};
    auto player = [&](int me) {
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(first, &one);
        REQUIRE(::sched_setaffinity(0, sizeof one, &one) == 0);
        ready.fetch_add(1);
        while (!widen.load()) std::this_thread::yield();
        REQUIRE(::sched_setaffinity(0, sizeof mask, &mask) == 0); // where it is: still `first`
        CoreSharing sharing(me == 0 ? CoreSharing::kSharedYieldsAfterWake : CoreSharing::kSharedYieldsAfterWakeCaller);
        if (woken) sharing.woke();
        for (int i = 0; i < round_trips; ++i) {
            auto idle_since = std::chrono::steady_clock::now();
            while (turn.load(std::memory_order_acquire) != me) {
                const auto now = std::chrono::steady_clock::now();
                if (now - idle_since < 2us) continue;
                ::sched_yield();
                const auto back = std::chrono::steady_clock::now();
                (void)sharing.yielded(back - now, back);
                idle_since = back;
            }
            turn.store(1 - me, std::memory_order_release);
        }
        cpu[me] = ::sched_getcpu();
    };
    std::thread a(player, 0), b(player, 1);
    while (ready.load() < 2) std::this_thread::yield();
    widen = true;
    a.join();
    b.join();
    return {cpu[0].load(), cpu[1].load()};
}

} // namespace

TEST_CASE("two threads that poll for each other from one core end up on two cores") {
    const cpu_set_t mask = affinity();
    if (CPU_COUNT(&mask) < 2) {
        WARN("not checked: one core");
        return;
    }
    const auto [a, b] = ping_pong_from_one_core(mask, 20'000, false);
    INFO("ended on cores " << a << " and " << b);
    CHECK(a != b);
}

TEST_CASE("an agent's leader and a client's caller just woken beside each other end up on two cores") {
    // Where both moved at their first shared yield after a wake-up, both could see theirs
    // before either had gone and go to the same other core (the only one of two). On the test
    // VM this pair of threads seldom does (one's move ends the other's shared yields first: it
    // passes with both at 1 too); an agent and a client after an idle spell did
    // (bench/results/after_idle_wake_ab_20261202.txt). The rule is checked step by step below.
    const cpu_set_t mask = affinity();
    if (CPU_COUNT(&mask) < 2) {
        WARN("not checked: one core");
        return;
    }
    for (int attempt = 0; attempt < 3; ++attempt) {
        const auto [a, b] = ping_pong_from_one_core(mask, 2'000, true);
        INFO("attempt " << attempt << ": ended on cores " << a << " and " << b);
        CHECK(a != b);
    }
}

TEST_CASE("after a wake-up a client's caller waits for more shared yields than an agent's leader, so the leader moves first") {
    on_thread([] {
        const cpu_set_t mask = affinity();
        const bool can_move = CPU_COUNT(&mask) >= 2;
        STATIC_REQUIRE(CoreSharing::kSharedYieldsAfterWake < CoreSharing::kSharedYieldsAfterWakeCaller);
        STATIC_REQUIRE(CoreSharing::kSharedYieldsAfterWakeCaller < CoreSharing::kSharedYields);
        CoreSharing leader, caller(CoreSharing::kSharedYieldsAfterWakeCaller);
        auto now = std::chrono::steady_clock::now() + 1h;
        const auto shared = CoreSharing::kSharedYield + 3us;
        const auto alone = CoreSharing::kSharedYield / 4;
        leader.woke();
        caller.woke();
        // The pair's yields alternate: the leader's first moves it; the caller's stay put.
        CHECK_FALSE(caller.yielded(shared, now));
        CHECK(leader.yielded(shared, now) == can_move);
        // With the leader gone the caller's next yield is alone: the wake-up is forgotten, and
        // shared yields count to kSharedYields as usual again.
        CHECK_FALSE(caller.yielded(alone, now));
        for (unsigned i = 1; i < CoreSharing::kSharedYields; ++i) CHECK_FALSE(caller.yielded(shared, now));
        // Woken again, and nobody moves away: the caller moves at its own count.
        CoreSharing again(CoreSharing::kSharedYieldsAfterWakeCaller);
        again.woke();
        for (unsigned i = 1; i < CoreSharing::kSharedYieldsAfterWakeCaller; ++i) CHECK_FALSE(again.yielded(shared, now));
        CHECK(again.yielded(shared, now) == can_move);
        cpu_set_t after = affinity();
        CHECK(CPU_EQUAL(&mask, &after));
    });
}

TEST_CASE("after a wake-up kSharedYieldsAfterWake shared yields move at once and a yield alone forgets the wake-up") {
    on_thread([] {
        const cpu_set_t mask = affinity();
        const bool can_move = CPU_COUNT(&mask) >= 2;
        CoreSharing sharing;
        auto now = std::chrono::steady_clock::now() + 1h;
        const auto shared = CoreSharing::kSharedYield + 3us;
        const auto alone = CoreSharing::kSharedYield / 4;
        auto moves_after_wake = [&](std::chrono::steady_clock::time_point at) {
            sharing.woke();
            for (unsigned i = 1; i < CoreSharing::kSharedYieldsAfterWake; ++i) CHECK_FALSE(sharing.yielded(shared, at));
            return sharing.yielded(shared, at);
        };
        STATIC_REQUIRE(CoreSharing::kSharedYieldsAfterWake < CoreSharing::kSharedYields);
        // Woken: kSharedYieldsAfterWake shared yields are enough.
        CHECK(moves_after_wake(now) == can_move);
        // Woken again at once: it moves again, whenever the last move was (a woken thread sits
        // by its waker).
        CHECK(moves_after_wake(now + 10us) == can_move);
        // A yield that ran nobody else after the wake-up: it was not put beside a peer. Shared
        // yields count as usual again, and kMoveEvery holds.
        sharing.woke();
        CHECK_FALSE(sharing.yielded(alone, now + 20us));
        for (unsigned i = 0; i < 2 * CoreSharing::kSharedYields; ++i) CHECK_FALSE(sharing.yielded(shared, now + 30us));
        cpu_set_t after = affinity();
        CHECK(CPU_EQUAL(&mask, &after));
    });
}

}  // namespace core_sharing_test_cpp
