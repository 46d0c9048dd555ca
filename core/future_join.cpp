// Future::join: one future for a fan-out of calls, completed by whichever part completes last
// (or by the first to fail). It is in no pending table: its parts carry the deadlines, so it
// cannot outlive the last of them.
#include "client_impl.hpp"

#include <optional>

namespace bitship {
namespace {

struct Joining {
    std::vector<std::shared_ptr<CallState>> parts;
    Future::Join join;
    std::shared_ptr<CallState> whole;
    std::atomic<std::size_t> left{0};

    // Called once per part, after its result is in.
    void part_done(CallState& part) {
        std::optional<Error> error;
        {
            std::lock_guard lock(part.mutex);
            if (!part.result) error = part.result.error();
        }
        // The first error completes the whole at once; the part is still counted below, so
        // the last part releases everything.
        if (error) whole->complete(tl::make_unexpected(std::move(*error)));
        if (left.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
        if (whole->done.load(std::memory_order_acquire)) return; // a part failed
        std::vector<Bytes> results;
        results.reserve(parts.size());
        for (auto& p : parts) {
            std::lock_guard lock(p->mutex);
            results.push_back(std::move(*p->result));
        }
        try {
            whole->complete(join(results));
        } catch (const std::exception& e) {
            whole->complete(fail(Errc::internal, fmt::format("joining {} results threw: {}", results.size(), e.what())));
        }
    }
};

} // namespace

Future Future::join(std::vector<Future> parts, Join join) {
    auto whole = std::make_shared<CallState>();
    whole->kind = Kind::chain;
    whole->deadline = Clock::now();
    auto joining = std::make_shared<Joining>();
    joining->join = std::move(join);
    joining->whole = whole;
    for (auto& f : parts) {
        if (!f.state_) {
            whole->complete(fail(Errc::invalid_argument, "Future::join: an empty future among the parts"));
            return Future(whole);
        }
        whole->deadline = std::max(whole->deadline, f.state_->deadline);
        if (!whole->progress) {
            whole->progress = f.state_->progress;
            whole->engine = f.state_->engine;
        }
        joining->parts.push_back(f.state_);
    }
    if (joining->parts.empty()) {
        std::vector<Bytes> none;
        whole->complete(joining->join(none));
        return Future(whole);
    }
    joining->left.store(joining->parts.size(), std::memory_order_release);
    for (auto& p : joining->parts) {
        bool done_already = false;
        {
            std::lock_guard lock(p->mutex);
            if (p->done.load(std::memory_order_relaxed)) done_already = true;
            else p->then = [joining, raw = p.get()] { joining->part_done(*raw); };
        }
        if (done_already) joining->part_done(*p);
    }
    return Future(whole);
}

} // namespace bitship
