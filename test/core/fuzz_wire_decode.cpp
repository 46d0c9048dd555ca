// libFuzzer: the wire decoder never reads outside its input, whatever the header claims.
#include <cstring>

#include "core/wire.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    using namespace bitship;
    if (size < sizeof(wire::Header)) return 0;
    auto bytes = std::as_bytes(std::span(data, size));
    auto payload = bytes.subspan(sizeof(wire::Header));
    auto h = wire::decode_header(bytes.first(sizeof(wire::Header)), payload.size());
    if (!h) return 0;
    auto m = wire::decode(*h, payload);
    if (m && std::holds_alternative<wire::Run>(m->body)) {
        const auto& r = std::get<wire::Run>(m->body);
        volatile std::size_t sink = r.entry.size() + r.args.size() + r.code.size();
        (void)sink;
    }
    return 0;
}
