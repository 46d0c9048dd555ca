#pragma once
// bench/planner's grid points and what is made of them once the grid has run: the crossovers
// measured along each row, the CSV, and the verdict against the targets (and the asleep
// rows apart). planner.cpp runs the grid.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "stats.hpp"
#include "strategy.hpp"

namespace bitship::bench::planner_grid {

using xrdma::Strategy;

/// One grid point: every strategy forced, and the planner's own runs.
struct Point {
    std::string op, transport, code, load;
    unsigned agents = 0;
    std::uint64_t size = 0;
    std::map<Strategy, bench::Summary> forced;
    std::map<Strategy, double> predicted_ns; ///< at no load, by the planner's model
    bench::Summary planned;
    std::map<Strategy, int> choices;
    Strategy oracle = Strategy::get;
    Strategy choice = Strategy::get; ///< the planner's most frequent choice
    Strategy by_breakpoints = Strategy::get; ///< the breakpoints' choice (an awake, unloaded owner's)
    double regret = 1;               ///< forced median of the choice ÷ the oracle's
    double planned_regret = 1;       ///< the planner's own runs ÷ the oracle's
    std::uint64_t crossover = 0;     ///< the first predicted crossover of its row (0: none)
};

/// A predicted crossover of one row (op, transport, agents, code), and what the grid measured.
struct Crossover {
    std::string op, transport;
    unsigned agents;
    std::string code;
    Strategy a, b;
    double predicted;                ///< by the calibration's model, before the row (model_crossing: between whole sizes)
    std::uint64_t first_size = 0;    ///< the breakpoints' first size of `b`
    std::optional<double> measured;
    std::optional<double> refit;     ///< by the planner's model after the idle row's runs refitted it
    std::optional<double> gap;       ///< |log| of a's and b's measured ratio at the predicted size
    double spread = 0;               ///< the largest |log| of that ratio along the row
};

/// Each crossover's measured place and gaps, from the idle row it belongs to.
void measure_crossovers(std::vector<Crossover>& crossovers, std::vector<Point>& points);
/// One row per point and forced strategy, and one for the planner's runs.
void write_points_csv(const std::string& path, const std::vector<Point>& points);
/// Accuracy, regret, model error and crossovers over the idle and busy points; the asleep
/// points (each run after `asleep_us` idle) apart, beside the breakpoints' own choice.
void print_verdict(const std::vector<Point>& points, const std::vector<Crossover>& crossovers, int asleep_us);

} // namespace bitship::bench::planner_grid
