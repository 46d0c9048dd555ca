// Groups of calls (Client::ship_each): many calls of one kernel on one agent in one RUN
// (wire::kFlagEach), answered by one RESULT that holds every call's answer.
#include "client_impl.hpp"

namespace bitship {

EachFuture Client::ship_each_bytes(const Kernel& kernel, const Target& target, std::size_t count, std::size_t size,
                                   std::span<const std::byte> args, const ShipOptions& options) {
    std::string agent = target.info_ ? fmt::format("agent {}", target.info_->address) : std::string("agent");
    auto refuse = [&](Errc code, std::string why) {
        auto c = impl_->new_call(target.id(), Kind::run);
        c->complete(fail(code, std::move(why)));
        return EachFuture(Future(c), static_cast<std::uint32_t>(std::min<std::size_t>(count, wire::kMaxEachCalls)), agent);
    };
    if (count > wire::kMaxEachCalls)
        return refuse(Errc::too_large, fmt::format("a group of {} calls: at most {} calls make one group", count, wire::kMaxEachCalls));
    if (size > 0xffffffffu || args.size() != count * size)
        return refuse(Errc::invalid_argument, fmt::format("a group of {} calls of {} bytes of arguments each needs {} bytes, "
                                                          "not {}",
                                                          count, size, count * size, args.size()));
    if (!options.peers.empty() || options.forward)
        return refuse(Errc::invalid_argument, "the calls of a group cannot forward (ShipOptions::peers or forward with ship_each)");
    if (options.device == Device::gpu)
        return refuse(Errc::invalid_argument, "the calls of a group run on the agent's CPU (ShipOptions::device = gpu with ship_each)");
    if (count == 0) { // nothing to send: no answers
        auto c = impl_->new_call(target.id(), Kind::run);
        wire::EachResultsWriter none(0, 0);
        c->complete(std::move(none).take());
        return EachFuture(Future(c), 0, std::move(agent));
    }
    // Each call's arguments at a multiple of the wire's alignment, as a single call's are.
    const auto stride = wire::each_stride(static_cast<std::uint32_t>(size));
    Bytes packed(count * stride);
    for (std::size_t i = 0; i < count && size > 0; ++i) std::memcpy(packed.data() + i * stride, args.data() + i * size, size);
    auto c = impl_->prepare_run(kernel, target, std::move(packed), options);
    c->each = wire::Each{static_cast<std::uint32_t>(count), static_cast<std::uint32_t>(size)};
    if (!c->done.load(std::memory_order_relaxed)) impl_->submit_from_caller(c);
    return EachFuture(Future(c), static_cast<std::uint32_t>(count), std::move(agent));
}

Result<EachResults> EachFuture::get() const {
    auto bytes = future_.get();
    if (!bytes) return tl::make_unexpected(bytes.error());
    auto at = wire::index_each_results(*bytes, count_);
    if (!at) return tl::make_unexpected(at.error());
    return EachResults(std::move(*bytes), std::move(*at), agent_);
}

Result<std::span<const std::byte>> EachResults::at(std::size_t i) const {
    if (i >= at_.size()) return fail(Errc::invalid_argument, fmt::format("call {} of a group of {}", i, at_.size()));
    auto answer = wire::read_each_answer(bytes_, at_[i]);
    if (answer.error)
        return fail(answer.error->code, fmt::format("{}: call {} of {}: {}", agent_, i, at_.size(), answer.error->message));
    return answer.bytes;
}

std::size_t EachResults::failures() const noexcept {
    return static_cast<std::size_t>(
        std::count_if(at_.begin(), at_.end(), [&](std::uint32_t at) { return wire::read_each_answer(bytes_, at).error.has_value(); }));
}

tl::unexpected<Error> EachResults::wrong_size(std::size_t i, std::size_t got, std::size_t want) {
    return fail(Errc::invalid_argument, fmt::format("call {}'s reply has {} bytes, expected {}", i, got, want));
}

} // namespace bitship
