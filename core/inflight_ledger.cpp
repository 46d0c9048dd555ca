#include "inflight_ledger.hpp"

#include <algorithm>
#include <fmt/format.h>
#include <optional>
#include <string>

namespace bitship {

namespace {
// Drops the ledger's reference: the count goes now when no Hold is out, else with the last one.
void retire(InflightCount* c, std::atomic<std::uint64_t>& word) {
    if ((word.fetch_or(InflightCount::kForgotten, std::memory_order_acq_rel) &
         ~InflightCount::kForgotten) == 0)
        delete c;
}
} // namespace

InflightLedger::InflightLedger(InflightBudget budget)
    : budget_(budget), total_(new InflightCount) {}

InflightLedger::~InflightLedger() {
    for (auto& [ep, c] : counts_)
        retire(c, c->word_);
    retire(total_, total_->word_);
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

namespace {
// A limit as admit() applies it: never past half the word's room, whatever the limits say
// (answers are counted on top, unchecked), and that much when a limit is 0.
struct Applied {
    std::uint64_t bytes, messages;
};
Applied applied(const InflightLimits& l) {
    constexpr auto kMessagesRoom = InflightCount::kMaxMessages / 2,
                   kBytesRoom = InflightCount::kMaxBytes / 2;
    return {l.bytes != 0 ? std::min(l.bytes, kBytesRoom) : kBytesRoom,
            l.messages != 0 ? std::min(l.messages, kMessagesRoom) : kMessagesRoom};
}

// Whether one more message of `bytes` stays within `limit`. One message larger than the whole
// byte budget still goes when nothing else is held: the message-size limit, not this one, says
// whether it may be that large.
bool within(std::uint64_t w, std::uint64_t bytes, Applied limit) {
    const auto held_bytes = InflightCount::bytes_of(w), held_messages = InflightCount::messages_of(w);
    return held_messages + 1 <= limit.messages && (held_messages == 0 || held_bytes + bytes <= limit.bytes);
}

// Which of `limit` one more message of `bytes` would pass, if any (the refusal's words).
std::optional<std::string> passes(std::uint64_t w, std::uint64_t bytes, Applied limit) {
    if (within(w, bytes, limit)) return std::nullopt;
    if (InflightCount::messages_of(w) + 1 > limit.messages) return fmt::format("{} messages", limit.messages);
    return fmt::format("{} bytes, and this message has {}", limit.bytes, bytes);
}
} // namespace

Result<Hold> InflightLedger::admit(ucp_ep_h ep, std::uint64_t bytes) {
    if (!enabled()) return Hold{};
    auto* c = count_of(ep);
    const auto w = c->load();
    // The common case, one check each: within both limits. The refusals below say why.
    if (within(w, bytes, applied(budget_.per_peer)) && within(total_->load(), bytes, applied(budget_.total)))
        return Hold{c, total_, bytes};
    if (auto over = passes(w, bytes, applied(budget_.per_peer)))
        return fail(
            Errc::busy,
            fmt::format("this connection already has {} messages ({} bytes) at the agent not "
                        "yet answered; its limit per connection is {}: retry once some are "
                        "answered",
                        InflightCount::messages_of(w), InflightCount::bytes_of(w), *over));
    // A small message from a peer that holds nothing goes whatever the others hold, so that
    // a flood from some does not starve the rest.
    const auto all = total_->load();
    const bool exempt = InflightCount::messages_of(w) == 0 && bytes <= kAlwaysAdmitted;
    if (auto over = passes(all, bytes, applied(budget_.total)); over && !exempt)
        return fail(Errc::busy,
                    fmt::format("the agent already holds {} messages ({} bytes) not yet answered "
                                "from all its connections, {} of them this one's; its limit across "
                                "connections is {}: retry once some are answered",
                                InflightCount::messages_of(all), InflightCount::bytes_of(all),
                                InflightCount::messages_of(w), *over));
    return Hold{c, total_, bytes};
}

Hold InflightLedger::charge(ucp_ep_h ep, std::uint64_t bytes) {
    if (!enabled()) return Hold{};
    auto* c = count_of(ep);
    // Counted while the words have room (they always have, short of ~4M answers or 512 GiB in
    // flight); past that, not counted rather than overflowing into the other field.
    for (const auto w : {c->load(), total_->load()})
        if (InflightCount::messages_of(w) >= InflightCount::kMaxMessages - 1 ||
            InflightCount::bytes_of(w) + bytes > InflightCount::kMaxBytes)
            return Hold{};
    return Hold{c, total_, bytes};
}

std::pair<std::uint64_t, std::uint64_t> InflightLedger::held(ucp_ep_h ep) const {
    auto it = counts_.find(ep);
    if (it == counts_.end()) return {0, 0};
    const auto w = it->second->load();
    return {InflightCount::bytes_of(w), InflightCount::messages_of(w)};
}

std::pair<std::uint64_t, std::uint64_t> InflightLedger::held_by_all() const {
    const auto w = total_->load();
    return {InflightCount::bytes_of(w), InflightCount::messages_of(w)};
}

} // namespace bitship
