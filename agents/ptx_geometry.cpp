#include "ptx_geometry.hpp"

#include <array>
#include <charconv>
#include <string>

namespace bitship::agent {
namespace {

constexpr std::string_view kPrefix = "bs_gpu_geometry_"; // BS_GPU_GEOMETRY_PREFIX
constexpr std::size_t kWords = 2;

std::string_view trim(std::string_view s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
    return s;
}

} // namespace

std::optional<DeclaredGeometry> declared_geometry(std::string_view ptx, std::string_view entry) {
    const std::string name = std::string(kPrefix) + std::string(entry) + "[";
    // The declaration's line: the name, then `[n] = {...};`.
    std::size_t at = 0;
    for (;;) {
        at = ptx.find(name, at);
        if (at == std::string_view::npos) return std::nullopt;
        if (at > 0 && (ptx[at - 1] == ' ' || ptx[at - 1] == '\t')) break; // not the tail of a longer name
        at += name.size();
    }
    const auto line_start = ptx.rfind('\n', at) == std::string_view::npos ? 0 : ptx.rfind('\n', at) + 1;
    const auto line_end = std::min(ptx.find('\n', at), ptx.size());
    const auto head = ptx.substr(line_start, at - line_start);
    const auto rest = ptx.substr(at + name.size(), line_end - at - name.size());

    std::size_t element = 0; // bytes per initialiser element
    if (head.find(".b8 ") != std::string_view::npos || head.find(".u8 ") != std::string_view::npos) element = 1;
    else if (head.find(".b32 ") != std::string_view::npos || head.find(".u32 ") != std::string_view::npos) element = 4;
    else return std::nullopt;

    const auto open = rest.find('{'), close = rest.find('}');
    if (open == std::string_view::npos || close == std::string_view::npos || close < open) return std::nullopt;
    std::array<std::uint32_t, kWords> words{};
    const std::size_t limit = kWords * 4 / element; // elements that make up the two words
    std::size_t index = 0;
    for (auto list = rest.substr(open + 1, close - open - 1); !trim(list).empty();) {
        const auto comma = list.find(',');
        const auto item = trim(list.substr(0, comma));
        std::uint64_t value = 0;
        auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), value);
        if (ec != std::errc{} || end != item.data() + item.size() || index >= limit) return std::nullopt;
        if (element == 1) {
            if (value > 0xff) return std::nullopt;
            words[index / 4] |= static_cast<std::uint32_t>(value) << (8 * (index % 4));
        } else {
            if (value > 0xffffffffu) return std::nullopt;
            words[index] = static_cast<std::uint32_t>(value);
        }
        ++index;
        if (comma == std::string_view::npos) break;
        list.remove_prefix(comma + 1);
    }
    return DeclaredGeometry{words[0], words[1]};
}

} // namespace bitship::agent
