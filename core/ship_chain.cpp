// Client::ship_chain: a walk of shipped calls that comes back here between them. Each call is
// an ordinary RUN (its own deadline, clamped to the walk's); when it completes, the walk's
// `next` makes the following one from its reply, and the whole completes with the last.
#include "client_impl.hpp"

namespace bitship {
namespace {

struct Shipping : std::enable_shared_from_this<Shipping> {
    Client::Impl* impl = nullptr;
    Kernel kernel;
    ShipOptions options;
    Client::NextShip next;
    std::shared_ptr<CallState> whole;
    std::uint64_t calls = 0;

    // Asks `next` for the call after `last`; `from_caller`: on the thread that started the walk
    // (which may send at once), not inside a completion (which holds the progress token).
    void step(std::span<const std::byte> last, bool from_caller) {
        Bytes result;
        Result<std::optional<ShipStep>> s = std::optional<ShipStep>{};
        try {
            s = next(last, result);
        } catch (const std::exception& e) {
            whole->complete(fail(Errc::internal, fmt::format("ship_chain: the walk's next step threw after {} calls: {}", calls, e.what())));
            return;
        }
        if (!s) return whole->complete(tl::make_unexpected(std::move(s.error())));
        if (!*s) return whole->complete(std::move(result));
        auto& want = **s;
        if (want.target == nullptr)
            return whole->complete(fail(Errc::invalid_argument, fmt::format("ship_chain: step {} names no target", calls + 1)));
        if (Clock::now() >= whole->deadline)
            return whole->complete(fail(Errc::timeout, fmt::format("ship_chain: the walk's deadline passed after {} calls", calls)));
        ++calls;
        auto c = impl->prepare_run(kernel, *want.target, std::move(want.args), options);
        c->deadline = std::min(c->deadline, whole->deadline);
        bool done_already = false;
        {
            std::lock_guard lock(c->mutex);
            if (c->done.load(std::memory_order_relaxed)) done_already = true;
            else c->then = [self = shared_from_this(), raw = c.get()] { self->call_done(*raw); };
        }
        if (done_already) return call_done(*c);
        if (from_caller) impl->submit_from_caller(c);
        else impl->engine->post([impl = impl, c] { impl->submit(c); });
    }

    void call_done(CallState& c) {
        Result<Bytes> r = Bytes{};
        {
            std::lock_guard lock(c.mutex);
            r = std::move(c.result);
        }
        if (!r) return whole->complete(tl::make_unexpected(std::move(r.error())));
        step(*r, false);
    }
};

} // namespace

Future Client::ship_chain(const Kernel& kernel, ShipOptions options, NextShip next) {
    auto whole = impl_->new_call(0, Kind::chain);
    if (!next) {
        whole->complete(fail(Errc::invalid_argument, "ship_chain: no next step"));
        return Future(whole);
    }
    auto walk = std::make_shared<Shipping>();
    walk->impl = impl_.get();
    walk->kernel = kernel;
    walk->options = std::move(options);
    walk->next = std::move(next);
    walk->whole = whole;
    walk->step({}, true);
    return Future(whole);
}

} // namespace bitship
