#include "inflight_ledger.hpp"

#include <fmt/format.h>

namespace bitship {

Hold::Hold(std::shared_ptr<InflightCount> count, std::uint64_t bytes) noexcept
    : count_(std::move(count)), bytes_(bytes) {
    count_->bytes.fetch_add(bytes_, std::memory_order_relaxed);
    count_->messages.fetch_add(1, std::memory_order_relaxed);
}

Hold::Hold(Hold&& other) noexcept : count_(std::move(other.count_)), bytes_(other.bytes_) {
    other.count_ = nullptr;
}

Hold& Hold::operator=(Hold&& other) noexcept {
    if (this != &other) {
        release();
        count_ = std::move(other.count_);
        bytes_ = other.bytes_;
        other.count_ = nullptr;
    }
    return *this;
}

void Hold::release() noexcept {
    if (!count_) return;
    count_->bytes.fetch_sub(bytes_, std::memory_order_relaxed);
    count_->messages.fetch_sub(1, std::memory_order_relaxed);
    count_.reset();
}

std::shared_ptr<InflightCount>& InflightLedger::count_of(ucp_ep_h ep) {
    auto& c = counts_[ep];
    if (!c) c = std::make_shared<InflightCount>();
    return c;
}

Result<Hold> InflightLedger::admit(ucp_ep_h ep, std::uint64_t bytes) {
    if (!enabled()) return Hold{};
    auto& c = count_of(ep);
    const auto held_bytes = c->bytes.load(std::memory_order_relaxed);
    const auto held_messages = c->messages.load(std::memory_order_relaxed);
    const bool over_messages = limits_.messages != 0 && held_messages + 1 > limits_.messages;
    // One message larger than the whole budget still goes when nothing else is held: the
    // message-size limit, not this one, says whether it may be that large.
    const bool over_bytes =
        limits_.bytes != 0 && held_messages != 0 && held_bytes + bytes > limits_.bytes;
    if (over_messages || over_bytes)
        return fail(
            Errc::busy,
            fmt::format(
                "this connection already has {} messages ({} bytes) at the agent not yet answered; "
                "its limit per connection is {}: retry once some are answered",
                held_messages, held_bytes,
                over_messages
                    ? fmt::format("{} messages", limits_.messages)
                    : fmt::format("{} bytes, and this message has {}", limits_.bytes, bytes)));
    return Hold{c, bytes};
}

Hold InflightLedger::charge(ucp_ep_h ep, std::uint64_t bytes) {
    if (!enabled()) return Hold{};
    return Hold{count_of(ep), bytes};
}

std::pair<std::uint64_t, std::uint64_t> InflightLedger::held(ucp_ep_h ep) const {
    auto it = counts_.find(ep);
    if (it == counts_.end()) return {0, 0};
    return {it->second->bytes.load(std::memory_order_relaxed),
            it->second->messages.load(std::memory_order_relaxed)};
}

} // namespace bitship
