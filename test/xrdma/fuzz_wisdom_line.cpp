// libFuzzer target for Wisdom::parse, which reads every line of the planner's wisdom file (the
// user's cache directory: a file another program, an older bitship or a full disk may have
// left half-written). Beyond "no crash, no sanitizer report": a line that parses writes out
// (Wisdom::format) to a line that parses to the same entry, whose GET curves are sorted and
// never cheaper for more bytes, and whose breakpoints start at the range's low end.
// Built with BITSHIP_FUZZ=ON (clang):  ./build-fuzz/test/xrdma/fuzz_wisdom_line -max_total_time=60
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "wisdom.hpp"

namespace {

using namespace bitship::xrdma;

void check(bool ok) {
    if (!ok) std::abort(); // a broken property: libFuzzer saves the input
}

void check_curve(const GetCurve& c) {
    check(c.points().size() <= GetCurve::kMaxPoints);
    for (std::size_t i = 0; i < c.points().size(); ++i) {
        check(c.points()[i].extra_ns >= 0);
        if (i > 0) {
            check(c.points()[i].bytes > c.points()[i - 1].bytes);
            check(c.points()[i].extra_ns >= c.points()[i - 1].extra_ns);
        }
    }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::string line(reinterpret_cast<const char*>(data), size);
    auto parsed = Wisdom::parse(line);
    if (!parsed) return 0;
    const auto& [key, entry] = *parsed;
    check(!key.empty());
    check_curve(entry.probed.get_curve);
    check_curve(entry.model.link.get_curve);
    check(entry.cached.segments().front().from == entry.cached.lo());
    check(entry.cold.segments().front().from == entry.cold.lo());
    const std::string again = Wisdom::format(key, entry);
    auto back = Wisdom::parse(again);
    check(back.has_value());
    check(back->first == key);
    check(Wisdom::format(back->first, back->second) == again);
    return 0;
}
