#include "inflight_ledger.hpp"

#include <algorithm>
#include <fmt/format.h>

namespace bitship {

namespace {
// Drops the ledger's reference: the count goes now when no Hold is out, else with the last one.
void retire(InflightCount* c, std::atomic<std::uint64_t>& word) {
    if ((word.fetch_or(InflightCount::kForgotten, std::memory_order_acq_rel) &
         ~InflightCount::kForgotten) == 0)
        delete c;
}
} // namespace

InflightLedger::~InflightLedger() {
    for (auto& [ep, c] : counts_)
        retire(c, c->word_);
}

InflightCount* InflightLedger::count_of(ucp_ep_h ep) {
    if (ep == last_ep_ && last_count_ != nullptr) return last_count_;
    auto& c = counts_[ep];
    if (c == nullptr) c = new InflightCount;
    last_ep_ = ep;
    last_count_ = c;
    return c;
}

void InflightLedger::forget(ucp_ep_h ep) {
    auto it = counts_.find(ep);
    if (it == counts_.end()) return;
    if (last_ep_ == ep) last_count_ = nullptr;
    auto* c = it->second;
    counts_.erase(it);
    retire(c, c->word_);
}

Result<Hold> InflightLedger::admit(ucp_ep_h ep, std::uint64_t bytes) {
    if (!enabled()) return Hold{};
    auto* c = count_of(ep);
    const auto w = c->load();
    const auto held_bytes = InflightCount::bytes_of(w),
               held_messages = InflightCount::messages_of(w);
    // Half the word's room, whatever the limits: answers are counted on top, unchecked.
    constexpr auto kMessagesRoom = InflightCount::kMaxMessages / 2,
                   kBytesRoom = InflightCount::kMaxBytes / 2;
    const auto messages_limit =
        limits_.messages != 0 ? std::min(limits_.messages, kMessagesRoom) : kMessagesRoom;
    const auto bytes_limit = limits_.bytes != 0 ? std::min(limits_.bytes, kBytesRoom) : kBytesRoom;
    const bool over_messages = held_messages + 1 > messages_limit;
    // One message larger than the whole budget still goes when nothing else is held: the
    // message-size limit, not this one, says whether it may be that large.
    const bool over_bytes = held_messages != 0 && held_bytes + bytes > bytes_limit;
    if (over_messages || over_bytes)
        return fail(
            Errc::busy,
            fmt::format(
                "this connection already has {} messages ({} bytes) at the agent not yet answered; "
                "its limit per connection is {}: retry once some are answered",
                held_messages, held_bytes,
                over_messages
                    ? fmt::format("{} messages", messages_limit)
                    : fmt::format("{} bytes, and this message has {}", bytes_limit, bytes)));
    return Hold{c, bytes};
}

Hold InflightLedger::charge(ucp_ep_h ep, std::uint64_t bytes) {
    if (!enabled()) return Hold{};
    auto* c = count_of(ep);
    const auto w = c->load();
    // Counted while the word has room (it always has, short of ~4M answers or 512 GiB in flight
    // to one peer); past that, not counted rather than overflowing into the other field.
    if (InflightCount::messages_of(w) >= InflightCount::kMaxMessages - 1 ||
        InflightCount::bytes_of(w) + bytes > InflightCount::kMaxBytes)
        return Hold{};
    return Hold{c, bytes};
}

std::pair<std::uint64_t, std::uint64_t> InflightLedger::held(ucp_ep_h ep) const {
    auto it = counts_.find(ep);
    if (it == counts_.end()) return {0, 0};
    const auto w = it->second->load();
    return {InflightCount::bytes_of(w), InflightCount::messages_of(w)};
}

} // namespace bitship
