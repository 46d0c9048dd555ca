#include "reduce.hpp"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include <xrdma_reduce_kernels.hpp>

#include "region_io.hpp"

namespace bitship::xrdma {
namespace {

Result<bs_reduce_result> result_of(const Bytes& b) {
    if (b.size() != sizeof(bs_reduce_result))
        return fail(Errc::malformed_message,
                    fmt::format("reduce answered {} bytes, expected {}", b.size(), sizeof(bs_reduce_result)));
    bs_reduce_result r;
    std::memcpy(&r, b.data(), sizeof r);
    return r;
}

} // namespace

std::string_view to_string(ReduceKind k) noexcept {
    switch (k) {
    case ReduceKind::sum: return "sum";
    case ReduceKind::min: return "min";
    case ReduceKind::max: return "max";
    }
    return "?";
}

Result<ReduceKind> parse_reduce_kind(std::string_view name) {
    if (name == "sum") return ReduceKind::sum;
    if (name == "min") return ReduceKind::min;
    if (name == "max") return ReduceKind::max;
    return fail(Errc::invalid_argument, fmt::format("unknown reduction '{}' (sum, min or max)", name));
}

bs_reduce_result Reduce::local(ReduceKind kind, std::span<const std::uint64_t> items) noexcept {
    bs_reduce_result r{kind == ReduceKind::min ? UINT64_MAX : 0, items.size()};
    for (auto x : items) {
        switch (kind) {
        case ReduceKind::sum: r.value += x; break;
        case ReduceKind::min: r.value = std::min(r.value, x); break;
        case ReduceKind::max: r.value = std::max(r.value, x); break;
        }
    }
    return r;
}

bs_reduce_result Reduce::combine(ReduceKind kind, bs_reduce_result a, bs_reduce_result b) noexcept {
    bs_reduce_result r{0, a.count + b.count};
    switch (kind) {
    case ReduceKind::sum: r.value = a.value + b.value; break;
    case ReduceKind::min: r.value = std::min(a.value, b.value); break;
    case ReduceKind::max: r.value = std::max(a.value, b.value); break;
    }
    return r;
}

Result<Reduce> Reduce::open(Client& client, std::vector<Target> agents, std::uint64_t items_per_agent) {
    auto array = RemoteArray::open(client, std::move(agents), items_per_agent);
    if (!array) return tl::make_unexpected(array.error());
    return Reduce(std::move(*array));
}

Future Reduce::start(Strategy strategy, ReduceKind kind, std::uint64_t first, std::uint64_t count) {
    if (strategy == Strategy::reship)
        return failed_future({Errc::invalid_argument, "reduce: a fan-out has no walk to come back from (reship is for walks)"});
    if (static_cast<std::uint32_t>(kind) > BS_REDUCE_MAX)
        return failed_future({Errc::invalid_argument, "reduce: kind must be sum, min or max"});
    auto pieces = array_.pieces(first, count);
    if (!pieces) return failed_future({pieces.error().code, "reduce: " + pieces.error().message});
    auto& client = array_.client();
    std::vector<Future> parts;
    if (strategy == Strategy::get) {
        for (const auto& p : *pieces)
            for (auto& f : array_.get(p)) parts.push_back(std::move(f));
        return Future::join(std::move(parts), [kind](std::vector<Bytes>& chunks) -> Result<Bytes> {
            bs_reduce_result r = local(kind, {});
            for (const auto& c : chunks) {
                std::span<const std::uint64_t> items(reinterpret_cast<const std::uint64_t*>(c.data()), c.size() / 8);
                r = combine(kind, r, local(kind, items));
            }
            return bytes_of(r);
        });
    }
    // Fan-out: one call per agent holding part of the range, all sent before any is awaited.
    for (const auto& p : *pieces) {
        bs_reduce_args args{p.first, p.count, static_cast<std::uint32_t>(kind), 0};
        const Target& agent = array_.agents()[p.agent];
        parts.push_back(strategy == Strategy::native ? client.ship_native("reduce", agent, bytes_of(args))
                                                     : client.ship_bytes(xrdma_reduce_kernels::reduce, agent, bytes_of(args)));
    }
    return Future::join(std::move(parts), [kind](std::vector<Bytes>& partials) -> Result<Bytes> {
        bs_reduce_result r = local(kind, {});
        for (const auto& b : partials) {
            auto p = result_of(b);
            if (!p) return tl::make_unexpected(p.error());
            r = combine(kind, r, *p);
        }
        return bytes_of(r);
    });
}

Result<bs_reduce_result> Reduce::run(Strategy strategy, ReduceKind kind, std::uint64_t first, std::uint64_t count) {
    auto bytes = start(strategy, kind, first, count).get();
    if (!bytes) return tl::make_unexpected(bytes.error());
    return result_of(*bytes);
}

Result<std::unique_ptr<ReduceOp>> ReduceOp::create(Client& client, std::vector<Target> agents, ReduceKind kind,
                                                   std::uint64_t items_per_agent, std::uint64_t seed) {
    if (items_per_agent == 0) return fail(Errc::invalid_argument, "reduce: needs at least one item per agent");
    auto data = ShardedArray::make(static_cast<unsigned>(agents.size()), items_per_agent, seed);
    auto reduce = Reduce::open(client, std::move(agents), items_per_agent);
    if (!reduce) return tl::make_unexpected(reduce.error());
    if (auto r = reduce->load(data); !r) return tl::make_unexpected(r.error());
    return std::unique_ptr<ReduceOp>(new ReduceOp(std::move(*reduce), std::move(data), kind));
}

const Kernel& ReduceOp::kernel() const noexcept { return xrdma_reduce_kernels::reduce; }

OpWork ReduceOp::work(std::uint64_t size) const {
    OpWork w;
    auto per = data_.items_per_agent();
    w.dependent_gets = size ? 1 : 0; // every chunk's GET is in flight at once
    w.get_bytes = size * sizeof(std::uint64_t);
    w.remote_units = size;
    w.forwards = 0; // a fan-out: every agent answers here
    w.result_bytes = sizeof(bs_reduce_result);
    // One agent's share or less: no 64-bit division (a loaded choose() asks this of each size).
    w.agents_touched = size <= per ? 1 : static_cast<std::uint32_t>((size + per - 1) / per);
    return w;
}

Future ReduceOp::start(Strategy strategy, std::uint64_t size) { return reduce_.start(strategy, kind_, 0, size); }

Bytes ReduceOp::expected(std::uint64_t size) const {
    return bytes_of(Reduce::local(kind_, data_.items().first(std::min(size, data_.size()))));
}

} // namespace bitship::xrdma
