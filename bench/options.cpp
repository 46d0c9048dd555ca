#include "options.hpp"

#include <CLI/CLI.hpp>

#include <bitship/transport.hpp>

namespace bitship::bench {

Options::Check& Options::Check::positive() {
    option_->check(CLI::PositiveNumber);
    return *this;
}

Options::Check& Options::Check::range(long long lo, long long hi) {
    option_->check(CLI::Range(lo, hi));
    return *this;
}

Options::Check& Options::Check::one_of(const std::vector<std::string>& names) {
    option_->check(CLI::IsMember(names));
    return *this;
}

// The names are bitship's own (to_string), so a benchmark accepts what its clients and agents do.
Options::Check& Options::Check::progress_mode() {
    return one_of({std::string(to_string(ProgressMode::spin)), std::string(to_string(ProgressMode::block)),
                   std::string(to_string(ProgressMode::spin_then_block))});
}

Options::Check& Options::Check::transport() {
    return one_of({std::string(to_string(Transport::tcp)), std::string(to_string(Transport::shm))});
}

Options::Options(const std::string& description) : app_(std::make_unique<CLI::App>(description)) {}

Options::~Options() = default;

template <class T>
Options::Check Options::add(const std::string& name, T& value, const std::string& help) {
    CLI::Option* option = app_->add_option(name, value, help);
    if constexpr (requires { value.empty(); }) {
        if (value.empty()) return Check(option);
    }
    return Check(option->capture_default_str());
}

void Options::flag(const std::string& name, bool& on, const std::string& help) { app_->add_flag(name, on, help); }

std::optional<int> Options::parse(int argc, char** argv) {
    try {
        app_->parse(argc, argv);
        return std::nullopt;
    } catch (const CLI::ParseError& e) {
        return app_->exit(e);
    }
}

bool Options::given(const std::string& name) const { return app_->count(name) > 0; }

#define BITSHIP_OPTIONS_ADD(T) \
    template Options::Check Options::add<T>(const std::string&, T&, const std::string&); \
    template Options::Check Options::add<std::vector<T>>(const std::string&, std::vector<T>&, const std::string&);
BITSHIP_OPTIONS_ADD(int)
BITSHIP_OPTIONS_ADD(long)
BITSHIP_OPTIONS_ADD(long long)
BITSHIP_OPTIONS_ADD(unsigned)
BITSHIP_OPTIONS_ADD(unsigned long)
BITSHIP_OPTIONS_ADD(unsigned long long)
BITSHIP_OPTIONS_ADD(double)
BITSHIP_OPTIONS_ADD(std::string)
#undef BITSHIP_OPTIONS_ADD

} // namespace bitship::bench
