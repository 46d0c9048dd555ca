// Many small messages to one peer as one: gathering them under a Cork, and opening a BATCH
// that arrived (wire::split_batch). Over shared memory a call's cost is mostly the per-message
// work of UCX on both sides, so a Batch of calls sent as one message, answered as one, costs
// a fraction of as many single sends.
#include "engine.hpp"

#include <algorithm>

namespace bitship {

// Only the thread whose cork is outermost gathers. Another thread can hold the token while
// it is out (a kernel runs with the token released); a cork it makes then changes nothing.
Engine::Cork::Cork(Engine& engine)
    : engine_(engine), counts_(engine.cork_depth_ == 0 || engine.cork_owner_ == std::this_thread::get_id()) {
    if (!counts_) return;
    if (engine_.cork_depth_++ == 0) engine_.cork_owner_ = std::this_thread::get_id();
}

Engine::Cork::~Cork() {
    if (counts_ && --engine_.cork_depth_ == 0) engine_.send_all_gathered();
}

std::vector<Engine::Gathered>::iterator Engine::find_gathered(ucp_ep_h ep) {
    return std::find_if(gathered_.begin(), gathered_.end(), [ep](const Gathered& g) { return g.ep == ep; });
}

bool Engine::gather(ucp_ep_h ep, wire::Encoded& message) {
    // A guest's kernel runs with the token released; whoever progresses meanwhile sends as
    // ever, so replies to others never wait for the corked thread.
    if (cork_owner_ != std::this_thread::get_id() || !message.borrowed.empty()) return false;
    const std::size_t bytes = sizeof(wire::Header) + message.payload.size();
    if (bytes > kBatchItemBytes || message.header.type == wire::Type::batch) return false;
    auto it = find_gathered(ep);
    if (it != gathered_.end() && (it->bytes + bytes > kBatchBytes || it->count == wire::kBatchMaxItems)) {
        send_gathered(ep); // full: it goes, and a new batch starts
        it = gathered_.end();
    }
    if (it == gathered_.end()) it = gathered_.insert(gathered_.end(), Gathered{ep, {}, {}, 0, 0});
    if (it->count == 0) {
        it->first = std::move(message);
    } else {
        if (it->count == 1) {
            it->batch = wire::encode_request(wire::Type::batch, 0);
            it->batch.payload.reserve(kBatchBytes);
            wire::append_to_batch(it->batch, it->first);
            it->first = {};
        }
        wire::append_to_batch(it->batch, message);
        message = {};
    }
    ++it->count;
    it->bytes += bytes;
    return true;
}

void Engine::send_gathered(ucp_ep_h ep) {
    auto it = find_gathered(ep);
    if (it == gathered_.end()) return;
    auto g = std::move(*it);
    gathered_.erase(it);
    if (g.count == 1) {
        send_now(ep, std::move(g.first));
        return;
    }
    batches_sent_.fetch_add(1, std::memory_order_relaxed);
    send_now(ep, std::move(g.batch));
}

void Engine::send_all_gathered() {
    while (!gathered_.empty()) send_gathered(gathered_.front().ep);
}

void Engine::drop_gathered(ucp_ep_h ep) {
    std::erase_if(gathered_, [ep](const Gathered& g) { return g.ep == ep; });
}

void Engine::open_batch(Incoming&& batch) {
    auto items = wire::split_batch(batch.payload);
    if (!items) {
        // Nothing in a malformed batch is handed on: the sender hears why, once.
        if (hooks_.on_bad_message) hooks_.on_bad_message(batch.ep, batch.header.request_id, items.error());
        return;
    }
    batches_received_.fetch_add(1, std::memory_order_relaxed);
    if (!hooks_.on_message) return;
    Cork replies_together(*this);
    // Each item is held (and may be refused) on its own, as if it had come alone.
    batch.hold.release(); // (a rendezvous BATCH was held whole; no bitship peer sends one)
    for (const auto& item : *items) {
        auto hold = inflight_.admit(batch.ep, item.payload.size());
        if (!hold) {
            if (hooks_.on_bad_message) hooks_.on_bad_message(batch.ep, item.header.request_id, hold.error());
            continue;
        }
        hooks_.on_message(Incoming{batch.ep, item.header, std::vector<std::byte>(item.payload.begin(), item.payload.end()),
                                   std::move(*hold)});
    }
}

} // namespace bitship
