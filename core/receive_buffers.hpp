#pragma once
// Rendezvous receive buffers kept for the next large message. A new std::vector of n bytes is
// zero-filled before UCX writes the message over it: a pass over every byte, about what the
// receive's own copy costs (1 MiB: 80-100 us on this VM, where a 1 MiB call takes under a
// millisecond). A buffer handed back here is taken again at another size without that pass:
// shrinking a vector writes nothing, and growing one within its capacity fills only the
// difference. Whatever a taken buffer held is overwritten by the receive before anything
// reads it (a receive that fails drops its message unread).
//
// Thread-safe: buffers come back wherever a message is let go (an agent's worker, its engine
// thread) and are taken on the progress thread.

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

namespace bitship {

class ReceiveBuffers {
public:
    /// Buffers smaller than this are not kept: an eager message is copied as it is made.
    static constexpr std::size_t kMinKept = 8 << 10;
    /// At most this many buffers, of at most `max_kept_bytes` in all.
    static constexpr std::size_t kMaxKept = 16;

    explicit ReceiveBuffers(std::size_t max_kept_bytes) : max_kept_bytes_(max_kept_bytes) {}

    /// `size` bytes whose contents are unspecified: a kept buffer of that size or more (the
    /// smallest), else one whose capacity holds it, else a new one.
    std::vector<std::byte> take(std::size_t size);
    /// Keeps `buffer` for a later take, within the bounds; otherwise it is freed.
    void give_back(std::vector<std::byte>&& buffer) noexcept;

    [[nodiscard]] std::size_t kept_count() const;
    /// Takes served from a kept buffer.
    [[nodiscard]] std::uint64_t reused() const;

private:
    mutable std::mutex mutex_;
    std::uint64_t reused_ = 0;
    std::vector<std::vector<std::byte>> kept_;
    std::size_t kept_bytes_ = 0; ///< capacity of kept_'s buffers
    std::size_t max_kept_bytes_;
};

} // namespace bitship
