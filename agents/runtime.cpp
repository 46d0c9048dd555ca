#include "runtime.hpp"

#include "kernel_guard.hpp"

#include <cstring>

#include <fmt/format.h>

#include "core/bulk_window.hpp"
#include "core/spare_bytes.hpp"
#include "regions.hpp"

namespace {
constexpr std::size_t kMaxFailMessage = 1024;
alignas(16) constexpr char kNoArgs[16] = {};
} // namespace

extern "C" {

const void* bs_args(bs_ctx* ctx, size_t* len) {
    if (!ctx) {
        if (len) *len = 0;
        return kNoArgs;
    }
    if (len) *len = ctx->args.size();
    return ctx->args.empty() ? static_cast<const void*>(kNoArgs) : ctx->args.data();
}

int bs_reply(bs_ctx* ctx, const void* data, size_t len) {
    if (!ctx || (!data && len)) return BS_EINVAL;
    if (ctx->answered) return BS_EALREADY;
    if (len > ctx->max_result) return BS_ETOOLARGE;
    const auto* bytes = static_cast<const std::byte*>(data);
    if (len >= bitship::kWindowResultMin && len <= ctx->slot.size()) {
        std::memcpy(ctx->slot.data(), bytes, len);
        ctx->in_slot = len;
    } else {
        // Into the thread's spare message buffer (core/spare_bytes.hpp): the reply goes out as the
        // RESULT's payload, which comes back there once sent.
        if (ctx->reply.capacity() == 0 && len <= bitship::SpareBytes::kMaxKept) ctx->reply = bitship::SpareBytes::take();
        ctx->reply.assign(bytes, bytes + len); // (no zero-fill first, as resize would)
    }
    ctx->answered = true;
    return BS_OK;
}

int bs_fail(bs_ctx* ctx, int code, const char* message) {
    if (!ctx) return BS_EINVAL;
    if (ctx->answered) return BS_EALREADY;
    ctx->answered = true;
    ctx->failed = true;
    ctx->fail_code = code;
    ctx->fail_message = message ? std::string(message, strnlen(message, kMaxFailMessage)) : std::string();
    return BS_OK;
}

void* bs_region(bs_ctx* ctx, const char* name, size_t* size) {
    if (size) *size = 0;
    if (!ctx || !name || !ctx->regions) return nullptr;
    const auto* r = ctx->regions->find(name);
    if (!r) return nullptr;
    if (size) *size = r->size;
    return r->base;
}

void* bs_region_create(bs_ctx* ctx, const char* name, size_t size, size_t* actual) {
    if (actual) *actual = 0;
    if (!ctx || !name || !*name || size == 0) return nullptr;
    if (ctx->regions) {
        if (const auto* r = ctx->regions->find(name)) {
            if (actual) *actual = r->size;
            return r->base;
        }
    }
    if (!ctx->create_region) return nullptr;
    const auto* r = ctx->create_region(name, size);
    if (!r) return nullptr;
    if (actual) *actual = r->size;
    return r->base;
}

int bs_self(bs_ctx* ctx, uint32_t* count) {
    std::size_t n = ctx && ctx->run ? ctx->run->peers.size() : 0;
    if (count) *count = static_cast<uint32_t>(n);
    return n ? static_cast<int>(ctx->run->self_index) : -1;
}

int bs_ship(bs_ctx* ctx, uint32_t peer, const char* entry, const void* args, size_t len) {
    if (!ctx || !entry || (!args && len)) return BS_EINVAL;
    if (ctx->answered) return BS_EALREADY;
    if (!ctx->run || peer >= ctx->run->peers.size()) return BS_ENOPEER;
    if (len > ctx->max_args) return BS_ETOOLARGE;
    ctx->answered = true;
    if (ctx->run->reply_to.empty()) {
        // The final answer could not reach the caller: say so instead of losing it.
        ctx->runtime_error = bitship::Error{
            bitship::Errc::invalid_argument,
            fmt::format("kernel '{}' tried to forward, but the caller sent no reply-to address (ship with "
                        "ShipOptions::peers or ShipOptions::forward)", ctx->run->entry)};
        return BS_ENOPEER;
    }
    if (ctx->run->hop_budget == 0) {
        ctx->runtime_error = bitship::Error{
            bitship::Errc::hop_budget_exceeded,
            fmt::format("kernel '{}' tried to forward to peer {} ({}) after {} hops: the hop budget is spent", ctx->run->entry,
                        peer, ctx->run->peers[peer], ctx->run->hops)};
        return BS_EHOPS;
    }
    bitship::agent::ForwardRequest f;
    f.peer = peer;
    f.entry = entry;
    auto* first = static_cast<const std::byte*>(args);
    f.args.assign(first, first + len);
    ctx->forward = std::move(f);
    return BS_OK;
}

int bs_forward(bs_ctx* ctx, uint32_t peer, const void* args, size_t len) {
    if (!ctx || !ctx->run) return BS_EINVAL;
    return bs_ship(ctx, peer, std::string(ctx->run->entry).c_str(), args, len);
}

} // extern "C"

namespace bitship::agent {

std::vector<jit::Export> runtime_exports() {
    return {
        {"bs_args", reinterpret_cast<void*>(&bs_args)},
        {"bs_reply", reinterpret_cast<void*>(&bs_reply)},
        {"bs_fail", reinterpret_cast<void*>(&bs_fail)},
        {"bs_region", reinterpret_cast<void*>(&bs_region)},
        {"bs_region_create", reinterpret_cast<void*>(&bs_region_create)},
        {"bs_self", reinterpret_cast<void*>(&bs_self)},
        {"bs_forward", reinterpret_cast<void*>(&bs_forward)},
        {"bs_ship", reinterpret_cast<void*>(&bs_ship)},
        // Replaces the JIT's trapping default: a forged indirect call stops the kernel with
        // policy_violation, naming the rule.
        {jit::kForgedCallSymbol, reinterpret_cast<void*>(&stop_forged_call)},
    };
}

} // namespace bitship::agent
