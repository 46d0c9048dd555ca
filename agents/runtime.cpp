#include "runtime.hpp"

#include <cstring>

namespace {
constexpr std::size_t kMaxFailMessage = 1024;
constexpr char kNoArgs[1] = {};
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
    ctx->reply.resize(len);
    if (len) std::memcpy(ctx->reply.data(), data, len);
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

} // extern "C"

namespace bitship::agent {

std::vector<jit::Export> runtime_exports() {
    return {
        {"bs_args", reinterpret_cast<void*>(&bs_args)},
        {"bs_reply", reinterpret_cast<void*>(&bs_reply)},
        {"bs_fail", reinterpret_cast<void*>(&bs_fail)},
    };
}

} // namespace bitship::agent
