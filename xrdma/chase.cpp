#include "chase.hpp"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <numeric>
#include <random>

#include <fmt/format.h>

#include <xrdma_kernels.hpp>

#include "come_back.hpp"
#include "region_io.hpp"

namespace bitship::xrdma {
ChaseList ChaseList::make(unsigned agents, std::uint64_t nodes_per_agent, std::uint64_t seed) {
    ChaseList list;
    list.per_agent_ = nodes_per_agent;
    list.shards_.assign(agents, std::vector<bs_chase_node>(nodes_per_agent));
    // One random cycle through every (agent, index) slot: consecutive slots of the cycle sit on
    // independent random agents. Slots are packed as agent * nodes_per_agent + index.
    std::uint64_t total = agents * nodes_per_agent;
    std::vector<std::uint64_t> order(total);
    std::iota(order.begin(), order.end(), std::uint64_t{0});
    std::mt19937_64 rng(seed);
    std::shuffle(order.begin(), order.end(), rng);
    auto address = [&](std::uint64_t slot) {
        return address_of(static_cast<unsigned>(slot / nodes_per_agent), slot % nodes_per_agent);
    };
    for (std::uint64_t i = 0; i < total; ++i) {
        auto slot = order[i];
        auto& node = list.shards_[slot / nodes_per_agent][slot % nodes_per_agent];
        node.next = address(order[(i + 1) % total]);
        node.payload = rng();
    }
    return list;
}

bs_chase_result ChaseList::walk(std::uint64_t start, std::uint64_t depth) const {
    std::uint64_t addr = start, sum = 0;
    for (std::uint64_t i = 0; i < depth; ++i) {
        const auto& node = shards_.at(BS_CHASE_OWNER(addr)).at(BS_CHASE_OFFSET(addr) / sizeof(bs_chase_node));
        sum += node.payload;
        addr = node.next;
    }
    return {addr, sum};
}

Result<Chase> Chase::open(Client& client, std::vector<Target> agents) {
    if (agents.empty() || agents.size() > (1u << 15))
        return fail(Errc::invalid_argument, "a chase needs between 1 and 32768 agents");
    std::vector<RemoteRegion> regions;
    for (const auto& a : agents) {
        auto r = client.region(a, BS_CHASE_REGION);
        if (!r) return tl::make_unexpected(r.error());
        regions.push_back(std::move(*r));
    }
    return Chase(client, std::move(agents), std::move(regions));
}

Result<void> Chase::load(const ChaseList& list) {
    if (list.agents() != agents_.size())
        return fail(Errc::invalid_argument, fmt::format("list is for {} agents, chase has {}", list.agents(), agents_.size()));
    // The agent's region was zeroed at creation and the PUTs write every byte of the shard, so
    // its pages are touched before any strategy is timed.
    for (unsigned a = 0; a < list.agents(); ++a)
        if (auto r = fill_region(*client_, regions_[a], std::as_bytes(std::span(list.shard(a))), agents_[a].info()); !r)
            return r;
    return {};
}

Future Chase::start(Strategy strategy, std::uint64_t start, std::uint64_t depth) {
    bs_chase_args args{start, depth, 0};
    auto owner = BS_CHASE_OWNER(start);
    ShipOptions options;
    // One agent holds every node: no peer table, so the RUN carries no reply-to address and
    // peer list (a few hundred bytes) and the kernel answers its caller as any call does.
    if (agents_.size() > 1) options.peers = agents_;
    // Each hop can cross agents at most once: depth forwards suffice.
    options.hop_budget = static_cast<std::uint16_t>(std::min<std::uint64_t>(depth + 1, 0xffff));
    const Target& first = agents_[owner < agents_.size() ? owner : 0];
    if (strategy == Strategy::reship) {
        // The walk's state is its args; {state, come_back = 1} asks the kernel to come back.
        const std::uint64_t come_back = 1;
        Bytes suffix(sizeof come_back);
        std::memcpy(suffix.data(), &come_back, sizeof come_back);
        static_assert(sizeof(bs_chase_come_back) == sizeof(bs_chase_args) + sizeof come_back);
        return come_back_walk(*client_, xrdma_kernels::chase, agents_, bytes_of(args),
                              {sizeof(bs_chase_result), sizeof(bs_chase_args), offsetof(bs_chase_args, addr), std::move(suffix)});
    }
    switch (strategy) {
    case Strategy::xrdma: return client_->ship_bytes(xrdma_kernels::chase, first, bytes_of(args), options);
    case Strategy::native: return client_->ship_native("chase", first, bytes_of(args), options);
    case Strategy::get:
    case Strategy::reship: break;
    }
    // One GET per hop from the progress thread: the best a client-driven walk can do.
    struct Walk {
        std::uint64_t addr, remaining, sum = 0;
        bool started = false;
    };
    auto walk = std::make_shared<Walk>(Walk{start, depth});
    return client_->get_chain([this, walk](std::span<const std::byte> last, Bytes& result) -> std::optional<GetStep> {
        if (walk->started) {
            bs_chase_node node;
            std::memcpy(&node, last.data(), sizeof node);
            walk->sum += node.payload;
            walk->addr = node.next;
            --walk->remaining;
        }
        walk->started = true;
        if (walk->remaining == 0) {
            bs_chase_result out{walk->addr, walk->sum};
            result.resize(sizeof out);
            std::memcpy(result.data(), &out, sizeof out);
            return std::nullopt;
        }
        auto owner = BS_CHASE_OWNER(walk->addr);
        if (owner >= regions_.size()) return GetStep{nullptr, 0, 0};
        return GetStep{&regions_[owner], BS_CHASE_OFFSET(walk->addr), sizeof(bs_chase_node)};
    });
}

Result<bs_chase_result> Chase::run(Strategy strategy, std::uint64_t start, std::uint64_t depth) {
    auto bytes = this->start(strategy, start, depth).get();
    if (!bytes) return tl::make_unexpected(bytes.error());
    if (bytes->size() != sizeof(bs_chase_result))
        return fail(Errc::malformed_message, fmt::format("chase answered {} bytes, expected {}", bytes->size(), sizeof(bs_chase_result)));
    bs_chase_result out;
    std::memcpy(&out, bytes->data(), sizeof out);
    return out;
}

} // namespace bitship::xrdma
