#pragma once
// The planner's wisdom (after FFTW's): what calibration measured and the breakpoints it gave,
// kept in a small text file in the user's cache directory so a restarted program plans at
// once. One entry per operation and set of peers and code hash; an entry is used again only
// while the link measures within a set fraction of the figures it was computed from.
//
//   bitship-planner-wisdom 2
//   chase@127.0.0.1:7001#3fa2…  probed 4900 5200 0.08 0 curve 3 1024 310 8192 7400 262144 190000
//     link 4900 5100 0.08 0 curve 3 …  fit get 120 0 1 …
//     cached 1:xrdma …  cold 1:get 9:xrdma                       (one line per entry)

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>

#include <bitship/errc.hpp>

#include "breakpoints.hpp"
#include "cost_model.hpp"

namespace bitship::xrdma {

struct WisdomEntry {
    LinkFigures probed; ///< what the link probe measured when this was made (drift is judged on it)
    OpModel model;      ///< the model, its link terms refined by the timed runs
    Breakpoints cached; ///< with the code held by the agents
    Breakpoints cold;   ///< with it still to travel
};

class Wisdom {
public:
    /// `$XDG_CACHE_HOME/bitship/planner.wisdom`, or `~/.cache/bitship/planner.wisdom`.
    static std::filesystem::path default_path();

    /// Reads `path`; a missing file is empty wisdom. Lines that do not parse are skipped (and
    /// counted in skipped()); a file of another format or version is an error naming it.
    static Result<Wisdom> load(const std::filesystem::path& path);

    [[nodiscard]] const WisdomEntry* find(const std::string& key) const;
    void put(const std::string& key, WisdomEntry entry) { entries_[key] = std::move(entry); }
    /// Writes every entry to the file it was loaded from (a new file, then renamed over it).
    Result<void> save() const;

    [[nodiscard]] std::size_t size() const noexcept { return entries_.size(); }
    [[nodiscard]] std::size_t skipped() const noexcept { return skipped_; }
    [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }

    /// One entry as a line, and back (nullopt: not an entry of this format).
    static std::string format(const std::string& key, const WisdomEntry& entry);
    static std::optional<std::pair<std::string, WisdomEntry>> parse(const std::string& line);

private:
    std::filesystem::path path_;
    std::map<std::string, WisdomEntry> entries_;
    std::size_t skipped_ = 0;
};

/// Whether `now` is within a factor 1 + `fraction` of `then`, either way, on its round trip and
/// GET latency (and the same kind of link).
[[nodiscard]] bool link_matches(const LinkFigures& then, const LinkFigures& now, double fraction) noexcept;

} // namespace bitship::xrdma
