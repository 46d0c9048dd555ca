#pragma once
// The benchmarks' command lines. CLI11 is header-only, and compiling it was most of each
// benchmark's build: it sits behind this interface, compiled once (options.cpp).

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace CLI {
class App;
class Option;
} // namespace CLI

namespace bitship::bench {

class Options {
public:
    /// Checks on one option's values: each adds one and returns this, to chain them.
    class Check {
    public:
        Check& positive();                                  ///< each value > 0
        Check& range(long long lo, long long hi);           ///< lo ≤ each value ≤ hi
        Check& one_of(const std::vector<std::string>& names); ///< each value one of these
        Check& progress_mode();                             ///< each value spin, block or spin-then-block
        Check& transport();                                 ///< each value tcp or shm

    private:
        friend class Options;
        explicit Check(CLI::Option* option) : option_(option) {}
        CLI::Option* option_;
    };

    explicit Options(const std::string& description);
    ~Options();
    Options(const Options&) = delete;
    Options& operator=(const Options&) = delete;

    /// `name VALUE` (repeatable where `T` is a vector) read into `value`; --help shows what
    /// `value` holds now as the default, unless it is empty. Defined for the integer types,
    /// double, std::string and vectors of those.
    template <class T>
    Check add(const std::string& name, T& value, const std::string& help);
    /// `name` alone sets `on`.
    void flag(const std::string& name, bool& on, const std::string& help);

    /// Reads the command line: nullopt to go on; else the status to exit with, after --help's
    /// text or an error naming what was wrong is printed.
    [[nodiscard]] std::optional<int> parse(int argc, char** argv);
    /// Whether `name` was on the command line.
    [[nodiscard]] bool given(const std::string& name) const;

private:
    std::unique_ptr<CLI::App> app_;
};

} // namespace bitship::bench
