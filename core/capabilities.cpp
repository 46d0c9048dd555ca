// The WELCOME capabilities block: what the agent's machine offers (wire::Welcome::caps).
//
//   u8 kind · str16 kind_reason · u32 pus · u16 n · n × (u32 os_index, u64 memory_bytes)
//   · str16 cpu_model · u32 gpus · [fields of later versions, ignored here]
//
// The GPU details (encode_gpu_details) come after WELCOME's session fields, in the same block.
//
// The block travels length-prefixed, so a decoder that knows fewer fields than the sender skips
// the rest; every field this build knows must be there.
#include <algorithm>

#include <fmt/format.h>

#include "byte_io.hpp"
#include "wire.hpp"

namespace bitship {

const char* to_string(NodeKind kind) noexcept {
    switch (kind) {
    case NodeKind::host: return "host";
    case NodeKind::dpu: return "dpu";
    }
    return "unknown";
}

const char* to_string(SandboxMode mode) noexcept {
    switch (mode) {
    case SandboxMode::none: return "none";
    case SandboxMode::sfi: return "sfi";
    }
    return "unknown";
}

namespace wire {
namespace {

constexpr std::size_t kNumaEntryBytes = sizeof(std::uint32_t) + sizeof(std::uint64_t);

tl::unexpected<Error> short_field(std::string_view field) {
    return fail(Errc::malformed_message, fmt::format("WELCOME message: capability '{}' runs past the end of its block", field));
}

} // namespace

std::vector<std::byte> encode_capabilities(const Capabilities& c) {
    ByteWriter w;
    w.u8(static_cast<std::uint8_t>(c.kind));
    w.str16(c.kind_reason);
    w.u32(c.pus);
    // More than 65535 NUMA nodes is not a machine; the count is cut, never overflows.
    const auto n = std::min<std::size_t>(c.numa.size(), 0xffff);
    w.u16(static_cast<std::uint16_t>(n));
    for (std::size_t i = 0; i < n; ++i) {
        w.u32(c.numa[i].os_index);
        w.u64(c.numa[i].memory_bytes);
    }
    w.str16(c.cpu_model);
    w.u32(c.gpus);
    return std::move(w).take();
}

Result<Capabilities> decode_capabilities(std::span<const std::byte> block, std::size_t* used) {
    ByteReader in(block);
    Capabilities c;
    auto kind = in.u8();
    if (!kind) return short_field("kind");
    if (*kind != static_cast<std::uint8_t>(NodeKind::host) && *kind != static_cast<std::uint8_t>(NodeKind::dpu))
        return fail(Errc::malformed_message, fmt::format("WELCOME message: node kind {} is neither host (1) nor dpu (2)", *kind));
    c.kind = static_cast<NodeKind>(*kind);
    auto reason = in.str16();
    if (!reason) return short_field("kind_reason");
    c.kind_reason = std::string(*reason);
    auto pus = in.u32();
    if (!pus) return short_field("pus");
    c.pus = *pus;
    auto n = in.u16();
    if (!n) return short_field("numa");
    // The count is checked against what is left before anything is reserved for it.
    if (*n > in.remaining() / kNumaEntryBytes) return short_field("numa");
    c.numa.reserve(*n);
    for (unsigned i = 0; i < *n; ++i) {
        auto os_index = in.u32();
        auto memory = in.u64();
        if (!os_index || !memory) return short_field("numa");
        c.numa.push_back({*os_index, *memory});
    }
    auto model = in.str16();
    if (!model) return short_field("cpu_model");
    c.cpu_model = std::string(*model);
    auto gpus = in.u32();
    if (!gpus) return short_field("gpus");
    c.gpus = *gpus;
    if (used) *used = block.size() - in.remaining();
    return c;
}

std::vector<std::byte> encode_gpu_details(const Capabilities& c) {
    ByteWriter w;
    // An agent has a handful of GPUs and regions; the counts are cut, never overflow.
    const auto n = std::min<std::size_t>(c.gpu_devices.size(), 0xffff);
    w.u16(static_cast<std::uint16_t>(n));
    for (std::size_t i = 0; i < n; ++i) {
        const auto& g = c.gpu_devices[i];
        w.str16(g.name);
        w.u32(g.sm);
        w.u32(g.multiprocessors);
        w.u64(g.memory_bytes);
        w.u32(static_cast<std::uint32_t>(g.numa_node));
    }
    const auto m = std::min<std::size_t>(c.gpu_regions.size(), 0xffff);
    w.u16(static_cast<std::uint16_t>(m));
    for (std::size_t i = 0; i < m; ++i) {
        w.str16(c.gpu_regions[i].name);
        w.u64(c.gpu_regions[i].size);
        w.u32(c.gpu_regions[i].device);
    }
    return std::move(w).take();
}

Result<void> decode_gpu_details(std::span<const std::byte> bytes, Capabilities& c) {
    constexpr std::size_t kGpuEntryBytes = 2 + 4 + 4 + 8 + 4, kRegionEntryBytes = 2 + 8 + 4;
    ByteReader in(bytes);
    auto n = in.u16();
    if (!n || *n > in.remaining() / kGpuEntryBytes) return short_field("gpu_devices");
    std::vector<Capabilities::Gpu> gpus;
    gpus.reserve(*n);
    for (unsigned i = 0; i < *n; ++i) {
        auto name = in.str16();
        auto sm = in.u32(), multiprocessors = in.u32();
        auto memory = in.u64();
        auto numa = in.u32();
        if (!name || !sm || !multiprocessors || !memory || !numa) return short_field("gpu_devices");
        gpus.push_back({std::string(*name), *sm, *multiprocessors, *memory, static_cast<std::int32_t>(*numa)});
    }
    auto m = in.u16();
    if (!m || *m > in.remaining() / kRegionEntryBytes) return short_field("gpu_regions");
    std::vector<Capabilities::GpuRegion> regions;
    regions.reserve(*m);
    for (unsigned i = 0; i < *m; ++i) {
        auto name = in.str16();
        auto size = in.u64();
        auto device = in.u32();
        if (!name || !size || !device) return short_field("gpu_regions");
        if (*device >= gpus.size())
            return fail(Errc::malformed_message, fmt::format("WELCOME message: GPU region '{}' is on GPU {} of {}", *name,
                                                             *device, gpus.size()));
        regions.push_back({std::string(*name), *size, *device});
    }
    if (in.remaining() != 0)
        return fail(Errc::malformed_message, fmt::format("WELCOME message: {} bytes after the GPU details", in.remaining()));
    c.gpu_devices = std::move(gpus);
    c.gpu_regions = std::move(regions);
    return {};
}

} // namespace wire
} // namespace bitship
