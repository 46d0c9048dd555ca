#pragma once
// The client's side of a same-host agent's bulk window (agents/bulk_windows.hpp): shared
// memory the agent made for this session, mapped here by ucp_rkey_ptr. The window is cut
// into equal slots; a RUN takes a free one for its large arguments (written here, read there)
// and offers it for its result (written there, read here), and gives it back when answered.
// Touched only by whoever progresses the client's engine.

#include <cstddef>
#include <cstdint>
#include <optional>

#include <ucp/api/ucp.h>

namespace bitship {

/// Arguments this large or more go through a window slot: smaller ones travel eagerly in the
/// RUN itself, which costs less than the copy into the slot.
inline constexpr std::size_t kWindowArgsMin = 32 << 10;
/// Results this large or more go through the call's slot when it offered one; smaller ones
/// cost less in the message (one eager send).
inline constexpr std::size_t kWindowResultMin = 16 << 10;
/// Slots per window (at most 64: one bit each).
inline constexpr unsigned kWindowSlots = 8;

/// Equal slots of a window, each free or taken (one call's, until it is answered).
class WindowSlots {
public:
    WindowSlots() = default;
    /// `window_bytes` cut into `count` (1..64) slots of whole 64-byte lines.
    WindowSlots(std::size_t window_bytes, unsigned count);
    /// A free slot, now taken; none when all are.
    std::optional<unsigned> take() noexcept;
    /// Gives back a taken slot (a slot not taken, or out of range, is left alone).
    void give_back(unsigned slot) noexcept;
    [[nodiscard]] std::size_t slot_bytes() const noexcept { return slot_bytes_; }
    [[nodiscard]] std::uint64_t offset_of(unsigned slot) const noexcept { return std::uint64_t{slot} * slot_bytes_; }
    [[nodiscard]] unsigned count() const noexcept { return count_; }
    [[nodiscard]] unsigned free_count() const noexcept;

private:
    std::size_t slot_bytes_ = 0;
    unsigned count_ = 0;
    std::uint64_t free_ = 0; ///< bit i: slot i is free
};

/// A peer's window as this client holds it.
struct PeerWindow {
    enum class State {
        none,  ///< not asked for (yet)
        asked, ///< WINDOW sent, REGION_INFO awaited
        ready, ///< mapped here: calls use it
        off,   ///< the agent gave none, or it cannot be mapped here: calls go by UCX alone
    };
    State state = State::none;
    std::uint64_t request = 0;    ///< the WINDOW request awaiting its answer
    std::uint64_t generation = 0; ///< new for every window this client maps (reconnects make new ones)
    ucp_rkey_h rkey = nullptr;    ///< unpacked on the peer's endpoint; destroyed with it
    std::byte* local = nullptr;   ///< where the window is mapped here
    std::size_t size = 0;
    WindowSlots slots;
};

} // namespace bitship
