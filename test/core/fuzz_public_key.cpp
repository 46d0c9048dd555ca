// libFuzzer target for parse_public_key, which reads every line of an agent's authorized keys
// file (re-read on SIGHUP) and the public keys tools are given. Beyond "no crash, no sanitizer
// report": a key that parses prints (format_public_key) to a line that parses to the same key,
// and its fingerprint is "SHA256:" and 43 characters.
// Built with BITSHIP_FUZZ=ON (clang):  ./build-fuzz/test/core/fuzz_public_key -max_total_time=60
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include <sodium.h>

#include <bitship/identity.hpp>

namespace {

void check(bool ok) {
    if (!ok) std::abort(); // a broken property: libFuzzer saves the input
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    static const bool ready = sodium_init() >= 0;
    check(ready);
    std::string_view line(reinterpret_cast<const char*>(data), size);
    auto parsed = bitship::parse_public_key(line);
    if (!parsed) {
        check(!parsed.error().message.empty());
        return 0;
    }
    auto again = bitship::parse_public_key(bitship::format_public_key(parsed->key, ""));
    check(again.has_value() && again->key == parsed->key);
    auto fp = bitship::fingerprint(parsed->key);
    check(fp.starts_with("SHA256:") && fp.size() == 7 + 43);
    return 0;
}
