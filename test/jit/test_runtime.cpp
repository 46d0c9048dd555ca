#include "test_runtime.hpp"

#include <cstring>
#include <fstream>
#include <iterator>
#include <stdexcept>

extern "C" {

const void* bs_args(bs_ctx* ctx, size_t* len) {
    static const std::byte kNone{};
    if (ctx == nullptr) {
        if (len != nullptr) *len = 0;
        return &kNone;
    }
    if (len != nullptr) *len = ctx->args.size();
    return ctx->args.empty() ? &kNone : ctx->args.data(); // "never null"
}

int bs_reply(bs_ctx* ctx, const void* data, size_t len) {
    if (ctx == nullptr || (data == nullptr && len != 0)) return BS_EINVAL;
    if (ctx->answered()) return BS_EALREADY;
    const auto* bytes = static_cast<const std::byte*>(data);
    ctx->reply.emplace(bytes, bytes + len);
    return BS_OK;
}

int bs_fail(bs_ctx* ctx, int code, const char* message) {
    if (ctx == nullptr) return BS_EINVAL;
    if (ctx->answered()) return BS_EALREADY;
    ctx->fail_code = code;
    ctx->fail_message = message != nullptr ? message : "";
    return BS_OK;
}

} // extern "C"

namespace bitship::jit_test {

std::vector<jit::Export> runtime_exports() {
    return {
        {"bs_args", reinterpret_cast<void*>(&bs_args)},
        {"bs_reply", reinterpret_cast<void*>(&bs_reply)},
        {"bs_fail", reinterpret_cast<void*>(&bs_fail)},
    };
}

bs_ctx call(bs_entry_fn entry, std::span<const std::byte> args) {
    bs_ctx ctx;
    ctx.args = args;
    entry(&ctx);
    return ctx;
}

std::optional<std::uint64_t> reply_u64(const bs_ctx& ctx) {
    if (!ctx.reply || ctx.reply->size() != sizeof(std::uint64_t)) return std::nullopt;
    std::uint64_t v;
    std::memcpy(&v, ctx.reply->data(), sizeof v);
    return v;
}

std::vector<std::byte> kernel_bitcode(const std::string& name) {
    std::string path = std::string(BITSHIP_TEST_KERNEL_DIR) + "/" + name + ".bc";
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::runtime_error("cannot read kernel bitcode " + path);
    std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::vector<std::byte> out(chars.size());
    std::memcpy(out.data(), chars.data(), chars.size());
    return out;
}

Bundle make_bundle(std::span<const std::byte> bitcode, std::vector<std::string> entries, std::string triple,
                   LlvmVersion llvm) {
    SliceInput slice{std::move(triple), "generic", "clang (bitship jit_test)", llvm, bitcode};
    Bundle b;
    b.bytes = write_bundle(entries, std::span(&slice, 1));
    b.hash = hash_code(bitcode);
    return b;
}

} // namespace bitship::jit_test
