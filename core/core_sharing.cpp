// CoreSharing: a polling thread that shares its core with its peer moves (core_sharing.hpp).
#include "core_sharing.hpp"

#include <sched.h>

namespace bitship {

bool CoreSharing::yielded(std::chrono::steady_clock::duration off_core, std::chrono::steady_clock::time_point now) {
    if (off_core < kSharedYield) { // nobody else ran: not beside a peer, even just woken
        shared_ = 0;
        woke_ = false;
        return false;
    }
    if (woke_ && ++shared_ >= after_wake_) {
        woke_ = false;
        shared_ = 0;
        last_move_ = now;
        return move_to_another_core() >= 0;
    }
    if (woke_) return false;
    if (shared_ < kSharedYields) ++shared_;
    if (shared_ < kSharedYields || now - last_move_ < kMoveEvery) return false;
    shared_ = 0;
    last_move_ = now;
    return move_to_another_core() >= 0;
}

int move_to_another_core() {
    cpu_set_t allowed;
    CPU_ZERO(&allowed);
    if (::sched_getaffinity(0, sizeof allowed, &allowed) != 0) return -1;
    const int here = ::sched_getcpu();
    if (here < 0 || CPU_COUNT(&allowed) < 2 || !CPU_ISSET(here, &allowed)) return -1;
    cpu_set_t elsewhere = allowed;
    CPU_CLR(here, &elsewhere);
    // The kernel has moved the thread when this returns; restoring the mask does not move it back.
    if (::sched_setaffinity(0, sizeof elsewhere, &elsewhere) != 0) return -1;
    const int there = ::sched_getcpu();
    (void)::sched_setaffinity(0, sizeof allowed, &allowed);
    return there;
}

} // namespace bitship
