#include "filter.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include <xrdma_filter_kernels.hpp>

#include "region_io.hpp"

namespace bitship::xrdma {
namespace {

Bytes concatenate(std::vector<Bytes>& parts) {
    std::size_t n = 0;
    for (const auto& p : parts) n += p.size();
    Bytes out;
    out.reserve(n);
    for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
    return out;
}

} // namespace

std::uint32_t Filter::threshold_for(double selectivity) noexcept {
    if (!(selectivity > 0)) return 0; // NaN too
    if (selectivity >= 1) return BS_FILTER_THRESHOLD_MAX;
    return static_cast<std::uint32_t>(std::lround(selectivity * BS_FILTER_THRESHOLD_MAX));
}

std::vector<std::uint64_t> Filter::local(std::uint32_t threshold, std::span<const std::uint64_t> items) {
    std::vector<std::uint64_t> out;
    for (auto x : items)
        if (bs_filter_match(x, threshold)) out.push_back(x);
    return out;
}

Result<Filter> Filter::open(Client& client, std::vector<Target> agents, std::uint64_t items_per_agent) {
    auto array = RemoteArray::open(client, std::move(agents), items_per_agent);
    if (!array) return tl::make_unexpected(array.error());
    return Filter(std::move(*array));
}

std::uint64_t Filter::max_count() const noexcept {
    // From item 0, agent a's part grows to its whole block before agent a + 1's begins.
    std::uint64_t count = 0, per = array_.items_per_agent();
    for (const auto& a : array_.agents()) {
        std::uint64_t fits = a.info().max_result / sizeof(std::uint64_t);
        if (fits < per) return count + fits;
        count += per;
    }
    return count;
}

Future Filter::start(Strategy strategy, std::uint32_t threshold, std::uint64_t first, std::uint64_t count) {
    if (strategy == Strategy::reship)
        return failed_future({Errc::invalid_argument, "filter: a fan-out has no walk to come back from (reship is for walks)"});
    if (threshold > BS_FILTER_THRESHOLD_MAX)
        return failed_future({Errc::invalid_argument, fmt::format("filter: threshold {} is over {}", threshold,
                                                                  BS_FILTER_THRESHOLD_MAX)});
    auto pieces = array_.pieces(first, count);
    if (!pieces) return failed_future({pieces.error().code, "filter: " + pieces.error().message});
    auto& client = array_.client();
    std::vector<Future> parts;
    if (strategy == Strategy::get) {
        for (const auto& p : *pieces)
            for (auto& f : array_.get(p)) parts.push_back(std::move(f));
        return Future::join(std::move(parts), [threshold](std::vector<Bytes>& chunks) -> Result<Bytes> {
            Bytes out;
            for (const auto& c : chunks) {
                std::span<const std::uint64_t> items(reinterpret_cast<const std::uint64_t*>(c.data()), c.size() / 8);
                for (auto x : items)
                    if (bs_filter_match(x, threshold)) {
                        auto at = out.size();
                        out.resize(at + sizeof x);
                        std::memcpy(out.data() + at, &x, sizeof x);
                    }
            }
            return out;
        });
    }
    for (const auto& p : *pieces) {
        const Target& agent = array_.agents()[p.agent];
        if (p.count > agent.info().max_result / sizeof(std::uint64_t))
            return failed_future(
                {Errc::too_large,
                 fmt::format("filter: agent {} could answer up to {} bytes for its {} items, over its result limit of {} "
                             "bytes (--max-result); filter at most {} items from item 0",
                             agent.info().address, p.count * sizeof(std::uint64_t), p.count, agent.info().max_result,
                             max_count())});
    }
    // Fan-out: one call per agent holding part of the range, all sent before any is awaited.
    for (const auto& p : *pieces) {
        bs_filter_args args{p.first, p.count, threshold, 0};
        const Target& agent = array_.agents()[p.agent];
        parts.push_back(strategy == Strategy::native ? client.ship_native("filter", agent, bytes_of(args))
                                                     : client.ship_bytes(xrdma_filter_kernels::filter, agent, bytes_of(args)));
    }
    return Future::join(std::move(parts), [](std::vector<Bytes>& answers) -> Result<Bytes> {
        for (const auto& a : answers)
            if (a.size() % sizeof(std::uint64_t) != 0)
                return fail(Errc::malformed_message, fmt::format("filter answered {} bytes, not whole items", a.size()));
        return concatenate(answers);
    });
}

Result<std::vector<std::uint64_t>> Filter::run(Strategy strategy, std::uint32_t threshold, std::uint64_t first,
                                               std::uint64_t count) {
    auto bytes = start(strategy, threshold, first, count).get();
    if (!bytes) return tl::make_unexpected(bytes.error());
    std::vector<std::uint64_t> out(bytes->size() / sizeof(std::uint64_t));
    std::memcpy(out.data(), bytes->data(), out.size() * sizeof(std::uint64_t));
    return out;
}

Result<std::unique_ptr<FilterOp>> FilterOp::create(Client& client, std::vector<Target> agents, double selectivity,
                                                   std::uint64_t items_per_agent, std::uint64_t seed) {
    if (items_per_agent == 0) return fail(Errc::invalid_argument, "filter: needs at least one item per agent");
    if (!(selectivity >= 0 && selectivity <= 1))
        return fail(Errc::invalid_argument, fmt::format("filter: selectivity {} is not within 0..1", selectivity));
    auto data = ShardedArray::make(static_cast<unsigned>(agents.size()), items_per_agent, seed);
    auto filter = Filter::open(client, std::move(agents), items_per_agent);
    if (!filter) return tl::make_unexpected(filter.error());
    if (auto r = filter->load(data); !r) return tl::make_unexpected(r.error());
    return std::unique_ptr<FilterOp>(new FilterOp(std::move(*filter), std::move(data), selectivity));
}

std::uint64_t FilterOp::max_size() const noexcept { return filter_.max_count(); }

const Kernel& FilterOp::kernel() const noexcept { return xrdma_filter_kernels::filter; }

OpWork FilterOp::work(std::uint64_t size) const {
    OpWork w;
    auto per = data_.items_per_agent();
    w.dependent_gets = size ? 1 : 0; // every chunk's GET is in flight at once
    w.get_bytes = size * sizeof(std::uint64_t);
    w.remote_units = size;
    w.forwards = 0; // a fan-out: every agent answers here
    // Rounded to the nearest item (not std::llround: a libm call, in every loaded choose()).
    w.result_bytes = static_cast<std::uint64_t>(static_cast<double>(size) * threshold_ / BS_FILTER_THRESHOLD_MAX + 0.5) *
                     sizeof(std::uint64_t);
    // One agent's share or less: no 64-bit division (a loaded choose() asks this of each size).
    w.agents_touched = size <= per ? 1 : static_cast<std::uint32_t>((size + per - 1) / per);
    return w;
}

Future FilterOp::start(Strategy strategy, std::uint64_t size) {
    if (size > max_size() && size <= data_.size())
        return failed_future({Errc::too_large, fmt::format("filter: {} items could answer more than an agent's result limit "
                                                           "allows (--max-result); at most {}",
                                                           size, max_size())});
    return filter_.start(strategy, threshold_, 0, size);
}

Bytes FilterOp::expected(std::uint64_t size) const {
    auto items = Filter::local(threshold_, data_.items().first(std::min(size, data_.size())));
    auto bytes = std::as_bytes(std::span(items));
    return Bytes(bytes.begin(), bytes.end());
}

} // namespace bitship::xrdma
