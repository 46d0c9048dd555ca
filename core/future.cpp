// Waiting for a result. The waiting thread progresses the engine itself (it becomes the
// leader), so a call's reply is received, decoded and handed over on the thread that wants
// it, with no wake-up of any other thread. When another caller already leads, this one
// sleeps until that leader completes its call or leaves, and then leads in turn.
#include "client_impl.hpp"

#include <cstring>
#include <optional>
#include <thread>

#include <fmt/format.h>

namespace bitship {
namespace {
// A leader gives the engine back at least this often, so a destroyed client is noticed.
constexpr auto kLeadSlice = std::chrono::milliseconds(100);
} // namespace

bool Future::ready() const noexcept {
    if (!state_) return false;
    auto& s = *state_;
    if (s.done.load(std::memory_order_acquire)) return true;
    // The poller progresses, as a waiter does: nobody else may (the engine's thread looks only
    // within Engine::kDeepWait while callers come and go). Once the client's teardown began
    // (ProgressHandle::retire), the guard finds no engine: then there is nothing to progress.
    if (s.progress) {
        detail::ProgressHandle::Use alive(*s.progress);
        if (auto* engine = alive.engine()) {
            detail::t_waiter_leads = true; // what it completes counts as the caller's
            engine->poll_once();
            detail::t_waiter_leads = false;
        }
    }
    return s.done.load(std::memory_order_acquire);
}

bool Future::wait_for(std::chrono::nanoseconds timeout) const {
    if (!state_) return true;
    auto& s = *state_;
    auto done = [&s] { return s.done.load(std::memory_order_seq_cst); };
    if (done()) return true;
    // One clock read per round: a call answered while this thread leads costs no other.
    auto now = Clock::now();
    const auto until = now + timeout;
    for (;; now = Clock::now()) {
        if (now >= until) return done();
        auto slice_end = std::min(until, now + kLeadSlice);
        std::optional<detail::ProgressHandle::Use> alive(std::in_place, *s.progress);
        Engine* engine = alive->engine();
        if (!engine) {
            // The client is gone; it failed every call it knew of. Nothing will progress.
            alive.reset();
            if (done()) return true;
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
            continue;
        }
        detail::t_waiter_leads = true;
        auto lead = engine->try_lead_until(done, slice_end, now);
        detail::t_waiter_leads = false;
        if (lead == Engine::Lead::other_leader) engine->wait_for_handoff(done, slice_end);
        if (done()) return true;
    }
}

namespace {
// The client fails every call at its deadline; the extra time only covers a client that was
// destroyed while we waited.
Result<void> wait_done(const Future& f, const detail::CallState& s) {
    while (!f.wait_for(std::chrono::seconds(1))) {
        if (Clock::now() > s.deadline + std::chrono::seconds(5))
            return fail(Errc::timeout, "call outlived its deadline (client gone?)");
    }
    return {};
}
} // namespace

Result<Bytes> Future::get() const& {
    if (!state_) return fail(Errc::invalid_argument, "empty future");
    if (auto done = wait_done(*this, *state_); !done) return tl::make_unexpected(done.error());
    std::lock_guard lock(state_->mutex);
    return state_->result;
}

Result<Bytes> Future::get() && {
    if (!state_) return fail(Errc::invalid_argument, "empty future");
    if (auto done = wait_done(*this, *state_); !done) return tl::make_unexpected(done.error());
    // Alone: no one else can reach the call any more (every other reader held a reference,
    // and read under the mutex before letting it go), and complete() wrote the result before
    // `done`, which wait_done read: it is ours to take, with no lock. Else another copy may
    // still read it.
    if (state_.use_count() == 1) return std::move(state_->result);
    std::lock_guard lock(state_->mutex);
    return state_->result;
}

Result<void> Future::get_into(void* out, std::size_t size) const {
    if (!state_) return fail(Errc::invalid_argument, "empty future");
    if (auto done = wait_done(*this, *state_); !done) return done;
    std::lock_guard lock(state_->mutex);
    const auto& r = state_->result;
    if (!r) return tl::make_unexpected(r.error());
    if (r->size() != size)
        return fail(Errc::invalid_argument, fmt::format("reply has {} bytes, expected {}", r->size(), size));
    std::memcpy(out, r->data(), size);
    return {};
}

} // namespace bitship
