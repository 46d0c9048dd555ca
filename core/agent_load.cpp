#include "agent_load.hpp"

#include "client_impl.hpp"

#include <new>

namespace bitship {

AgentLoadTable::~AgentLoadTable() {
    for (auto& b : blocks_)
        delete b.load(std::memory_order_relaxed);
}

AgentLoadTable::Slot* AgentLoadTable::make_slot(std::uint64_t target) noexcept {
    if (target >= kCapacity) return nullptr;
    auto& b = blocks_[target / kBlock];
    std::unique_ptr<Block> fresh(new (std::nothrow) Block());
    if (!fresh) return nullptr; // no memory: this reply's load is not kept
    Block* expected = nullptr;
    // Two threads may make the same block at once: the first one's stays.
    if (b.compare_exchange_strong(expected, fresh.get(), std::memory_order_acq_rel))
        fresh.release();
    return slot(target);
}

AgentLoadTable::Slot* AgentLoadTable::slot(std::uint64_t target) const noexcept {
    if (target >= kCapacity) return nullptr;
    auto* b = blocks_[target / kBlock].load(std::memory_order_acquire);
    return b ? &(*b)[target % kBlock] : nullptr;
}

void AgentLoadTable::record(std::uint64_t target, std::uint32_t reserved,
                            std::chrono::steady_clock::time_point at) noexcept {
    auto* s = slot(target);
    if (!s) s = make_slot(target);
    if (!s) return;
    s->reserved.store(reserved, std::memory_order_relaxed);
    s->at_ns.store(
        std::chrono::duration_cast<std::chrono::nanoseconds>(at.time_since_epoch()).count(),
        std::memory_order_relaxed);
}

AgentLoad AgentLoadTable::load(std::uint64_t target) const noexcept {
    AgentLoad out;
    auto* s = slot(target);
    if (!s) return out;
    auto ns = s->at_ns.load(std::memory_order_relaxed);
    if (ns == 0) return out;
    auto bits = s->reserved.load(std::memory_order_relaxed);
    out.queued = load_queued(bits);
    out.busy = load_busy(bits);
    out.at = std::chrono::steady_clock::time_point(
        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
            std::chrono::nanoseconds(ns)));
    return out;
}

AgentLoad Client::load(const Target& target) const {
    return impl_->loads.load(target.id());
}

} // namespace bitship
