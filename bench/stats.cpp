#include "stats.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numeric>
#include <thread>

#include <fmt/format.h>

namespace bitship::bench {

Summary summarise(std::vector<double> s) {
    Summary out;
    out.n = s.size();
    if (s.empty()) return out;
    std::sort(s.begin(), s.end());
    auto at = [&](double q) { return s[std::min(s.size() - 1, static_cast<std::size_t>(std::ceil(q * s.size())) - (q > 0 ? 1 : 0))]; };
    out.median = s.size() % 2 ? s[s.size() / 2] : (s[s.size() / 2 - 1] + s[s.size() / 2]) / 2;
    out.p99 = at(0.99);
    out.min = s.front();
    out.max = s.back();
    out.mean = std::accumulate(s.begin(), s.end(), 0.0) / static_cast<double>(s.size());
    return out;
}

void write_csv(const std::string& path, const std::vector<Row>& rows) {
    if (rows.empty()) return;
    std::ofstream out(path);
    for (const auto& [k, v] : rows[0].labels) out << k << ",";
    out << "n,median_us,p99_us,min_us,max_us,mean_us";
    for (const auto& [k, v] : rows[0].extra) out << "," << k;
    out << "\n";
    for (const auto& r : rows) {
        for (const auto& [k, v] : r.labels) out << v << ",";
        const auto& s = r.summary;
        out << fmt::format("{},{:.3f},{:.3f},{:.3f},{:.3f},{:.3f}", s.n, s.median, s.p99, s.min, s.max, s.mean);
        for (const auto& [k, v] : r.extra) out << fmt::format(",{:.3f}", v);
        out << "\n";
    }
}

void write_json(const std::string& path, const std::string& benchmark, const std::vector<std::pair<std::string, std::string>>& config,
                const std::vector<Row>& rows) {
    std::ofstream out(path);
    out << "{\n  \"benchmark\": \"" << benchmark << "\",\n  \"config\": {";
    for (std::size_t i = 0; i < config.size(); ++i)
        out << (i ? ", " : "") << "\"" << config[i].first << "\": \"" << config[i].second << "\"";
    out << "},\n  \"rows\": [\n";
    for (std::size_t i = 0; i < rows.size(); ++i) {
        const auto& r = rows[i];
        out << "    {";
        for (const auto& [k, v] : r.labels) out << "\"" << k << "\": \"" << v << "\", ";
        const auto& s = r.summary;
        out << fmt::format("\"n\": {}, \"median_us\": {:.3f}, \"p99_us\": {:.3f}, \"min_us\": {:.3f}, \"max_us\": {:.3f}, \"mean_us\": {:.3f}",
                           s.n, s.median, s.p99, s.min, s.max, s.mean);
        for (const auto& [k, v] : r.extra) out << fmt::format(", \"{}\": {:.3f}", k, v);
        out << "}" << (i + 1 < rows.size() ? "," : "") << "\n";
    }
    out << "  ]\n}\n";
}

std::string cpu_description() {
    std::ifstream in("/proc/cpuinfo");
    std::string line, model = "unknown CPU";
    while (std::getline(in, line)) {
        if (line.rfind("model name", 0) == 0) {
            model = line.substr(line.find(':') + 2);
            break;
        }
    }
    return fmt::format("{} ({} hardware threads)", model, std::thread::hardware_concurrency());
}

} // namespace bitship::bench
