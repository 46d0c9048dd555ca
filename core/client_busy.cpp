#include "client_impl.hpp"

namespace bitship {

// An agent holds at most so many of a session's calls (agents' InflightLedger); past that it
// refuses new ones with busy before receiving them. A refused call never ran, so sending it
// again is safe. Each answer from the agent means it holds one call less: one refused call
// goes again per answer (so a flood settles at the agent's limit instead of bouncing), and
// on_tick sends one per tick should the answers come from elsewhere (forwards).

bool Client::Impl::is_busy(const wire::Message& reply) {
    const auto* e = std::get_if<wire::ErrorMsg>(&reply.body);
    return e != nullptr && e->code == Errc::busy;
}

bool Client::Impl::hold_refused(Peer& p, const std::shared_ptr<CallState>& c) {
    if (!options.resend_busy || c->kind != Kind::run) return false;
    p.refused.push_back(c); // still pending: its deadline still runs
    return true;
}

void Client::Impl::resend_refused(Peer& p) {
    while (!p.refused.empty()) {
        auto c = std::move(p.refused.front());
        p.refused.pop_front();
        if (c->done.load(std::memory_order_acquire)) { // past its deadline meanwhile
            give_back_slot(p, *c); // (the agent never took it: the slot is free)
            continue;
        }
        busy_resends.fetch_add(1, std::memory_order_relaxed);
        // As it went: with its code when the refused RUN carried it (the agent never saw it).
        send_run(p, c, c->sent_code);
        if (c->done.load(std::memory_order_acquire)) pending.erase(c->id); // refused here (limits)
        return;
    }
}

} // namespace bitship
