#pragma once
// Small message buffers kept per thread for the next messages that thread makes. Each call
// makes a few (the RUN or RESULT encoded, the reply received) and lets each go within
// microseconds on the same thread (the one that progresses), so a kept buffer turns a malloc
// and a free per message into a move (about 150 instructions less a message each side,
// scripts/call_instructions.sh). Two are kept: an agent holds the RUN it received while its
// kernel writes the answer, and with one kept the answer allocated (bench/call_allocations).
// Large buffers are not kept here: ReceiveBuffers keeps rendezvous ones, and a large eager
// message is rare.
//
//   std::vector<std::byte> b = SpareBytes::take();   // empty; its capacity is whatever was kept
//   ...                                              // fill it, send it
//   SpareBytes::give(std::move(b));                   // kept if small, else freed

#include <array>
#include <cstddef>
#include <vector>

namespace bitship {

class SpareBytes {
public:
    /// Buffers of more capacity than this are freed, not kept (UCX's eager limit is ~8 KiB).
    static constexpr std::size_t kMaxKept = std::size_t{8} << 10;

    /// Buffers a thread keeps at most.
    static constexpr std::size_t kKeptBuffers = 2;
    static_assert(kKeptBuffers == 2, "take() and give() choose between two slots");

    /// One of the thread's kept buffers (empty, with its capacity; the roomier one), or an
    /// empty vector.
    static std::vector<std::byte> take() noexcept {
        auto& kept = slots();
        std::vector<std::byte> out;
        out.swap(kept[0].capacity() >= kept[1].capacity() ? kept[0] : kept[1]);
        return out;
    }
    /// Keeps `b` (cleared) for this thread's next take() when it is small and has more room
    /// than one of the buffers kept already (an empty slot has none); it is freed otherwise
    /// (when `b` goes).
    static void give(std::vector<std::byte>&& b) noexcept {
        auto& kept = slots();
        auto& smaller = kept[0].capacity() <= kept[1].capacity() ? kept[0] : kept[1];
        if (b.capacity() > kMaxKept || b.capacity() <= smaller.capacity()) return;
        b.clear();
        smaller.swap(b); // the smaller one kept before goes with `b`
    }

private:
    static std::array<std::vector<std::byte>, kKeptBuffers>& slots() noexcept {
        thread_local std::array<std::vector<std::byte>, kKeptBuffers> kept;
        return kept;
    }
};

} // namespace bitship
