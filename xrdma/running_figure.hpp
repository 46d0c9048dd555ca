#pragma once
// A cost figure (a latency, a per-byte time) kept up to date from the calls that really ran:
// the planner's models read these instead of one probe's numbers.

#include <array>
#include <cstddef>

namespace bitship::xrdma {

/// A figure refreshed from real calls: an exponentially weighted mean, and the median and p95
/// of the last kWindow samples. Not thread-safe: one owner, or the owner's lock.
///
/// @code
///   RunningFigure rtt;
///   rtt.add(19'400);          // ns, one call's round trip
///   auto typical = rtt.p50(); // the median of the last 64
/// @endcode
class RunningFigure {
public:
    static constexpr std::size_t kWindow = 64;
    static constexpr double kDefaultWeight = 0.125;

    /// `weight`: how much each new sample moves the mean, in (0, 1].
    explicit RunningFigure(double weight = kDefaultWeight) noexcept;

    /// Adds one sample (the first one sets the mean). The window is kept sorted as well, a
    /// sample in and the oldest out (two binary searches and a move of at most kWindow
    /// doubles): sorting it afresh on every add was most of a planner run's own cost, 0.7 of
    /// 1.1 µs over a 0.34 µs GET of mapped memory (bench/results/planner_run_cost_20261202.txt).
    /// A sample that is not finite is ignored.
    void add(double sample) noexcept;
    /// The exponentially weighted mean; 0 before any sample.
    [[nodiscard]] double mean() const noexcept { return mean_; }
    /// The median of the last kWindow samples (linear interpolation between the two middle
    /// ones for an even count); 0 before any sample. Worked out by add(), so reading it is a
    /// load: the planner's choose() reads it on every call while the owner is loaded.
    [[nodiscard]] double p50() const noexcept { return p50_; }
    /// The 95th percentile of the last kWindow samples, interpolated the same way.
    [[nodiscard]] double p95() const { return percentile(0.95); }
    /// Samples added in all (not only those in the window).
    [[nodiscard]] std::size_t count() const noexcept { return count_; }
    /// The `q` quantile (0..1) of the window: sorted[q·(n−1)], interpolated.
    [[nodiscard]] double percentile(double q) const noexcept;

private:
    double weight_;
    double mean_ = 0;
    std::size_t count_ = 0;
    std::array<double, kWindow> window_{}; ///< in arrival order, a ring
    std::array<double, kWindow> sorted_{}; ///< the same samples in order, [0, min(count_, kWindow))
    double p50_ = 0;
};

} // namespace bitship::xrdma
