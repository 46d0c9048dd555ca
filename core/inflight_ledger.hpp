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
// thread. Every message passes here, so a hold costs one atomic add and one subtract: a peer's
// bytes and messages share one word, which also says when the ledger has forgotten the peer
// (its last Hold then frees the count).

#include "inflight_limits.hpp"

#include <atomic>
#include <bitship/errc.hpp>
#include <cstdint>
#include <ucp/api/ucp.h>
#include <unordered_map>
#include <utility>

namespace bitship {

/// One peer's held bytes (bits 0-39) and messages (bits 40-62); bit 63: forgotten by the
/// ledger, so the last Hold to go deletes it.
class InflightCount {
public:
    static constexpr unsigned kMessageShift = 40;
    static constexpr std::uint64_t kMaxBytes = (1ull << kMessageShift) - 1;
    static constexpr std::uint64_t kMaxMessages = (1ull << 23) - 1;
    static constexpr std::uint64_t kOneMessage = 1ull << kMessageShift;
    static constexpr std::uint64_t kForgotten = 1ull << 63;

    [[nodiscard]] std::uint64_t load() const {
        return word_.load(std::memory_order_relaxed) & ~kForgotten;
    }
    static std::uint64_t bytes_of(std::uint64_t w) { return w & kMaxBytes; }
    static std::uint64_t messages_of(std::uint64_t w) { return (w & ~kForgotten) >> kMessageShift; }

private:
    friend class Hold;
    friend class InflightLedger;
    std::atomic<std::uint64_t> word_{0};
};

/// A share of one peer's count, given back when destroyed. Move-only; empty by default.
class Hold {
public:
    Hold() = default;
    Hold(Hold&& other) noexcept
        : count_(std::exchange(other.count_, nullptr)), delta_(other.delta_) {}
    Hold& operator=(Hold&& other) noexcept {
        if (this != &other) {
            release();
            count_ = std::exchange(other.count_, nullptr);
            delta_ = other.delta_;
        }
        return *this;
    }
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;
    ~Hold() { release(); }

    /// Gives the share back now (idempotent).
    void release() noexcept {
        if (count_ == nullptr) return;
        const auto left = count_->word_.fetch_sub(delta_, std::memory_order_acq_rel) - delta_;
        if (left == InflightCount::kForgotten) delete count_;
        count_ = nullptr;
    }
    [[nodiscard]] bool empty() const { return count_ == nullptr; }

private:
    friend class InflightLedger;
    Hold(InflightCount* count, std::uint64_t bytes) noexcept
        : count_(count), delta_(InflightCount::kOneMessage + bytes) {
        count_->word_.fetch_add(delta_, std::memory_order_relaxed);
    }
    InflightCount* count_ = nullptr;
    std::uint64_t delta_ = 0;
};

class InflightLedger {
public:
    explicit InflightLedger(InflightLimits limits = {}) : limits_(limits) {}
    ~InflightLedger();
    InflightLedger(const InflightLedger&) = delete;
    InflightLedger& operator=(const InflightLedger&) = delete;

    [[nodiscard]] bool enabled() const { return limits_.any(); }

    /// One more message of `bytes` from `ep`: held, or Errc::busy saying which limit it would
    /// pass and what `ep` holds now. An empty Hold when no limit is set.
    Result<Hold> admit(ucp_ep_h ep, std::uint64_t bytes);
    /// An answer of `bytes` to `ep` that UCX still holds: counted (so new messages from `ep`
    /// are refused while its answers pile up undelivered), never refused.
    Hold charge(ucp_ep_h ep, std::uint64_t bytes);
    /// `ep` is closed: its entry goes (Holds still out keep their count alive).
    void forget(ucp_ep_h ep);

    /// What `ep` holds now: bytes, messages (0, 0 for an unknown one).
    [[nodiscard]] std::pair<std::uint64_t, std::uint64_t> held(ucp_ep_h ep) const;

private:
    InflightCount* count_of(ucp_ep_h ep);

    InflightLimits limits_;
    std::unordered_map<ucp_ep_h, InflightCount*> counts_;
    // The last peer looked up: a session's messages mostly come one peer at a time.
    ucp_ep_h last_ep_ = nullptr;
    InflightCount* last_count_ = nullptr;
};

} // namespace bitship
