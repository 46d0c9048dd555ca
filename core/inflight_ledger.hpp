#pragma once
// What each peer has made this side hold: the messages it sent that are not yet done with
// (received, queued, compiling, running) and the answers to it that UCX has not yet delivered.
// An agent bounds both per connection, so one client flooding RUNs (or never fetching its
// large results) makes the agent refuse that client's new messages with Errc::busy, instead
// of allocating without bound while every other client waits.
//
//   InflightLedger ledger({.bytes = 256 << 20, .messages = 16384});
//   auto hold = ledger.admit(ep, length);   // before a payload buffer is allocated
//   if (!hold) return refuse(hold.error()); // busy, naming the limit and what is held
//   incoming.hold = std::move(*hold);       // released when the payload is let go
//
// The table is touched only by whoever progresses the engine; a Hold may be released on any
// thread (the counts are atomic, and a Hold keeps its count alive past forget()).

#include "inflight_limits.hpp"

#include <atomic>
#include <bitship/errc.hpp>
#include <cstdint>
#include <memory>
#include <ucp/api/ucp.h>
#include <unordered_map>

namespace bitship {

/// One peer's held bytes and messages.
struct InflightCount {
    std::atomic<std::uint64_t> bytes{0};
    std::atomic<std::uint64_t> messages{0};
};

/// A share of one peer's count, given back when destroyed. Move-only; empty by default.
class Hold {
public:
    Hold() = default;
    Hold(std::shared_ptr<InflightCount> count, std::uint64_t bytes) noexcept;
    Hold(Hold&& other) noexcept;
    Hold& operator=(Hold&& other) noexcept;
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;
    ~Hold() { release(); }

    /// Gives the share back now (idempotent).
    void release() noexcept;
    [[nodiscard]] bool empty() const { return count_ == nullptr; }

private:
    std::shared_ptr<InflightCount> count_;
    std::uint64_t bytes_ = 0;
};

class InflightLedger {
public:
    explicit InflightLedger(InflightLimits limits = {}) : limits_(limits) {}

    [[nodiscard]] bool enabled() const { return limits_.any(); }
    [[nodiscard]] const InflightLimits& limits() const { return limits_; }

    /// One more message of `bytes` from `ep`: held, or Errc::busy saying which limit it would
    /// pass and what `ep` holds now. An empty Hold when no limit is set.
    Result<Hold> admit(ucp_ep_h ep, std::uint64_t bytes);
    /// An answer of `bytes` to `ep` that UCX still holds: counted (so new messages from `ep`
    /// are refused while its answers pile up undelivered), never refused.
    Hold charge(ucp_ep_h ep, std::uint64_t bytes);
    /// `ep` is closed: its entry goes (Holds still out keep their count alive).
    void forget(ucp_ep_h ep) { counts_.erase(ep); }

    /// What `ep` holds now (0, 0 for an unknown one).
    [[nodiscard]] std::pair<std::uint64_t, std::uint64_t> held(ucp_ep_h ep) const;

private:
    std::shared_ptr<InflightCount>& count_of(ucp_ep_h ep);

    InflightLimits limits_;
    std::unordered_map<ucp_ep_h, std::shared_ptr<InflightCount>> counts_;
};

} // namespace bitship
