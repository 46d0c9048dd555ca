#include <bitship/peers.hpp>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <sstream>

#include <unistd.h>

#include <fmt/format.h>

namespace bitship {
namespace {

constexpr std::string_view kHeader = "# bitship peers 1";
/// A job this large would be a typo or a hostile file; bounds what a parse allocates.
constexpr std::size_t kMaxPeers = 1 << 20;
constexpr std::size_t kMaxField = 1024;

std::vector<std::string_view> split_fields(std::string_view line) {
    std::vector<std::string_view> out;
    std::size_t i = 0;
    while (i < line.size()) {
        while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
        auto start = i;
        while (i < line.size() && line[i] != ' ' && line[i] != '\t') ++i;
        if (i > start) out.push_back(line.substr(start, i - start));
    }
    return out;
}

template <class T> bool parse_number(std::string_view s, T& out) {
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
    return ec == std::errc{} && end == s.data() + s.size();
}

bool valid_address(std::string_view a) {
    auto colon = a.rfind(':');
    if (colon == std::string_view::npos || colon == 0) return false;
    unsigned port = 0;
    return parse_number(a.substr(colon + 1), port) && port > 0 && port <= 65535;
}

} // namespace

Result<std::vector<PeerRecord>> parse_peers(std::string_view text) {
    std::vector<PeerRecord> peers;
    std::size_t line_no = 0;
    bool header = false;
    while (!text.empty()) {
        auto nl = text.find('\n');
        auto line = text.substr(0, nl);
        text = nl == std::string_view::npos ? std::string_view{} : text.substr(nl + 1);
        ++line_no;
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        if (line_no == 1) {
            if (line != kHeader)
                return fail(Errc::invalid_argument,
                            fmt::format("peers file: line 1 is not '{}' (not a bitship peers file, or a newer one)", kHeader));
            header = true;
            continue;
        }
        if (line.empty() || line.front() == '#') continue;
        auto f = split_fields(line);
        if (f.size() != 5)
            return fail(Errc::invalid_argument,
                        fmt::format("peers file: line {} has {} fields, expected 5 (rank address host triple gpus)", line_no,
                                    f.size()));
        for (auto field : f)
            if (field.size() > kMaxField)
                return fail(Errc::invalid_argument, fmt::format("peers file: line {} has a field over {} bytes", line_no, kMaxField));
        PeerRecord r;
        if (!parse_number(f[0], r.rank)) return fail(Errc::invalid_argument, fmt::format("peers file: line {}: rank '{}' is not a number", line_no, f[0]));
        if (!valid_address(f[1]))
            return fail(Errc::invalid_argument, fmt::format("peers file: line {}: address '{}' is not HOST:PORT", line_no, f[1]));
        if (!parse_number(f[4], r.gpus))
            return fail(Errc::invalid_argument, fmt::format("peers file: line {}: GPU count '{}' is not a number", line_no, f[4]));
        if (peers.size() >= kMaxPeers)
            return fail(Errc::invalid_argument, fmt::format("peers file: more than {} agents", kMaxPeers));
        r.address = std::string(f[1]);
        r.host = std::string(f[2]);
        r.triple = std::string(f[3]);
        peers.push_back(std::move(r));
    }
    if (!header) return fail(Errc::invalid_argument, "peers file is empty");
    if (peers.empty()) return fail(Errc::invalid_argument, "peers file lists no agent");
    std::sort(peers.begin(), peers.end(), [](const auto& a, const auto& b) { return a.rank < b.rank; });
    for (std::size_t i = 0; i < peers.size(); ++i) {
        if (peers[i].rank == i) continue;
        if (peers[i].rank < i) return fail(Errc::invalid_argument, fmt::format("peers file: rank {} appears twice", peers[i].rank));
        return fail(Errc::invalid_argument, fmt::format("peers file: rank {} is missing ({} agents listed)", i, peers.size()));
    }
    return peers;
}

Result<std::vector<PeerRecord>> read_peers_file(const std::filesystem::path& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return fail(Errc::io_error, fmt::format("cannot open peers file {}", path.string()));
    std::stringstream s;
    s << in.rdbuf();
    auto peers = parse_peers(s.str());
    if (!peers) return fail(peers.error().code, fmt::format("{}: {}", path.string(), peers.error().message));
    return peers;
}

std::string format_peers(std::vector<PeerRecord> peers) {
    std::sort(peers.begin(), peers.end(), [](const auto& a, const auto& b) { return a.rank < b.rank; });
    auto out = std::string(kHeader) + "\n";
    for (const auto& p : peers) out += fmt::format("{} {} {} {} {}\n", p.rank, p.address, p.host, p.triple, p.gpus);
    return out;
}

Result<void> write_peers_file(const std::filesystem::path& path, const std::vector<PeerRecord>& peers) {
    auto tmp = path;
    tmp += fmt::format(".tmp{}", getpid());
    {
        std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
        out << format_peers(peers);
        if (!out) return fail(Errc::io_error, fmt::format("cannot write peers file {}", tmp.string()));
    }
    std::error_code ec;
    std::filesystem::rename(tmp, path, ec);
    if (ec) return fail(Errc::io_error, fmt::format("cannot rename {} to {}: {}", tmp.string(), path.string(), ec.message()));
    return {};
}

} // namespace bitship
