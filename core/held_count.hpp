#pragma once
// A count that only the engine's progress token holder writes: a call is dispatched, run by the
// leading worker and answered there. Adding to it is a load and a store, where fetch_add would
// be a locked instruction, one of the costs of a cached call (6 ns alone on the reference VM,
// far more in the middle of one). Readers on other threads read it relaxed as ever.

#include "progress_token.hpp"

#include <atomic>
#include <cassert>
#include <type_traits>

namespace bitship {

/// Adds `n` to `count`; call it only with the progress token held (wraps like fetch_add).
/// Builds with assertions (the ASan one) check that the calling thread holds one.
template <class T> void add_held(std::atomic<T>& count, std::type_identity_t<T> n = 1) noexcept {
    assert(ProgressToken::held_here() &&
           "a count only the progress token's holder writes, written without it");
    count.store(count.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
}

} // namespace bitship
