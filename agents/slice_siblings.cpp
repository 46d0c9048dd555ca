#include "slice_siblings.hpp"

#include <fmt/format.h>

namespace bitship::agent {

void SliceSiblings::remember(const CodeHash& hash, std::span<const std::byte> bundle) {
    if (bundles_.contains(hash) || bundle.size() > kMaxBytes) return;
    auto view = BundleView::parse(bundle); // checks every slice against its hash
    if (!view || view->slices.size() < 2) return;
    Kept kept;
    bool has_hash = false;
    for (const auto& s : view->slices) {
        has_hash = has_hash || s.hash == hash;
        kept.slices.emplace_back(normalise_triple(s.triple), s.hash);
    }
    if (!has_hash) return;
    kept.triples = view->triples();
    kept.bundle = std::make_shared<const std::vector<std::byte>>(bundle.begin(), bundle.end());
    while (!order_.empty() && (order_.size() >= kMaxBundles || bytes_ + bundle.size() > kMaxBytes)) {
        auto it = bundles_.find(order_.front());
        bytes_ -= it->second.bundle->size();
        bundles_.erase(it);
        order_.pop_front();
    }
    bundles_.emplace(hash, std::move(kept));
    order_.push_back(hash);
    bytes_ += bundle.size();
}

// Once per forward that crosses architectures: a lookup, no parsing or hashing.
Result<SliceSiblings::Sibling> SliceSiblings::for_triple(const CodeHash& hash, std::string_view triple) const {
    auto it = bundles_.find(hash);
    if (it == bundles_.end())
        return fail(Errc::no_matching_slice,
                    fmt::format("kernel {} came here with its own slice only, so there is none for {} (a call "
                                "that may forward ships every slice; was this agent sent the code without peers?)",
                                to_hex(hash, 16), triple));
    const auto wanted = normalise_triple(triple);
    for (const auto& [slice_triple, slice_hash] : it->second.slices)
        if (slice_triple == wanted) return Sibling{slice_hash, it->second.bundle};
    return fail(Errc::no_matching_slice, fmt::format("bundle of kernel {} has slices for [{}]; the peer runs {}",
                                                     to_hex(hash, 16), it->second.triples, triple));
}

Result<SliceSiblings::Retargeted> SliceSiblings::retarget(const wire::Encoded& run, std::uint64_t id,
                                                          std::string_view peer_triple) const {
    auto m = wire::decode(run.header, run.payload);
    if (!m) return tl::make_unexpected(m.error());
    auto body = std::get<wire::Run>(m->body); // views into run.payload, which outlives the encode
    auto sibling = for_triple(body.hash, peer_triple);
    if (!sibling) return tl::make_unexpected(sibling.error());
    body.hash = sibling->hash;
    return Retargeted{wire::encode_run(id, body), sibling->hash, sibling->bundle};
}

} // namespace bitship::agent
