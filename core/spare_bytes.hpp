#pragma once
// A small message buffer kept per thread for the next message that thread makes. Each call
// makes a few (the RUN or RESULT encoded, the reply received) and lets each go within
// microseconds on the same thread (the one that progresses), so one kept buffer turns a
// malloc and a free per message into a move (about 150 instructions less a message each side,
// scripts/call_instructions.sh). Large buffers are not kept here: ReceiveBuffers keeps
// rendezvous ones, and a large eager message is rare.
//
//   std::vector<std::byte> b = SpareBytes::take();   // empty; its capacity is whatever was kept
//   ...                                              // fill it, send it
//   SpareBytes::give(std::move(b));                   // kept if small, else freed

#include <cstddef>
#include <vector>

namespace bitship {

class SpareBytes {
public:
    /// Buffers of more capacity than this are freed, not kept (UCX's eager limit is ~8 KiB).
    static constexpr std::size_t kMaxKept = std::size_t{8} << 10;

    /// The thread's kept buffer (empty, with its capacity), or an empty vector.
    static std::vector<std::byte> take() noexcept {
        std::vector<std::byte> out;
        out.swap(slot());
        return out;
    }
    /// Keeps `b` (cleared) for this thread's next take() when it is small and more room than
    /// the buffer kept already; it is freed otherwise (when `b` goes).
    static void give(std::vector<std::byte>&& b) noexcept {
        auto& kept = slot();
        if (b.capacity() > kMaxKept || b.capacity() <= kept.capacity()) return;
        b.clear();
        kept.swap(b); // the smaller one kept before goes with `b`
    }

private:
    static std::vector<std::byte>& slot() noexcept {
        thread_local std::vector<std::byte> kept;
        return kept;
    }
};

} // namespace bitship
