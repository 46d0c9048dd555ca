#include "control.hpp"

#include <unistd.h>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "cache_control.hpp"

namespace bitship::agent {

namespace {
constexpr std::string_view kNotAvailable = "n/a";
constexpr std::string_view kVersion = "0.1.0";
} // namespace

bool is_control_request(wire::Type type) noexcept {
    switch (type) {
    case wire::Type::info:
    case wire::Type::kernel_stats:
    case wire::Type::cache_list:
    case wire::Type::cache_evict:
    case wire::Type::drain: return true;
    default: return false;
    }
}

wire::Fields info_fields(const ControlContext& ctx, std::vector<std::string>& storage) {
    const auto& host = jit::host();
    auto uptime = std::chrono::duration<double>(std::chrono::steady_clock::now() - ctx.started).count();
    // The views point into `storage`, which must not reallocate: its size is fixed first.
    storage.clear();
    storage.reserve(20);
    auto keep = [&](std::string s) -> std::string_view { return storage.emplace_back(std::move(s)); };
    wire::Fields f;
    f.fields = {
        {"address", ctx.address},
        {"version", kVersion},
        {"pid", keep(std::to_string(getpid()))},
        {"instance", keep(fmt::format("{:016x}", ctx.instance))},
        {"triple", host.triple},
        {"cpu", host.cpu},
        {"cores", keep(std::to_string(ctx.topology.cores))},
        {"hardware_threads", keep(std::to_string(ctx.topology.caps.pus))},
        {"numa_nodes", keep(std::to_string(ctx.topology.caps.numa.size()))},
        {"gpus", keep(std::to_string(ctx.topology.caps.gpus))},
        {"node_kind", keep(std::string(to_string(ctx.topology.caps.kind)))},
        {"cpu_model", keep(ctx.topology.caps.cpu_model.empty() ? std::string("n/a") : ctx.topology.caps.cpu_model)},
        {"llvm", keep(to_string(host.llvm))},
        {"workers", keep(std::to_string(ctx.workers))},
        {"uptime_s", keep(fmt::format("{:.1f}", uptime))},
        {"sandbox", keep(ctx.sandbox ? ctx.sandbox() : std::string(kNotAvailable))},
        {"trust", keep(ctx.trust.empty() ? std::string(kNotAvailable) : ctx.trust)},
        {"cuda", keep(ctx.cuda.empty() ? std::string(kNotAvailable) : ctx.cuda)},
    };
    return f;
}

wire::Encoded handle_control(const ControlContext& ctx, std::uint64_t id, const wire::Message& msg) {
    switch (msg.header.type) {
    case wire::Type::info: {
        std::vector<std::string> storage;
        return wire::encode_info_reply(id, info_fields(ctx, storage));
    }
    case wire::Type::kernel_stats: return wire::encode_kernel_stats_reply(id, ctx.stats->snapshot());
    case wire::Type::cache_list: {
        auto list = list_cached_code(*ctx.jit);
        if (!list) return wire::encode_error(id, list.error().code, list.error().message);
        return wire::encode_cache_list_reply(id, *list);
    }
    case wire::Type::cache_evict: {
        const auto& hash = std::get<wire::CacheEvict>(msg.body).hash;
        auto evicted = evict_cached_code(*ctx.jit, hash);
        if (!evicted) return wire::encode_error(id, evicted.error().code, evicted.error().message);
        spdlog::info("cache evict {}: {}", to_hex(hash, 16), *evicted ? "evicted" : "not evicted");
        return wire::encode_ack(id, *evicted, *evicted ? "evicted" : "not cached, or in use by a running call");
    }
    case wire::Type::drain: {
        bool started = ctx.begin_drain && ctx.begin_drain();
        if (started) spdlog::info("draining: refusing new calls, exiting once those in flight are answered");
        return wire::encode_ack(id, started, started ? "draining" : "already draining");
    }
    default:
        return wire::encode_error(id, Errc::unknown_message,
                                  fmt::format("{} is not a control request", wire::to_string(msg.header.type)));
    }
}

} // namespace bitship::agent
