#pragma once
// What every benchmark prints and writes: per-row summaries of repeated timings, and the
// rows as CSV or JSON.

#include <cstddef>
#include <string>
#include <vector>

namespace bitship::bench {

struct Summary {
    std::size_t n = 0;
    double median = 0, p99 = 0, min = 0, max = 0, mean = 0; ///< microseconds
};

/// Summarises samples given in microseconds.
Summary summarise(std::vector<double> samples_us);

/// One output row: named string columns, then the summary.
struct Row {
    std::vector<std::pair<std::string, std::string>> labels;
    Summary summary;
    std::vector<std::pair<std::string, double>> extra; ///< further numeric columns
};

void write_csv(const std::string& path, const std::vector<Row>& rows);
void write_json(const std::string& path, const std::string& benchmark, const std::vector<std::pair<std::string, std::string>>& config,
                const std::vector<Row>& rows);

/// "AMD EPYC 9R14 (2 cores)" from /proc/cpuinfo.
std::string cpu_description();

} // namespace bitship::bench
