// Jit: compiles each hash once, keeps the result in the code cache (memory, and disk when
// configured), and hands out CompiledCode. The LLVM work itself is the Engine's (engine.cpp).
#include "jit.hpp"

#include <future>
#include <map>
#include <mutex>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "allow_list.hpp"
#include "code_cache.hpp"
#include "engine.hpp"

namespace bitship::jit {
namespace {

constexpr unsigned kMaxOptLevel = 3;
constexpr std::size_t kHashDigitsInMessages = 16;

/// One compiled slice in its own JITDylib; the entries were resolved at compile time, so
/// entry() never asks LLVM.
class CompiledSlice final : public CompiledCode {
public:
    /// `engine` is shared by every CompiledSlice and the Jit: the slice's code is unloaded
    /// through it, and a slice may outlive the Jit that made it.
    CompiledSlice(std::shared_ptr<Engine> engine, CompiledParts parts, const CodeHash& hash)
        : engine_(std::move(engine)), parts_(std::move(parts)), hash_(hash) {}

    ~CompiledSlice() override { engine_->unload(*parts_.dylib); }
    CompiledSlice(const CompiledSlice&) = delete;
    CompiledSlice& operator=(const CompiledSlice&) = delete;

    Result<bs_entry_fn> entry(std::string_view name) const override {
        auto it = parts_.entries.find(name);
        if (it == parts_.entries.end())
            return fail(Errc::entry_not_found,
                        fmt::format("slice {} has no kernel '{}'", to_hex(hash_, kHashDigitsInMessages), name));
        return it->second;
    }
    const CodeHash& hash() const override { return hash_; }
    const CompileStats& stats() const override { return parts_.stats; }
    const std::vector<std::byte>& bundle() const override { return parts_.bundle; }

private:
    std::shared_ptr<Engine> engine_;
    CompiledParts parts_;
    CodeHash hash_;
};

using CodeResult = Result<std::shared_ptr<const CompiledCode>>;

class JitImpl final : public Jit {
public:
    JitImpl(std::shared_ptr<Engine> engine, std::unique_ptr<CodeCache> cache)
        : engine_(std::move(engine)), cache_(std::move(cache)) {}

    CodeResult compile(std::span<const std::byte> bundle, const CodeHash& expected) override {
        return compile_once(bundle, expected, false);
    }

    std::shared_ptr<const CompiledCode> find(const CodeHash& hash) const override { return cache_->find(hash); }

    bool on_disk(const CodeHash& hash) const override { return cache_->on_disk(hash); }

    CodeResult load(const CodeHash& hash) override {
        if (auto code = cache_->find(hash)) return code;
        auto bytes = cache_->read(hash);
        if (!bytes) return tl::make_unexpected(bytes.error());
        auto code = compile_once(*bytes, hash, true);
        if (!code) {
            // Whatever is wrong with the file (torn, tampered with, or code this agent no
            // longer accepts), the client still has the bundle: drop the file and ask for it.
            cache_->remove(hash);
            return fail(Errc::code_missing, fmt::format("disk cache entry {} was unusable and is removed ({})",
                                                        to_hex(hash, kHashDigitsInMessages), code.error().describe()));
        }
        return code;
    }

private:
    /// Compiles each hash once: a thread asking for a hash that another is compiling waits
    /// for, and returns, that one's result.
    CodeResult compile_once(std::span<const std::byte> bundle, const CodeHash& expected, bool from_disk) {
        if (auto code = cache_->find(expected)) return code;
        std::promise<CodeResult> promise;
        {
            std::unique_lock lock(in_flight_mutex_);
            if (auto code = cache_->find(expected)) return code; // finished meanwhile
            if (auto it = in_flight_.find(expected); it != in_flight_.end()) {
                auto pending = it->second;
                lock.unlock();
                return pending.get();
            }
            in_flight_.emplace(expected, promise.get_future().share());
        }
        CodeResult result = build(bundle, expected, from_disk);
        if (result) {
            // Into the memory cache before leaving in_flight_, so no thread finds neither.
            result = cache_->insert(*result);
            if (!from_disk && cache_->has_dir()) {
                if (auto stored = cache_->store(expected, (*result)->bundle()); !stored)
                    spdlog::warn("jit: slice {} not kept on disk: {}", to_hex(expected, kHashDigitsInMessages),
                                 stored.error().describe());
            }
        }
        {
            std::lock_guard lock(in_flight_mutex_);
            in_flight_.erase(expected);
        }
        promise.set_value(result);
        return result;
    }

    CodeResult build(std::span<const std::byte> bundle, const CodeHash& expected, bool from_disk) {
        try {
            auto parts = engine_->compile(bundle, expected);
            if (!parts) return tl::make_unexpected(parts.error());
            parts->stats.from_disk = from_disk;
            return std::make_shared<CompiledSlice>(engine_, std::move(*parts), expected);
        } catch (const std::exception& e) { // bad_alloc, mostly: an answer, not a dead agent
            return fail(Errc::internal,
                        fmt::format("compiling {}: {}", to_hex(expected, kHashDigitsInMessages), e.what()));
        }
    }

    Result<void> warm_up() override { return engine_->warm_up(); }

    std::shared_ptr<Engine> engine_; // declared before cache_: cached code unloads through it
    std::unique_ptr<CodeCache> cache_;
    std::mutex in_flight_mutex_;
    std::map<CodeHash, std::shared_future<CodeResult>> in_flight_;
};

} // namespace

Result<std::unique_ptr<Jit>> Jit::create(JitOptions options) {
    if (options.opt_level > kMaxOptLevel)
        return fail(Errc::invalid_argument, fmt::format("opt_level {} (must be 0..{})", options.opt_level, kMaxOptLevel));
    auto allow = AllowList::make(options.exports);
    if (!allow) return tl::make_unexpected(allow.error());
    auto cache = CodeCache::open(options.cache_dir);
    if (!cache) return tl::make_unexpected(cache.error());
    auto engine = Engine::start(std::move(*allow), options.opt_level);
    if (!engine) return tl::make_unexpected(engine.error());
    return std::unique_ptr<Jit>(new JitImpl(std::shared_ptr<Engine>(std::move(*engine)), std::move(*cache)));
}

} // namespace bitship::jit
