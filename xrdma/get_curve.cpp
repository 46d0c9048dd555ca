#include "get_curve.hpp"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <set>

namespace bitship::xrdma {
namespace {

constexpr double kSmallest = 8; ///< the GET the curve's costs are beyond (link_probe's small GET)

/// The slope from `a` to `b` (never below 0).
double slope(double a_bytes, double a_ns, double b_bytes, double b_ns) noexcept {
    return b_bytes > a_bytes ? std::max(0.0, (b_ns - a_ns) / (b_bytes - a_bytes)) : 0.0;
}

} // namespace

std::vector<std::uint32_t> GetCurve::ladder(std::uint32_t bulk_bytes) {
    std::vector<std::uint32_t> out;
    for (double b = 1024; b <= 65536.5 && b < bulk_bytes; b *= std::sqrt(2.0)) {
        const auto rounded = static_cast<std::uint32_t>(std::llround(b / 8) * 8);
        if (out.empty() || rounded != out.back()) out.push_back(rounded);
    }
    return out;
}

void GetCurve::add(std::uint32_t bytes, double extra_ns) {
    auto at = std::lower_bound(points_.begin(), points_.end(), bytes, [](const GetPoint& p, std::uint32_t b) { return p.bytes < b; });
    if (at != points_.end() && at->bytes == bytes) {
        at->extra_ns = extra_ns;
        return;
    }
    points_.insert(at, GetPoint{bytes, extra_ns});
}

void GetCurve::make_monotone() noexcept {
    // From the largest size down: a point dearer than a larger size's was timed in a slow
    // moment (the noise of a loaded host only ever adds), and takes that size's cost.
    double most = std::numeric_limits<double>::infinity();
    for (auto p = points_.rbegin(); p != points_.rend(); ++p) {
        p->extra_ns = std::clamp(p->extra_ns, 0.0, most);
        most = p->extra_ns;
    }
}

double GetCurve::extra_ns(double bytes, double per_byte) const noexcept {
    if (points_.empty()) return bytes * per_byte;
    if (bytes <= kSmallest) return 0;
    if (const auto& first = points_.front(); bytes <= static_cast<double>(first.bytes)) // a walk's GETs: no search
        return (bytes - kSmallest) / (static_cast<double>(first.bytes) - kSmallest) * first.extra_ns;
    // The first point at or above `bytes` (a loaded owner's choose() estimates a GET: a scan of
    // a four-agent curve's thirty points cost more than the rest of the choice).
    const auto at = std::lower_bound(points_.begin(), points_.end(), bytes,
                                     [](const GetPoint& p, double b) { return static_cast<double>(p.bytes) < b; });
    if (at != points_.end()) { // past the first point
        const double prev_bytes = static_cast<double>(std::prev(at)->bytes);
        const double prev_ns = std::prev(at)->extra_ns;
        const double t = (bytes - prev_bytes) / (static_cast<double>(at->bytes) - prev_bytes);
        return prev_ns + t * (at->extra_ns - prev_ns);
    }
    // Past the last point: the last segment's slope (a GET of many segments costs by the byte).
    const auto& last = points_.back();
    const double beyond = points_.size() >= 2
                              ? slope(points_[points_.size() - 2].bytes, points_[points_.size() - 2].extra_ns, last.bytes, last.extra_ns)
                              : per_byte;
    return last.extra_ns + (bytes - static_cast<double>(last.bytes)) * beyond;
}

unsigned GetCurve::refine_step(const std::function<double(std::uint32_t)>& measure, double min_step_ns, unsigned steps) {
    if (points_.size() < 2 || steps == 0) return 0;
    // The segment whose rise most exceeds what its neighbours' slopes give for its bytes.
    auto point = [&](std::ptrdiff_t i) {
        return i < 0 ? GetPoint{static_cast<std::uint32_t>(kSmallest), 0.0} : points_[static_cast<std::size_t>(i)];
    };
    std::ptrdiff_t best = -1;
    double best_excess = min_step_ns;
    // Not the last segment (to the bulk GET, four times the ladder's top): a step is sought where
    // the ladder measured closely.
    const auto n = static_cast<std::ptrdiff_t>(points_.size()) - 1;
    for (std::ptrdiff_t i = 0; i + 1 < n; ++i) {
        const GetPoint a = point(i), b = point(i + 1), before = point(i - 1);
        double reference = slope(before.bytes, before.extra_ns, a.bytes, a.extra_ns);
        if (i + 2 < n) reference = std::min(reference, slope(b.bytes, b.extra_ns, point(i + 2).bytes, point(i + 2).extra_ns));
        const double excess = (b.extra_ns - a.extra_ns) - reference * (static_cast<double>(b.bytes) - a.bytes);
        if (excess > best_excess) {
            best_excess = excess;
            best = i;
        }
    }
    if (best < 0) return 0;
    GetPoint lo = point(best), hi = point(best + 1);
    unsigned measured = 0;
    for (unsigned k = 0; k < steps; ++k) {
        const auto mid = static_cast<std::uint32_t>(std::llround((static_cast<double>(lo.bytes) + hi.bytes) / 16.0) * 8);
        if (mid <= lo.bytes || mid >= hi.bytes) break;
        const double ns = measure(mid);
        ++measured;
        add(mid, ns);
        // Below the step's middle: the step is above `mid`.
        if (ns - lo.extra_ns < (hi.extra_ns - lo.extra_ns) / 2)
            lo = GetPoint{mid, ns};
        else
            hi = GetPoint{mid, ns};
    }
    return measured;
}

GetCurve GetCurve::combine(std::span<const GetCurve* const> curves, std::span<const double> per_byte, Combine how) {
    GetCurve out;
    std::set<std::uint32_t> sizes;
    for (const auto* c : curves)
        for (const auto& p : c->points()) sizes.insert(p.bytes);
    for (auto b : sizes) {
        double sum = 0, least = std::numeric_limits<double>::infinity();
        for (std::size_t i = 0; i < curves.size(); ++i) {
            const double v = curves[i]->extra_ns(b, i < per_byte.size() ? per_byte[i] : 0.0);
            sum += v;
            least = std::min(least, v);
        }
        out.points_.push_back({b, how == Combine::mean ? sum / static_cast<double>(curves.size()) : least});
    }
    out.make_monotone();
    return out;
}

} // namespace bitship::xrdma
