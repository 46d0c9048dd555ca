#include "wisdom.hpp"

#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

namespace bitship::xrdma {
namespace {

constexpr std::string_view kMagic = "bitship-planner-wisdom";
constexpr int kVersion = 2;
constexpr std::uintmax_t kMaxFileBytes = 4u << 20;
constexpr std::size_t kMaxSegments = 64;

bool parse_strategy_name(const std::string& name, Strategy& out) {
    auto s = parse_strategy(name);
    if (!s) return false;
    out = *s;
    return true;
}

void write_breakpoints(std::ostringstream& out, const char* label, const Breakpoints& b) {
    out << ' ' << label << ' ' << b.segments().size();
    for (const auto& seg : b.segments()) out << ' ' << seg.from << ':' << to_string(seg.strategy);
}

bool read_breakpoints(std::istringstream& in, const char* label, std::uint64_t lo, std::uint64_t hi, Breakpoints& out) {
    std::string word;
    std::size_t n = 0;
    if (!(in >> word >> n) || word != label || n == 0 || n > kMaxSegments) return false;
    std::vector<Breakpoints::Segment> segments;
    for (std::size_t i = 0; i < n; ++i) {
        std::string seg;
        if (!(in >> seg)) return false;
        auto colon = seg.find(':');
        if (colon == std::string::npos) return false;
        Breakpoints::Segment s;
        char* end = nullptr;
        s.from = std::strtoull(seg.c_str(), &end, 10);
        if (end != seg.c_str() + colon || !parse_strategy_name(seg.substr(colon + 1), s.strategy)) return false;
        if (!segments.empty() && s.from <= segments.back().from) return false;
        segments.push_back(s);
    }
    if (segments.front().from != lo) return false;
    out = Breakpoints(lo, hi, std::move(segments));
    return true;
}

bool finite_nonnegative(double v) { return std::isfinite(v) && v >= 0; }

} // namespace

std::filesystem::path Wisdom::default_path() {
    if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg == '/')
        return std::filesystem::path(xdg) / "bitship" / "planner.wisdom";
    const char* home = std::getenv("HOME");
    return std::filesystem::path(home != nullptr && *home == '/' ? home : "/tmp") / ".cache" / "bitship" / "planner.wisdom";
}

std::string Wisdom::format(const std::string& key, const WisdomEntry& e) {
    std::ostringstream out;
    out.precision(17);
    auto link = [&](const char* label, const LinkFigures& l) {
        out << ' ' << label << ' ' << l.rtt_ns << ' ' << l.get_ns << ' ' << l.get_ns_per_byte << ' ' << (l.mapped ? 1 : 0);
        if (l.get_curve.empty()) return;
        out << " curve " << l.get_curve.points().size();
        for (const auto& p : l.get_curve.points()) out << ' ' << p.bytes << ' ' << p.extra_ns;
    };
    out << key;
    link("probed", e.probed);
    link("link", e.model.link);
    out << " fit";
    for (auto s : kAllStrategies) {
        const auto& f = e.model.fits[index_of(s)];
        out << ' ' << to_string(s) << ' ' << f.fixed_ns << ' ' << f.per_unit_ns << ' ' << (f.fitted ? 1 : 0);
    }
    out << " cold_ns " << e.model.cold_ns << " cold_next_ns " << e.model.cold_next_ns << " range " << e.cached.lo() << ' ' << e.cached.hi();
    write_breakpoints(out, "cached", e.cached);
    write_breakpoints(out, "cold", e.cold);
    return out.str();
}

std::optional<std::pair<std::string, WisdomEntry>> Wisdom::parse(const std::string& line) {
    std::istringstream in(line);
    std::string key, word;
    WisdomEntry e;
    auto link = [&](const char* label, LinkFigures& l) {
        int mapped = 0;
        if (!(in >> word) || word != label) return false;
        if (!(in >> l.rtt_ns >> l.get_ns >> l.get_ns_per_byte >> mapped) || (mapped != 0 && mapped != 1)) return false;
        l.mapped = mapped == 1;
        if (!finite_nonnegative(l.rtt_ns) || !finite_nonnegative(l.get_ns) || !finite_nonnegative(l.get_ns_per_byte)) return false;
        // The GET curve came later: a line without one reads as the straight line (no word of
        // this format but "curve" starts with a 'c' here: "link" or "fit" comes next).
        if (!(in >> std::ws) || in.peek() != 'c') return true;
        std::size_t n = 0;
        if (!(in >> word >> n) || word != "curve" || n == 0 || n > GetCurve::kMaxPoints) return false;
        std::uint32_t last = 0;
        for (std::size_t i = 0; i < n; ++i) {
            std::uint32_t bytes = 0;
            double extra = 0;
            if (!(in >> bytes >> extra) || bytes <= last || !finite_nonnegative(extra)) return false;
            l.get_curve.add(bytes, extra);
            last = bytes;
        }
        l.get_curve.make_monotone();
        return true;
    };
    if (!(in >> key) || !link("probed", e.probed) || !link("link", e.model.link)) return std::nullopt;
    if (!(in >> word) || word != "fit") return std::nullopt;
    // Fits by strategy name up to "cold_ns": each strategy at most once (a line written before
    // a strategy existed leaves it unfitted).
    std::array<bool, kStrategies> seen{};
    while (in >> word && word != "cold_ns") {
        Strategy s;
        if (!parse_strategy_name(word, s) || seen[index_of(s)]) return std::nullopt;
        seen[index_of(s)] = true;
        auto& f = e.model.fits[index_of(s)];
        int fitted = 0;
        if (!(in >> f.fixed_ns >> f.per_unit_ns >> fitted) || (fitted != 0 && fitted != 1)) return std::nullopt;
        if (!std::isfinite(f.fixed_ns) || !std::isfinite(f.per_unit_ns)) return std::nullopt;
        f.fitted = fitted == 1;
    }
    std::uint64_t lo = 0, hi = 0;
    if (word != "cold_ns" || !(in >> e.model.cold_ns) || !finite_nonnegative(e.model.cold_ns)) return std::nullopt;
    // cold_next_ns came later: a line without it reads as 0 (each agent at cold_ns).
    if (!(in >> word)) return std::nullopt;
    if (word == "cold_next_ns" && (!(in >> e.model.cold_next_ns >> word) || !finite_nonnegative(e.model.cold_next_ns)))
        return std::nullopt;
    if (!(in >> lo >> hi) || word != "range" || lo == 0 || hi < lo) return std::nullopt;
    if (!read_breakpoints(in, "cached", lo, hi, e.cached) || !read_breakpoints(in, "cold", lo, hi, e.cold)) return std::nullopt;
    if (in >> word) return std::nullopt; // trailing words: not this format
    return std::pair{std::move(key), std::move(e)};
}

Result<Wisdom> Wisdom::load(const std::filesystem::path& path) {
    Wisdom w;
    w.path_ = path;
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) return w;
    const auto bytes = std::filesystem::file_size(path, ec);
    if (ec) return fail(Errc::io_error, fmt::format("planner wisdom {}: {}", path.string(), ec.message()));
    if (bytes > kMaxFileBytes)
        return fail(Errc::too_large, fmt::format("planner wisdom {} is {} bytes (at most {})", path.string(), bytes, kMaxFileBytes));
    std::ifstream in(path);
    if (!in) return fail(Errc::io_error, fmt::format("cannot read planner wisdom {}", path.string()));
    std::string line;
    if (!std::getline(in, line) || line != fmt::format("{} {}", kMagic, kVersion))
        return fail(Errc::invalid_argument, fmt::format("{} is not planner wisdom of version {} (first line '{}')",
                                                        path.string(), kVersion, line.substr(0, 80)));
    while (std::getline(in, line)) {
        if (line.empty()) continue;
        if (auto entry = parse(line)) w.entries_[entry->first] = std::move(entry->second);
        else ++w.skipped_;
    }
    return w;
}

const WisdomEntry* Wisdom::find(const std::string& key) const {
    auto it = entries_.find(key);
    return it == entries_.end() ? nullptr : &it->second;
}

Result<void> Wisdom::save() const {
    std::error_code ec;
    if (path_.has_parent_path()) std::filesystem::create_directories(path_.parent_path(), ec);
    if (ec) return fail(Errc::io_error, fmt::format("planner wisdom: cannot make {}: {}", path_.parent_path().string(), ec.message()));
    const auto tmp = path_.string() + fmt::format(".{}.tmp", ::getpid());
    {
        std::ofstream out(tmp, std::ios::trunc);
        out << kMagic << ' ' << kVersion << '\n';
        for (const auto& [key, entry] : entries_) out << format(key, entry) << '\n';
        if (!out.flush()) return fail(Errc::io_error, fmt::format("planner wisdom: cannot write {}", tmp));
    }
    std::filesystem::rename(tmp, path_, ec);
    if (ec) return fail(Errc::io_error, fmt::format("planner wisdom: cannot replace {}: {}", path_.string(), ec.message()));
    return {};
}

bool link_matches(const LinkFigures& then, const LinkFigures& now, double fraction) noexcept {
    // A ratio either way: a link twice as fast has drifted as far as one twice as slow.
    auto near = [&](double a, double b) {
        if (a <= 0 || b <= 0) return a == b;
        return std::max(a, b) / std::min(a, b) <= 1 + fraction;
    };
    return then.mapped == now.mapped && near(then.rtt_ns, now.rtt_ns) && near(then.get_ns, now.get_ns);
}

} // namespace bitship::xrdma
