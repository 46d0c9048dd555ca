#include "breakpoints.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace bitship::xrdma {
namespace {

constexpr double kPointsPerOctave = 16;

Strategy cheapest(const OpModel& model, const Op& op, std::uint64_t size, bool cached, std::span<const Strategy> allowed) {
    const auto work = op.work(size);
    Strategy best = allowed.front();
    double best_ns = std::numeric_limits<double>::infinity();
    for (auto s : allowed) {
        const double ns = estimate_ns(model, s, work, cached);
        if (ns < best_ns) {
            best_ns = ns;
            best = s;
        }
    }
    return best;
}

} // namespace

Breakpoints Breakpoints::compute(const OpModel& model, const Op& op, std::uint64_t lo, std::uint64_t hi, bool cached,
                                 std::span<const Strategy> allowed) {
    if (allowed.empty() || lo == 0 || hi < lo) return {};
    std::vector<Segment> segments{{lo, cheapest(model, op, lo, cached, allowed)}};
    const double step = std::exp2(1.0 / kPointsPerOctave);
    std::uint64_t prev = lo;
    for (double x = static_cast<double>(lo) * step;; x *= step) {
        const auto size = std::min<std::uint64_t>(hi, static_cast<std::uint64_t>(std::llround(x)));
        if (size <= prev) continue;
        const auto s = cheapest(model, op, size, cached, allowed);
        if (s != segments.back().strategy) {
            // The smallest size in (prev, size] where `s` is cheapest.
            std::uint64_t a = prev, b = size;
            while (b - a > 1) {
                const auto mid = a + (b - a) / 2;
                (cheapest(model, op, mid, cached, allowed) == s ? b : a) = mid;
            }
            segments.push_back({b, s});
        }
        prev = size;
        if (size >= hi) break;
    }
    return {lo, hi, std::move(segments)};
}

std::optional<std::uint64_t> Breakpoints::nearest(std::uint64_t size) const noexcept {
    std::optional<std::uint64_t> best;
    for (std::size_t i = 1; i < segments_.size(); ++i) {
        const auto b = segments_[i].from;
        const auto d = [&](std::uint64_t v) { return v > size ? v - size : size - v; };
        if (!best || d(b) < d(*best)) best = b;
    }
    return best;
}

} // namespace bitship::xrdma
