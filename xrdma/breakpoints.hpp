#pragma once
// Breakpoints: the sizes, within an operation's declared range, where the cheapest strategy
// changes, worked out ahead of time from the cost model, so that choosing at run time is a
// lookup (a handful of sorted sizes) and not a model evaluation.

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "cost_model.hpp"

namespace bitship::xrdma {

class Breakpoints {
public:
    /// From `from` on (up to the next segment), `strategy` is cheapest.
    struct Segment {
        std::uint64_t from = 0;
        Strategy strategy = Strategy::get;
        friend bool operator==(const Segment&, const Segment&) = default;
    };

    Breakpoints() = default;
    /// Segments sorted by `from`, the first at `lo`.
    Breakpoints(std::uint64_t lo, std::uint64_t hi, std::vector<Segment> segments)
        : lo_(lo), hi_(hi), segments_(std::move(segments)) {}

    /// Scans [lo, hi] (16 points an octave, then bisects each change to the exact size) for
    /// the cheapest of `allowed` by `model`, with code `cached` or not, at no load.
    static Breakpoints compute(const OpModel& model, const Op& op, std::uint64_t lo, std::uint64_t hi, bool cached,
                               std::span<const Strategy> allowed);

    /// The cheapest strategy at `size` (sizes outside the range take its nearest end's).
    [[nodiscard]] Strategy at(std::uint64_t size) const noexcept {
        // A few segments at most: a linear scan beats a binary search here.
        Strategy s = segments_.empty() ? Strategy::get : segments_.front().strategy;
        for (const auto& seg : segments_) {
            if (seg.from > size) break;
            s = seg.strategy;
        }
        return s;
    }
    /// The breakpoint nearest `size`: where the choice at `size` begins or ends.
    [[nodiscard]] std::optional<std::uint64_t> nearest(std::uint64_t size) const noexcept;

    [[nodiscard]] std::uint64_t lo() const noexcept { return lo_; }
    [[nodiscard]] std::uint64_t hi() const noexcept { return hi_; }
    [[nodiscard]] const std::vector<Segment>& segments() const noexcept { return segments_; }
    [[nodiscard]] bool empty() const noexcept { return segments_.empty(); }

    friend bool operator==(const Breakpoints&, const Breakpoints&) = default;

private:
    std::uint64_t lo_ = 0, hi_ = 0;
    std::vector<Segment> segments_;
};

} // namespace bitship::xrdma
