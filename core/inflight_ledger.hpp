#pragma once
// What peers have made this side hold: the messages they sent that are not yet done with
// (received, queued, compiling, running) and the answers to them that UCX has not yet delivered.
// An agent bounds both per connection and across all of them, so one client flooding RUNs (or
// never fetching its large results), or many clients at once, make the agent refuse new
// messages with Errc::busy instead of allocating without bound.
//
//   InflightLedger ledger({.per_peer = {256 << 20, 16384}, .total = {1 << 30, 65536}});
//   auto hold = ledger.admit(ep, length);   // before a payload buffer is allocated
//   if (!hold) return refuse(hold.error()); // busy, naming the limit and what is held
//   incoming.hold = std::move(*hold);       // released when the payload is let go
//
// The table is touched only by whoever progresses the engine; a Hold may be released on any
// thread. Every message passes here, so a hold costs two atomic adds and two subtracts: a
// count's bytes and messages share one word, which also says when the ledger has forgotten it
// (its last Hold then frees it).

#include "inflight_limits.hpp"

#include <atomic>
#include <bitship/errc.hpp>
#include <cstdint>
#include <ucp/api/ucp.h>
#include <unordered_map>
#include <utility>

namespace bitship {

/// Held bytes (bits 0-39) and messages (bits 40-62), of one peer or of all; bit 63: forgotten
/// by the ledger, so the last Hold to go deletes it.
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

/// A share of one peer's count and of the total, given back when destroyed. Move-only; empty
/// by default.
class Hold {
public:
    Hold() = default;
    Hold(Hold&& other) noexcept
        : count_(std::exchange(other.count_, nullptr)),
          total_(std::exchange(other.total_, nullptr)), delta_(other.delta_) {}
    Hold& operator=(Hold&& other) noexcept {
        if (this != &other) {
            release();
            count_ = std::exchange(other.count_, nullptr);
            total_ = std::exchange(other.total_, nullptr);
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
        give_back(std::exchange(count_, nullptr));
        give_back(std::exchange(total_, nullptr));
    }
    [[nodiscard]] bool empty() const { return count_ == nullptr; }

private:
    friend class InflightLedger;
    Hold(InflightCount* count, InflightCount* total, std::uint64_t bytes) noexcept
        : count_(count), total_(total), delta_(InflightCount::kOneMessage + bytes) {
        count_->word_.fetch_add(delta_, std::memory_order_relaxed);
        total_->word_.fetch_add(delta_, std::memory_order_relaxed);
    }
    void give_back(InflightCount* c) const noexcept {
        const auto left = c->word_.fetch_sub(delta_, std::memory_order_acq_rel) - delta_;
        if (left == InflightCount::kForgotten) delete c;
    }
    InflightCount* count_ = nullptr; ///< the peer's; null: an empty Hold
    InflightCount* total_ = nullptr; ///< every peer's together
    std::uint64_t delta_ = 0;
};

class InflightLedger {
public:
    explicit InflightLedger(InflightBudget budget = {});
    ~InflightLedger();
    InflightLedger(const InflightLedger&) = delete;
    InflightLedger& operator=(const InflightLedger&) = delete;

    [[nodiscard]] bool enabled() const { return budget_.any(); }

    /// One more message of `bytes` from `ep`: held, or Errc::busy saying which limit it would
    /// pass and what is held now. An empty Hold when no limit is set.
    Result<Hold> admit(ucp_ep_h ep, std::uint64_t bytes);
    /// An answer of `bytes` to `ep` that UCX still holds: counted (so new messages from `ep`
    /// are refused while its answers pile up undelivered), never refused.
    Hold charge(ucp_ep_h ep, std::uint64_t bytes);
    /// `ep` is closed: its entry goes (Holds still out keep their count alive).
    void forget(ucp_ep_h ep);

    /// What `ep` holds now: bytes, messages (0, 0 for an unknown one).
    [[nodiscard]] std::pair<std::uint64_t, std::uint64_t> held(ucp_ep_h ep) const;
    /// What every peer together holds now: bytes, messages. Any thread.
    [[nodiscard]] std::pair<std::uint64_t, std::uint64_t> held_by_all() const;

private:
    InflightCount* count_of(ucp_ep_h ep);

    InflightBudget budget_;
    InflightCount* total_; ///< outlives the ledger while Holds are out
    std::unordered_map<ucp_ep_h, InflightCount*> counts_;
    // The last peer looked up: a session's messages mostly come one peer at a time.
    ucp_ep_h last_ep_ = nullptr;
    InflightCount* last_count_ = nullptr;
};

} // namespace bitship
