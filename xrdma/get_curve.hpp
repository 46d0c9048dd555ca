#pragma once
// What a GET costs beyond the smallest one, against its size: a curve through sizes the link
// probe measured, where one bulk figure (ns a byte of a 256 KiB GET) would be a straight line.
// The cost is not straight. Over UCX's TCP transport here (bench/get_sizes,
// bench/results/get_sizes_amd_20261204.txt) a GET up to 7 KiB costs 0.3-0.4 ns a byte beyond
// the 8-byte one, at 8 KiB it jumps by 5 µs (the reply no longer fits one segment) and goes on at
// about 0.7 ns a byte; a line through the bulk figure charged a 4-7 KiB GET 2-3.5 µs too much,
// against a whole GET of 11-13 µs, which is where reduce and filter cross from GET to shipping.
//
//   GetCurve c;                       // the probe's medians, less the 8-byte GET's
//   c.add(1024, 420); c.add(8192, 7600); ...
//   c.make_monotone();
//   c.extra_ns(6000, per_byte)        // interpolated; past the last point, its last slope

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace bitship::xrdma {

struct GetPoint {
    std::uint32_t bytes = 0;
    double extra_ns = 0; ///< beyond the smallest (8-byte) GET
};

class GetCurve {
public:
    /// The sizes a link probe measures below `bulk_bytes` (its bulk GET's size, itself the
    /// curve's last point): half octaves from 1 KiB up to 64 KiB.
    [[nodiscard]] static std::vector<std::uint32_t> ladder(std::uint32_t bulk_bytes);
    /// Adds (or replaces) the point at `bytes`; points stay sorted by size.
    void add(std::uint32_t bytes, double extra_ns);
    /// No point dearer than one at a larger size (a larger GET never costs less: the dearer
    /// one was timed in a slow moment, and the noise of a loaded host only ever adds), none
    /// below 0.
    void make_monotone() noexcept;
    /// A GET of `bytes` beyond the 8-byte one: linear between (8 B, 0) and the points, and past
    /// the last point at the slope of the last two (`per_byte` where there is one point).
    /// Empty: `bytes` × `per_byte`, the straight line.
    [[nodiscard]] double extra_ns(double bytes, double per_byte) const noexcept;
    /// Where two neighbouring points below the last hold a step (the cost rises between them
    /// by more than `min_step_ns` beyond what the segments on either side rise for as many
    /// bytes), narrows
    /// it by bisection: `steps` times, `measure(bytes)` (a GET's cost beyond the 8-byte one)
    /// at the middle of the two points around it, each added. Returns the measurements made.
    unsigned refine_step(const std::function<double(std::uint32_t)>& measure, double min_step_ns, unsigned steps);

    /// Points at every size of any of `curves`, each the mean (or the least) of what the
    /// curves give there; `per_byte[i]` extrapolates `curves[i]`.
    enum class Combine { mean, least };
    [[nodiscard]] static GetCurve combine(std::span<const GetCurve* const> curves, std::span<const double> per_byte, Combine how);

    [[nodiscard]] bool empty() const noexcept { return points_.empty(); }
    [[nodiscard]] const std::vector<GetPoint>& points() const noexcept { return points_; }

    /// At most this many points in a wisdom line (one that claims more is not read): an agent's
    /// probe gives some twenty, and a combined curve takes every agent's sizes.
    static constexpr std::size_t kMaxPoints = 1024;

private:
    std::vector<GetPoint> points_;
};

} // namespace bitship::xrdma
