#include "cost_model.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

namespace bitship::xrdma {

double serial_units(const OpWork& work, std::uint32_t lanes) noexcept {
    const bool fan_out = work.forwards == 0 && work.agents_touched > 1;
    if (!fan_out) return static_cast<double>(work.remote_units);
    // Each agent's share, times the rounds it takes when fewer agents than touched run at once
    // (whole numbers: std::ceil is a libm call on baseline x86-64, and a loaded choose() pays it).
    const std::uint64_t touched = work.agents_touched;
    const std::uint64_t share = work.remote_units / touched + (work.remote_units % touched != 0);
    const std::uint64_t at_once = lanes > 0 ? std::min<std::uint64_t>(lanes, touched) : touched;
    return static_cast<double>(share * ((touched + at_once - 1) / at_once));
}

double get_bytes_ns(const LinkFigures& link, const OpWork& work) noexcept {
    if (work.get_bytes == 0) return 0;
    // The GETs a run makes: one per dependent step, one per agent of a fan-out (its GETs are in
    // flight at once); each pays the curve for its share of the bytes.
    const bool fan_out = work.forwards == 0 && work.agents_touched > 1 && work.dependent_gets <= 1;
    const double gets = std::max<double>(1.0, static_cast<double>(work.dependent_gets)) * (fan_out ? work.agents_touched : 1);
    const auto bytes = static_cast<double>(work.get_bytes);
    return gets == 1 ? link.get_curve.extra_ns(bytes, link.get_ns_per_byte) : gets * link.get_curve.extra_ns(bytes / gets, link.get_ns_per_byte);
}

double link_ns(const LinkFigures& link, Strategy s, const OpWork& work) noexcept {
    if (s == Strategy::get) return static_cast<double>(work.dependent_gets) * link.get_ns + get_bytes_ns(link, work);
    const double trips = s == Strategy::reship ? 1.0 + static_cast<double>(work.forwards) : 1.0;
    return trips * link.rtt_ns + static_cast<double>(work.result_bytes) * link.get_ns_per_byte;
}

namespace {

double units_of(Strategy s, const LinkFigures& link, const OpWork& work) noexcept {
    return s == Strategy::get ? static_cast<double>(work.remote_units) : serial_units(work, link.lanes);
}

double cold_extra(const OpModel& model, Strategy s, const OpWork& work, bool cached) noexcept {
    if (!ships_code(s) || cached) return 0;
    const bool walk = work.forwards > 0;
    const double further = walk ? std::max<std::uint32_t>(work.agents_touched, 1) - 1 : 0;
    return model.cold_ns + further * (model.cold_next_ns > 0 ? model.cold_next_ns : model.cold_ns);
}

} // namespace

double estimate_ns(const OpModel& model, Strategy s, const OpWork& work, bool cached, double queue_wait_ns) noexcept {
    const auto& f = model.fits[index_of(s)];
    double ns = link_ns(model.link, s, work) + f.fixed_ns + units_of(s, model.link, work) * f.per_unit_ns + cold_extra(model, s, work, cached);
    if (s != Strategy::get) ns += queue_wait_ns;
    return std::max(ns, 0.0);
}

std::string format_ns(double ns) {
    if (ns >= 1e9) return fmt::format("{:.3g} s", ns / 1e9);
    if (ns >= 1e6) return fmt::format("{:.3g} ms", ns / 1e6);
    if (ns >= 1e3) return fmt::format("{:.3g} µs", ns / 1e3);
    return fmt::format("{:.3g} ns", ns);
}

namespace {
/// The fitted fixed cost, where it is worth a word: a term the sum would otherwise hide.
std::string fixed_term(double fixed_ns) {
    if (std::abs(fixed_ns) < 100) return {};
    return fmt::format(" {} fixed {}", fixed_ns < 0 ? "−" : "+", format_ns(std::abs(fixed_ns)));
}
} // namespace

Estimate explain(const OpModel& model, Strategy s, const OpWork& work, bool cached, double queue_wait_ns) {
    Estimate e{s, estimate_ns(model, s, work, cached, queue_wait_ns), {}};
    const auto& f = model.fits[index_of(s)];
    const auto units = static_cast<std::uint64_t>(units_of(s, model.link, work));
    if (s == Strategy::get) {
        e.terms = fmt::format("{} × {}", work.dependent_gets, format_ns(model.link.get_ns));
        if (const double bytes_ns = get_bytes_ns(model.link, work); bytes_ns > 0)
            e.terms += model.link.get_curve.empty()
                           ? fmt::format(" + {} B × {:.3g} ns/B", work.get_bytes, model.link.get_ns_per_byte)
                           : fmt::format(" + {} B {}", work.get_bytes, format_ns(bytes_ns));
        if (std::abs(f.per_unit_ns) > 0.05) e.terms += fmt::format(" + {} × {} here", units, format_ns(f.per_unit_ns));
        e.terms += fixed_term(f.fixed_ns);
        return e;
    }
    const std::string trips = s == Strategy::reship ? fmt::format("{} × ", 1 + work.forwards) : "";
    e.terms = fmt::format("{}{}rtt {} + {} × {}", ships_code(s) ? (cached ? "cached; " : "cold; ") : "", trips,
                          format_ns(model.link.rtt_ns), units, format_ns(f.per_unit_ns));
    e.terms += fixed_term(f.fixed_ns);
    if (const double cold = cold_extra(model, s, work, cached); cold > 0) e.terms += fmt::format(" + code {}", format_ns(cold));
    if (queue_wait_ns > 0) e.terms += fmt::format(" + queue {}", format_ns(queue_wait_ns));
    return e;
}

namespace {
/// The link's latency in a run (its round trips or dependent GETs, not its bytes).
double link_latency_ns(const LinkFigures& link, Strategy s, const OpWork& work) noexcept {
    if (s == Strategy::get) return static_cast<double>(work.dependent_gets) * link.get_ns;
    return (s == Strategy::reship ? 1.0 + static_cast<double>(work.forwards) : 1.0) * link.rtt_ns;
}
} // namespace

StrategyFit fit(const Op& op, const LinkFigures& link, Strategy s, std::span<const Sample> samples) {
    // Weighted by 1/time²: the line is judged by its relative error, so the short runs near a
    // crossover count as much as the long ones.
    StrategyFit out;
    double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
    double least_latency = std::numeric_limits<double>::infinity();
    for (const auto& smp : samples) {
        if (!(smp.ns > 0)) continue;
        const auto work = op.work(smp.size);
        least_latency = std::min(least_latency, link_latency_ns(link, s, work));
        const double w = 1.0 / (smp.ns * smp.ns);
        const double x = units_of(s, link, work);
        const double y = smp.ns - link_ns(link, s, work);
        sw += w;
        sx += w * x;
        sy += w * y;
        sxx += w * x * x;
        sxy += w * x * y;
    }
    if (sw == 0) return out;
    const double var = sxx - sx * sx / sw;
    if (var > 1e-12 * sxx) out.per_unit_ns = std::max(0.0, (sxy - sx * sy / sw) / var);
    out.fixed_ns = (sy - out.per_unit_ns * sx) / sw;
    // A link probed slower than the calibration runs went (a probe unlucky on a loaded host,
    // or a GET that costs less in a run than alone) leaves a negative fixed cost. Past the
    // link's own share it would make small sizes cost nothing: the fixed cost never takes back
    // more than the link's latency in the least of the runs (a round trip; for GET, its
    // dependent GETs: one, for an operation whose GETs are all in flight at once).
    out.fixed_ns = std::max(out.fixed_ns, -least_latency);
    out.fitted = true;
    return out;
}

std::optional<double> fit_get_latency(const Op& op, const LinkFigures& link, std::span<const Sample> samples) {
    // The same weighting as fit(): time against dependent GETs, bytes' share taken off.
    double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
    for (const auto& smp : samples) {
        if (!(smp.ns > 0)) continue;
        const auto work = op.work(smp.size);
        const double w = 1.0 / (smp.ns * smp.ns);
        const double x = static_cast<double>(work.dependent_gets);
        const double y = smp.ns - get_bytes_ns(link, work);
        sw += w;
        sx += w * x;
        sy += w * y;
        sxx += w * x * x;
        sxy += w * x * y;
    }
    if (sw == 0) return std::nullopt;
    const double var = sxx - sx * sx / sw;
    if (!(var > 1e-9 * sxx)) return std::nullopt; // the GETs do not vary: nothing to fit
    const double slope = (sxy - sx * sy / sw) / var;
    if (!(slope > 0)) return std::nullopt;
    return slope;
}

} // namespace bitship::xrdma
