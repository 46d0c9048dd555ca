// The fake CUDA driver's reading of PTX text (fake_ptx.hpp).
#include "fake_ptx.hpp"

#include <cstdlib>

namespace bitship::test::fake_ptx {

std::string without_comments(std::string_view ptx) {
    std::string out;
    out.reserve(ptx.size());
    for (std::size_t i = 0; i < ptx.size();) {
        if (ptx.compare(i, 2, "//") == 0) {
            i = ptx.find('\n', i);
            if (i == std::string_view::npos) break;
        } else if (ptx.compare(i, 2, "/*") == 0) {
            i = ptx.find("*/", i + 2);
            if (i == std::string_view::npos) break;
            i += 2;
            out += ' ';
        } else {
            out += ptx[i++];
        }
    }
    return out;
}

namespace {

bool is_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}
bool is_name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '$' || c == '%' || c == '.';
}

} // namespace

bool bitship_abi(std::string_view params) {
    std::size_t count = 0;
    for (std::size_t i = 0; (i = params.find(".param", i)) != std::string_view::npos; ++count) {
        i += std::string_view(".param").size();
        while (i < params.size() && is_space(params[i]))
            ++i;
        if (params.compare(i, 4, ".u64") != 0) return false;
    }
    return count == kBitshipParams;
}

std::map<std::string, bool, std::less<>> entries_of(const std::string& ptx) {
    std::map<std::string, bool, std::less<>> out;
    const std::string_view entry = ".entry";
    for (std::size_t i = 0; (i = ptx.find(entry, i)) != std::string::npos;) {
        i += entry.size();
        if (i >= ptx.size() || !is_space(ptx[i])) continue;
        while (i < ptx.size() && is_space(ptx[i]))
            ++i;
        const std::size_t begin = i;
        while (i < ptx.size() && is_name_char(ptx[i]))
            ++i;
        if (i == begin || (i < ptx.size() && !is_space(ptx[i]) && ptx[i] != '(')) continue;
        std::string name = ptx.substr(begin, i - begin);
        while (i < ptx.size() && is_space(ptx[i]))
            ++i;
        bool abi = false;
        if (i < ptx.size() && ptx[i] == '(') {
            const std::size_t close = ptx.find(')', i);
            if (close != std::string::npos)
                abi = bitship_abi(std::string_view(ptx).substr(i, close - i));
        }
        out.emplace(std::move(name), abi);
    }
    return out;
}

std::string refusal(const std::string& ptx, unsigned device_sm) {
    if (ptx.find(".version") == std::string::npos || ptx.find(".entry") == std::string::npos)
        return "fake CUDA driver (bitship tests): the image is not PTX text (no .version and "
               ".entry)";
    if (auto t = ptx.find(".target"); t != std::string::npos) {
        auto sm = ptx.find("sm_", t);
        auto line_end = ptx.find('\n', t);
        if (sm != std::string::npos && sm < line_end) {
            const unsigned target =
                static_cast<unsigned>(std::strtoul(ptx.c_str() + sm + 3, nullptr, 10));
            if (target > device_sm)
                return "ptxas fatal   : SM version specified by .target (sm_" +
                       std::to_string(target) + ") is higher than the device's (sm_" +
                       std::to_string(device_sm) + ") (fake CUDA driver)";
        }
    }
    return {};
}

} // namespace bitship::test::fake_ptx
