#include "running_figure.hpp"

#include <algorithm>
#include <cmath>

namespace bitship::xrdma {

RunningFigure::RunningFigure(double weight) noexcept
    : weight_(weight > 0 && weight <= 1 ? weight : kDefaultWeight) {}

void RunningFigure::add(double sample) noexcept {
    mean_ = count_ == 0 ? sample : mean_ + weight_ * (sample - mean_);
    window_[count_ % kWindow] = sample;
    ++count_;
    p50_ = percentile(0.50);
}

double RunningFigure::percentile(double q) const {
    const std::size_t n = std::min(count_, kWindow);
    if (n == 0) return 0;
    std::array<double, kWindow> sorted = window_;
    std::sort(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(n));
    const double at = std::clamp(q, 0.0, 1.0) * static_cast<double>(n - 1);
    const auto below = static_cast<std::size_t>(std::floor(at));
    const auto above = std::min(below + 1, n - 1);
    return sorted[below] + (at - static_cast<double>(below)) * (sorted[above] - sorted[below]);
}

} // namespace bitship::xrdma
