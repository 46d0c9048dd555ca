#pragma once
// An agent's load, carried in the `reserved` field of every RESULT and ERROR header (so it costs
// no message): runs waiting for a worker in the low 16 bits, workers running kernels in the high
// 16 bits, each saturating at 65535. An older agent sends 0 there, which reads as idle.
//
// The client keeps the latest figure per target in an AgentLoadTable: recording one is two
// relaxed atomic stores into a slot found by two loads; no lock, no allocation per reply.

#include "coarse_clock.hpp"
#include "wire.hpp"

#include <array>
#include <atomic>
#include <bitship/client.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>

namespace bitship {

/// Packs a load into a header's `reserved` field (saturating each half).
[[nodiscard]] constexpr std::uint32_t pack_agent_load(std::size_t queued,
                                                      std::size_t busy) noexcept {
    constexpr std::size_t kMax = 0xffff;
    auto q = static_cast<std::uint32_t>(queued < kMax ? queued : kMax);
    auto b = static_cast<std::uint32_t>(busy < kMax ? busy : kMax);
    return q | (b << 16);
}
[[nodiscard]] constexpr std::uint16_t load_queued(std::uint32_t reserved) noexcept {
    return static_cast<std::uint16_t>(reserved & 0xffff);
}
[[nodiscard]] constexpr std::uint16_t load_busy(std::uint32_t reserved) noexcept {
    return static_cast<std::uint16_t>(reserved >> 16);
}

/// The latest load each target (by Target::id()) reported. Any thread may record and read.
/// A reader racing a recorder may see one reply's load with the previous reply's time (the two
/// are separate relaxed stores); either is at most one reply old.
class AgentLoadTable {
public:
    AgentLoadTable() = default;
    ~AgentLoadTable();
    AgentLoadTable(const AgentLoadTable&) = delete;
    AgentLoadTable& operator=(const AgentLoadTable&) = delete;

    /// Target ids this table keeps (ids beyond it are not recorded: load() reads idle).
    static constexpr std::uint64_t kCapacity = std::uint64_t{1} << 20;

    /// Keeps `reserved` (a RESULT/ERROR header's field) as `target`'s load, arrived `at`. The
    /// first record into a block of kBlock targets allocates that block; none after it does.
    void record(std::uint64_t target, std::uint32_t reserved,
                std::chrono::steady_clock::time_point at) noexcept;
    /// record() for a message that just arrived in answer to a call to `target`: RESULT and
    /// ERROR carry the load; other types are ignored. Its time is the coarse clock's (at most
    /// one tick, a few ms, before the reply came; 4 ns a read where steady_clock takes 27 ns,
    /// on every reply), so a load reads a little older than it is, never newer.
    void on_reply(std::uint64_t target, const wire::Header& h) noexcept {
        if (h.type == wire::Type::result || h.type == wire::Type::error)
            record(target, h.reserved, coarse_steady_now());
    }
    [[nodiscard]] AgentLoad load(std::uint64_t target) const noexcept;

private:
    struct Slot {
        std::atomic<std::uint32_t> reserved{0};
        std::atomic<std::int64_t> at_ns{0}; ///< steady_clock since its epoch; 0: no reply yet
    };
    static constexpr std::size_t kBlock = 1024;
    static constexpr std::size_t kBlocks = kCapacity / kBlock;
    using Block = std::array<Slot, kBlock>;
    Slot* slot(std::uint64_t target) const noexcept;
    Slot* make_slot(std::uint64_t target) noexcept;
    std::array<std::atomic<Block*>, kBlocks> blocks_{};
};

} // namespace bitship
