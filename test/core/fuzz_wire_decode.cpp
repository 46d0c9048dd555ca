// libFuzzer: the wire decoder never reads outside its input, whatever the header claims.
#include <cstring>
#include <vector>

#include "core/wire.hpp"
#include "core/wire_split.hpp"

namespace {

// The same bytes read as a split message's AM header (core/wire_split.hpp) that came with as
// many bytes of AM data as its last byte says: whatever its lengths claim, the parts it gives
// lie inside it, and laid out around the data they make the payload its Header declares. A
// RUN's data also lands apart from its fields, as an agent lands it (Incoming::outside): what
// decodes so decodes laid out whole too, its arguments the data, read where the data lies.
void split_header(std::span<const std::byte> bytes) {
    using namespace bitship;
    const std::size_t data = static_cast<std::size_t>(bytes.back()) * 97;
    auto h = wire::decode_am_header(bytes, data);
    if (!h) return;
    if (h->prefix.size() + data + h->suffix.size() != h->header.payload_size) __builtin_trap();
    std::vector<std::byte> payload(h->prefix.begin(), h->prefix.end());
    payload.resize(payload.size() + data);
    payload.insert(payload.end(), h->suffix.begin(), h->suffix.end());
    auto whole = wire::decode(h->header, payload);
    if (h->header.type != wire::Type::run || h->prefix.empty()) return;
    std::vector<std::byte> fields(h->prefix.begin(), h->prefix.end());
    fields.insert(fields.end(), h->suffix.begin(), h->suffix.end());
    const std::vector<std::byte> landed(data, std::byte{0});
    const wire::OutsideArgs outside{landed, h->prefix.size()};
    wire::Run run;
    auto apart = wire::decode_run(h->header, fields, run, &outside);
    if (!apart) return;
    if (!whole || run.args.data() != landed.data() || std::get<wire::Run>(whole->body).args.size() != data)
        __builtin_trap();
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    using namespace bitship;
    if (size < sizeof(wire::Header)) return 0;
    auto bytes = std::as_bytes(std::span(data, size));
    split_header(bytes);
    auto payload = bytes.subspan(sizeof(wire::Header));
    auto h = wire::decode_header(bytes.first(sizeof(wire::Header)), payload.size());
    if (!h) return 0;
    auto m = wire::decode(*h, payload);
    // The agent decodes a RUN with decode_run: it accepts and refuses exactly what decode() does.
    if (h->type == wire::Type::run) {
        wire::Run direct;
        auto ok = wire::decode_run(*h, payload, direct);
        if (ok.has_value() != m.has_value()) __builtin_trap();
        if (ok && (direct.entry != std::get<wire::Run>(m->body).entry || direct.args.size() != std::get<wire::Run>(m->body).args.size()))
            __builtin_trap();
    }
    if (!m) return 0;
    // A BATCH's messages are decoded one by one, as the engine hands them on.
    if (h->type == wire::Type::batch) {
        auto items = wire::split_batch(payload);
        if (!items) __builtin_trap(); // decode accepted it, so it splits
        for (const auto& item : *items) (void)wire::decode(item.header, item.payload);
        return 0;
    }
    // A RESULT may be a group's answers (Client::ship_each reads it so): index and read them.
    if (h->type == wire::Type::result && payload.size() >= 4) {
        std::uint32_t count;
        std::memcpy(&count, payload.data(), sizeof count);
        if (auto at = wire::index_each_results(payload, count)) {
            volatile std::size_t seen = 0;
            for (auto offset : *at) {
                auto a = wire::read_each_answer(payload, offset);
                seen = seen + a.bytes.size() + (a.bytes.empty() ? 0u : static_cast<unsigned>(a.bytes.back())) +
                       (a.error ? a.error->message.size() + static_cast<unsigned>(a.error->code) : 0u);
            }
            (void)seen;
        }
    }
    // Touch what each decoded view points at, so a view past the input would be caught.
    volatile std::size_t sink = 0;
    if (const auto* r = std::get_if<wire::Run>(&m->body)) {
        sink = r->entry.size() + r->args.size() + r->code.size();
        for (const auto& s : r->signatures) sink = sink + s.hash[31] + s.signer[31] + s.signature[63];
    } else if (const auto* w = std::get_if<wire::Welcome>(&m->body)) {
        sink = w->agent.size() + w->caps.numa.size() + static_cast<unsigned>(w->access) + w->challenge[31];
    } else if (const auto* a = std::get_if<wire::Auth>(&m->body)) {
        sink = a->key[0] + a->signature[63];
    } else if (const auto* g = std::get_if<wire::GpuWrite>(&m->body)) {
        sink = g->name.size() + g->bytes.size() + (g->bytes.empty() ? 0u : static_cast<unsigned>(g->bytes.back()));
    } else if (const auto* gr = std::get_if<wire::GpuRead>(&m->body)) {
        sink = gr->name.size() + (gr->name.empty() ? 0u : static_cast<unsigned>(gr->name.back()));
    }
    if (const auto* w = std::get_if<wire::Welcome>(&m->body))
        for (const auto& g : w->caps.gpu_devices) sink = sink + g.name.size() + g.sm;
    (void)sink;
    return 0;
}
