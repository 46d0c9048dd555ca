#include "running_figure.hpp"

#include <algorithm>
#include <cmath>

namespace bitship::xrdma {

RunningFigure::RunningFigure(double weight) noexcept
    : weight_(weight > 0 && weight <= 1 ? weight : kDefaultWeight) {}

void RunningFigure::add(double sample) noexcept {
    if (!std::isfinite(sample)) return; // unordered: it would break the sorted window
    mean_ = count_ == 0 ? sample : mean_ + weight_ * (sample - mean_);
    auto& slot = window_[count_ % kWindow];
    auto* const first = sorted_.data();
    auto* last = first + std::min(count_, kWindow);
    if (count_ >= kWindow) { // the oldest sample leaves: it is in sorted_ (the same bits)
        auto* out = std::lower_bound(first, last, slot);
        std::move(out + 1, last, out);
        --last;
    }
    auto* in = std::upper_bound(first, last, sample);
    std::move_backward(in, last, last + 1);
    *in = sample;
    slot = sample;
    ++count_;
    p50_ = percentile(0.50);
}

double RunningFigure::percentile(double q) const noexcept {
    const std::size_t n = std::min(count_, kWindow);
    if (n == 0) return 0;
    const auto& sorted = sorted_;
    const double at = std::clamp(q, 0.0, 1.0) * static_cast<double>(n - 1);
    const auto below = static_cast<std::size_t>(std::floor(at));
    const auto above = std::min(below + 1, n - 1);
    return sorted[below] + (at - static_cast<double>(below)) * (sorted[above] - sorted[below]);
}

} // namespace bitship::xrdma
