#include "planner_verdict.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace bitship::bench::planner_grid {
namespace {

/// log(a's measured median ÷ b's) at `p`: negative where `a` is the faster.
double log_ratio(const Point* p, Strategy a, Strategy b) { return std::log(p->forced.at(a).median / p->forced.at(b).median); }

/// Where the fastest of `a` and `b` changes, from measured medians along sizes (geometric
/// interpolation of the ratio between the two grid points it falls between); nullopt if it
/// does not change, or changes more than once.
std::optional<double> measured_crossover(const std::vector<Point*>& row, Strategy a, Strategy b) {
    std::optional<double> found;
    for (std::size_t i = 1; i < row.size(); ++i) {
        const double r0 = log_ratio(row[i - 1], a, b), r1 = log_ratio(row[i], a, b);
        if ((r0 < 0) == (r1 < 0)) continue;
        if (found) return std::nullopt;
        const double l0 = std::log2(double(row[i - 1]->size)), l1 = std::log2(double(row[i]->size));
        found = std::exp2(l0 + (l1 - l0) * (r0 / (r0 - r1)));
    }
    return found;
}

/// How far apart `a` and `b` measure at `size` (|log| of the ratio of their medians,
/// interpolated in log size between the grid points around it); nullopt outside the row.
std::optional<double> gap_at(const std::vector<Point*>& row, Strategy a, Strategy b, double size) {
    for (std::size_t i = 1; i < row.size(); ++i) {
        const double s0 = double(row[i - 1]->size), s1 = double(row[i]->size);
        if (size < s0 || size > s1) continue;
        const double t = s1 > s0 ? std::log(size / s0) / std::log(s1 / s0) : 0;
        const double r0 = log_ratio(row[i - 1], a, b), r1 = log_ratio(row[i], a, b);
        return std::abs(r0 + t * (r1 - r0));
    }
    return std::nullopt;
}

} // namespace

void measure_crossovers(std::vector<Crossover>& crossovers, std::vector<Point>& points) {
    // Measured crossovers: along each (op, transport, agents, code) row at idle load.
    for (auto& c : crossovers) {
        std::vector<Point*> row;
        for (auto& p : points)
            if (p.op == c.op && p.transport == c.transport && p.agents == c.agents && p.code == c.code && p.load == "idle")
                row.push_back(&p);
        std::sort(row.begin(), row.end(), [](const Point* a, const Point* b) { return a->size < b->size; });
        for (const Point* p : row) c.spread = std::max(c.spread, std::abs(log_ratio(p, c.a, c.b)));
        if (row.size() < 2) continue;
        c.measured = measured_crossover(row, c.a, c.b);
        c.gap = gap_at(row, c.a, c.b, c.predicted);
    }
}

void write_points_csv(const std::string& path, const std::vector<Point>& points) {
    // The CSV: one row per point and strategy (forced), and the planner's.
    std::vector<bench::Row> rows;
    for (const auto& p : points) {
        auto labels = [&](const std::string& strategy) {
            return std::vector<std::pair<std::string, std::string>>{
                {"op", p.op}, {"transport", p.transport}, {"agents", std::to_string(p.agents)}, {"code", p.code},
                {"load", p.load}, {"size", std::to_string(p.size)}, {"strategy", strategy}};
        };
        for (const auto& [s, sum] : p.forced)
            rows.push_back({labels(std::string(to_string(s))), sum,
                            {{"predicted_us", p.predicted_ns.at(s) / 1e3}, {"oracle", s == p.oracle ? 1.0 : 0.0},
                             {"chosen", s == p.choice ? 1.0 : 0.0}, {"regret", sum.median / p.forced.at(p.oracle).median},
                             {"crossover", double(p.crossover)}, {"by_breakpoints", s == p.by_breakpoints ? 1.0 : 0.0}}});
        rows.push_back({labels("planner"), p.planned,
                        {{"predicted_us", p.predicted_ns.at(p.choice) / 1e3}, {"oracle", 0.0}, {"chosen", 0.0},
                         {"regret", p.planned_regret}, {"crossover", double(p.crossover)}, {"by_breakpoints", 0.0}}});
    }
    bench::write_csv(path, rows);
}

void print_verdict(const std::vector<Point>& points, const std::vector<Crossover>& crossovers, int asleep_us) {
    // The verdict: the grid (idle and busy), then the asleep rows apart.
    std::size_t within = 0, judged = 0;
    double log_sum = 0, worst = 1, planned_log_sum = 0, planned_worst = 1;
    for (const auto& p : points) {
        if (p.load == "asleep") continue;
        ++judged;
        within += p.regret <= 1.05;
        log_sum += std::log(p.regret);
        worst = std::max(worst, p.regret);
        planned_log_sum += std::log(p.planned_regret);
        planned_worst = std::max(planned_worst, p.planned_regret);
    }
    const double np = std::max<double>(judged, 1);
    fmt::print("\n{} points (idle and busy; the asleep rows apart, below)\n", judged);
    fmt::print("decision accuracy: {:.1f}% of points within 1.05× of the oracle (target ≥ 95%)\n", 100.0 * within / np);
    fmt::print("regret (forced median of the choice ÷ oracle): geometric mean {:.3f} (target ≤ 1.03), worst {:.3f} (≤ 1.5)\n",
               std::exp(log_sum / np), worst);
    fmt::print("regret (the planner's own runs ÷ oracle):      geometric mean {:.3f}, worst {:.3f}\n", std::exp(planned_log_sum / np),
               planned_worst);
    {
        // Asleep: the planner's choice (the wake-up weighed) against the breakpoints' alone.
        std::size_t n = 0, in = 0, in_bp = 0, moved = 0;
        double lg = 0, lg_bp = 0, w = 1, w_bp = 1;
        for (const auto& p : points) {
            if (p.load != "asleep") continue;
            const double bp_regret = p.forced.at(p.by_breakpoints).median / p.forced.at(p.oracle).median;
            ++n;
            in += p.regret <= 1.05;
            in_bp += bp_regret <= 1.05;
            moved += p.choice != p.by_breakpoints;
            lg += std::log(p.regret);
            lg_bp += std::log(bp_regret);
            w = std::max(w, p.regret);
            w_bp = std::max(w_bp, bp_regret);
        }
        if (n > 0) {
            const double dn = static_cast<double>(n);
            fmt::print("asleep ({} points, each run after {} us idle): the planner within 1.05× of the oracle at {:.1f}%, regret "
                       "geometric mean {:.3f}, worst {:.3f}; the breakpoints alone (as if awake) {:.1f}%, {:.3f}, {:.3f}; "
                       "the wake-up moved the choice at {} points\n",
                       n, asleep_us, 100.0 * in / dn, std::exp(lg / dn), w, 100.0 * in_bp / dn, std::exp(lg_bp / dn), w_bp, moved);
        }
    }
    for (auto s : kAllStrategies) {
        std::vector<double> errs;
        for (const auto& p : points)
            if (p.load == "idle" && p.forced.contains(s)) errs.push_back(std::abs(p.predicted_ns.at(s) / 1e3 - p.forced.at(s).median) / p.forced.at(s).median);
        std::sort(errs.begin(), errs.end());
        if (!errs.empty())
            fmt::print("model error {:<6}: median {:.1f}% (target ≤ 25%), p90 {:.1f}% over {} idle points\n", to_string(s),
                       100 * errs[errs.size() / 2], 100 * errs[errs.size() * 9 / 10], errs.size());
    }
    // Placed within half an octave: by the calibration's model, and by the model the planner
    // chooses with after the row's runs (running figures refit it every PlannerOptions::refit_every).
    std::size_t placed = 0, placed_whole = 0, placed_refit = 0, rated = 0, near_tie = 0;
    auto octaves = [](std::optional<double> predicted, std::optional<double> measured) {
        return predicted && measured ? std::abs(std::log2(*predicted / *measured)) : HUGE_VAL;
    };
    auto refit_text = [&](const Crossover& c) {
        std::string text = !c.refit     ? std::string("; after the row's refits the planner has no such crossover")
                           : !c.measured ? fmt::format("; after the row's refits {:.1f}", *c.refit)
                                         : fmt::format("; after the row's refits {:.1f}: {:.2f} octaves", *c.refit, octaves(c.refit, c.measured));
        if (c.gap) text += fmt::format("; at the predicted size the two measure {:.0f}% apart", 100 * (std::exp(*c.gap) - 1));
        return text;
    };
    for (const auto& c : crossovers) {
        // Two strategies within 10% of each other all along the row have no crossover to place.
        if (c.spread < std::log(1.1)) {
            fmt::print("crossover {} {}×{} {} {}→{}: predicted {:.1f}; the two are within 10% all along the row (a tie)\n", c.op,
                       c.transport, c.agents, c.code, to_string(c.a), to_string(c.b), c.predicted);
            continue;
        }
        ++rated;
        placed += octaves(c.predicted, c.measured) <= 0.5;
        placed_whole += octaves(double(c.first_size), c.measured) <= 0.5;
        placed_refit += octaves(c.refit, c.measured) <= 0.5;
        near_tie += octaves(c.predicted, c.measured) > 0.5 && c.gap && *c.gap < std::log(1.1);
        if (c.measured)
            fmt::print("crossover {} {}×{} {} {}→{}: predicted {:.1f} ({} from {}), measured {:.1f}: {:.2f} octaves (target ≤ 0.5){}\n",
                       c.op, c.transport, c.agents, c.code, to_string(c.a), to_string(c.b), c.predicted, to_string(c.b), c.first_size,
                       *c.measured, octaves(c.predicted, c.measured), refit_text(c));
        else
            fmt::print("crossover {} {}×{} {} {}→{}: predicted {:.1f} ({} from {}), not seen once in the measured grid{}\n", c.op,
                       c.transport, c.agents, c.code, to_string(c.a), to_string(c.b), c.predicted, to_string(c.b), c.first_size,
                       refit_text(c));
    }
    if (rated > 0)
        fmt::print("crossovers within half an octave of the measured one: {} of {} as calibrated, {} after the rows' refits "
                   "(ties left out; {} by the breakpoints' first whole size instead of the model's crossing); of the {} others, "
                   "{} where the two measure within 10% of each other at the predicted size\n",
                   placed, rated, placed_refit, placed_whole, rated - placed, near_tie);
}

} // namespace bitship::bench::planner_grid
