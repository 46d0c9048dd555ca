// Jit: compiles each hash once, keeps the result in the code cache (memory, and disk when
// configured), and hands out CompiledCode. With two tiers a new hash is compiled fast and
// served at once while TierUp compiles it fully optimised and swaps that in. The LLVM work
// itself is the Engine's (engine.cpp); GPU slices' PTX is the PtxCache's (ptx_cache.cpp).
#include "jit.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "allow_list.hpp"
#include "core/background_jobs.hpp"
#include "code_cache.hpp"
#include "compile_to_object.hpp"
#include "compiler_processes.hpp"
#include "engine.hpp"
#include "object_file.hpp"
#include "ptx_cache.hpp"
#include "ptx_compile.hpp"
#include "single_flight.hpp"
#include "tier_up.hpp"

namespace bitship::jit {
namespace {

constexpr unsigned kMaxOptLevel = 3;
constexpr unsigned kMaxTiers = 2;
constexpr unsigned kMibShift = 20;

/// One compiled slice in its own JITDylib; the entries were resolved at compile time, so
/// entry() never asks LLVM.
class CompiledSlice final : public CompiledCode {
public:
    /// `engine` is shared by every CompiledSlice and the Jit: the slice's code is unloaded
    /// through it, and a slice may outlive the Jit that made it.
    CompiledSlice(std::shared_ptr<Engine> engine, CompiledParts parts, const CodeHash& hash)
        : engine_(std::move(engine)), parts_(std::move(parts)), hash_(hash) {
        std::sort(parts_.left_out.begin(), parts_.left_out.end());
    }

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
    bool left_out(std::string_view name) const override {
        return std::binary_search(parts_.left_out.begin(), parts_.left_out.end(), name);
    }
    bool partial() const override { return !parts_.left_out.empty(); }
    const CodeHash& hash() const override { return hash_; }
    const CompileStats& stats() const override { return parts_.stats; }
    const std::vector<std::byte>& bundle() const override { return parts_.bundle; }
    std::size_t code_bytes() const override { return parts_.code_bytes; }

private:
    std::shared_ptr<Engine> engine_;
    CompiledParts parts_;
    CodeHash hash_;
};

using CodeResult = Result<std::shared_ptr<const CompiledCode>>;

/// A compile's code, and its object code when that is to go to the disk cache.
struct Built {
    std::shared_ptr<const CompiledCode> code;
    std::vector<std::byte> object;
    std::vector<std::string> entries; ///< the entries that resolved: what a later link asks for
};

std::string describe(const CompileStats& s) {
    return fmt::format("verify {:.2f} ms, parse {:.2f} ms, optimise {:.2f} ms, codegen {:.2f} ms, link {:.2f} ms",
                       s.verify_ms, s.parse_ms, s.optimise_ms, s.codegen_ms, s.link_ms);
}

class JitImpl final : public Jit {
public:
    JitImpl(std::shared_ptr<Engine> engine, std::unique_ptr<CodeCache> cache, std::shared_ptr<ObjectCompiler> compiler,
            std::string libdevice, const JitOptions& options)
        : engine_(std::move(engine)), cache_(std::move(cache)), compiler_(compiler),
          ptx_(std::move(compiler), *cache_, std::move(libdevice)),
          tiers_(options.tiers),
          key_(ObjectKey::of_this_host(options.opt_level, options.sandbox)) {
        if (tiers_ > 1) tier_up_ = std::make_unique<TierUp>();
    }

    // The tier-up thread goes first: its jobs use the cache and the engine.
    ~JitImpl() override {
        stopping_.store(true, std::memory_order_relaxed); // a preload stops at its next object
        tier_up_.reset();
    }
    JitImpl(const JitImpl&) = delete;
    JitImpl& operator=(const JitImpl&) = delete;

    CodeResult compile(std::span<const std::byte> bundle, const CodeHash& expected, std::string_view entry) override {
        return compile_once(expected, entry, [&]() -> CodeResult {
            // A restarted agent that a client sends the code again: its object is still best.
            if (auto code = from_object(expected)) return code;
            return from_bundle(bundle, expected, false, entry);
        });
    }

    std::shared_ptr<const CompiledCode> find(const CodeHash& hash) const override { return cache_->find(hash); }
    std::uint64_t cache_generation() const noexcept override { return cache_->generation(); }

    std::vector<CachedCodeInfo> cached() const override { return cache_->list(); }

    bool evict(const CodeHash& hash) override {
        const bool code = cache_->evict(hash);
        const bool ptx = ptx_.evict(hash);
        return code || ptx;
    }

    Result<std::shared_ptr<const std::string>> compile_ptx(std::span<const std::byte> bundle, const CodeHash& expected,
                                                           unsigned sm) override {
        return ptx_.get(bundle, expected, sm);
    }
    std::uint64_t ptx_compiles() const override { return ptx_.compiles(); }

    std::size_t tier_ups_pending() override { return tier_up_ ? tier_up_->pending() : 0; }
    std::uint64_t tier_ups_finished() const override { return tier_up_ ? tier_up_->finished() : 0; }
    void drain_tier_ups() override {
        if (tier_up_) tier_up_->drain();
        background_.flush();
    }

    bool on_disk(const CodeHash& hash) const override { return cache_->on_disk(hash); }

    CodeResult load(const CodeHash& hash) override {
        return compile_once(hash, {}, [&] { return from_disk(hash); });
    }

    Result<void> warm_up() override { return engine_->warm_up(); }
    void stop_compiles() override { compiler_->stop_compiles(); }

    void preload(std::size_t max_objects) override {
        if (!cache_->has_dir() || max_objects == 0) return;
        background_.post([this, max_objects] {
            std::size_t linked = 0;
            for (const auto& hash : cache_->objects_most_recent_first()) {
                if (stopping_.load(std::memory_order_relaxed) || linked >= max_objects) break;
                if (const auto cap = cache_->memory_cap(); cap != 0 && cache_->memory_bytes() >= cap / 2) break;
                if (cache_->find(hash)) continue; // a call got there first
                auto code = load(hash);
                if (!code) {
                    spdlog::warn("jit: preloading {}: {}", to_hex(hash, kHashDigitsInMessages), code.error().describe());
                    continue;
                }
                ++linked;
                preloaded_.fetch_add(1, std::memory_order_relaxed);
            }
            if (linked) spdlog::info("jit: {} object{} from the disk cache linked ahead of first calls", linked, linked == 1 ? "" : "s");
        });
    }

    std::uint64_t preloaded() const override { return preloaded_.load(std::memory_order_relaxed); }

private:
    /// Compiles each hash once: a thread asking for a hash that another is compiling waits
    /// for, and returns, that one's result. The code cached is enough unless it leaves `entry`
    /// out. `make` puts its code into the memory cache.
    ///
    /// The compile waited for may be a first one that holds only the kernel its own call named,
    /// and leaves `entry` out: then once more, and with that part cached, `make` compiles the
    /// slice whole. (Only when the part was evicted meanwhile, and another first compile of
    /// the hash is under way, can the answer still leave `entry` out: the caller asks again.)
    template <class Make> CodeResult compile_once(const CodeHash& expected, std::string_view entry, Make make) {
        auto cached_enough = [&]() -> std::optional<CodeResult> {
            auto code = cache_->find(expected);
            if (code && !code->left_out(entry)) return code;
            return std::nullopt;
        };
        auto once = [&] {
            return in_flight_.run(expected, cached_enough, [&]() -> CodeResult {
                try {
                    return make();
                } catch (const std::exception& e) { // bad_alloc, mostly: an answer, not a dead agent
                    return fail(Errc::internal,
                                fmt::format("compiling {}: {}", to_hex(expected, kHashDigitsInMessages), e.what()));
                }
            });
        };
        auto code = once();
        if (code && !entry.empty() && (*code)->left_out(entry)) code = once();
        return code;
    }

    /// The first compile of a hash: tier 0 (for `entry` alone where it can) with tier 1 queued
    /// behind it, or tier 1 at once (one tier, or a slice that holds state: the compiler makes
    /// that optimised, and it is never swapped). When a tier 0 that left `entry` out is held,
    /// the whole slice at tier 0, replacing it.
    CodeResult from_bundle(std::span<const std::byte> bundle, const CodeHash& expected, bool from_disk,
                           std::string_view entry = {}) {
        const Tier tier = tier_up_ ? Tier::fast : Tier::optimised;
        const bool completing = cache_->find(expected) != nullptr;
        auto built = build(bundle, expected, tier, from_disk, completing ? std::string_view{} : entry);
        if (!built) return tl::make_unexpected(built.error());
        auto code = cache_->insert(built->code);
        if (built->code->stats().tier == static_cast<unsigned>(Tier::optimised)) {
            if (!from_disk) keep_on_disk(expected, DiskFile::bundle, code->bundle());
            keep_object(expected, *built);
        } else {
            // The first call waits for this compile, not for the slice's copy on disk (a file
            // write costs 0.1-0.3 ms here): that is written behind it, and before the agent stops.
            if (!completing && !from_disk && cache_->has_dir())
                background_.post([this, expected, slice = code->bundle()] { keep_on_disk(expected, DiskFile::bundle, slice); });
            // Again when completing: the part's tier-up finds nothing to do if the part was
            // evicted meanwhile; a job already queued for the hash absorbs this one.
            tier_up_->post(expected, [this, expected, slice = code->bundle(), from_disk] {
                optimise_in_background(slice, expected, from_disk);
            });
        }
        return code;
    }

    /// A restarted agent's way in: the object made for this host if there is one, else the
    /// bundle, compiled again.
    CodeResult from_disk(const CodeHash& hash) {
        const std::string hex = to_hex(hash, kHashDigitsInMessages);
        if (auto code = from_object(hash)) return code;
        auto bytes = cache_->read(hash, DiskFile::bundle);
        if (!bytes) return tl::make_unexpected(bytes.error());
        auto code = from_bundle(*bytes, hash, true);
        // A GPU slice's bundle (kept by compile_ptx) is whole, just not CPU code: it stays.
        if (!code && code.error().code == Errc::no_matching_slice) return code;
        if (!code) {
            // Whatever is wrong with the file (torn, tampered with, or code this agent no
            // longer accepts), the client still has the bundle: drop the file and ask for it.
            cache_->remove(hash);
            return fail(Errc::code_missing, fmt::format("disk cache entry {} was unusable and is removed ({})", hex,
                                                        code.error().describe()));
        }
        return code;
    }

    /// The disk cache's object for `hash` linked and cached, or nullptr when there is none or
    /// it is refused (then it is removed: the bundle makes a new one).
    std::shared_ptr<const CompiledCode> from_object(const CodeHash& hash) {
        if (!cache_->on_disk(hash, DiskFile::object)) return nullptr;
        auto linked = link_cached_object(hash);
        if (linked) return cache_->insert(*linked);
        // Made by another LLVM or for another CPU, torn, or refused by the linker: the
        // bundle is still there, so the object is replaced, not trusted.
        spdlog::warn("jit: disk cache object {} refused ({}); compiling its bundle again",
                     to_hex(hash, kHashDigitsInMessages), linked.error().describe());
        cache_->remove(hash, DiskFile::object);
        return nullptr;
    }

    CodeResult link_cached_object(const CodeHash& hash) {
        auto bytes = cache_->read(hash, DiskFile::object);
        if (!bytes) return tl::make_unexpected(bytes.error());
        auto file = decode_object_file(*bytes);
        if (!file) return tl::make_unexpected(file.error());
        if (file->hash != hash) return fail(Errc::malformed_bundle, "it holds the code of another hash");
        if (file->key != key_)
            return fail(Errc::malformed_bundle,
                        fmt::format("made by LLVM {} for {} {} at O{}, sandbox {}; this agent is LLVM {} on {} {} at "
                                    "O{}, sandbox {}{}",
                                    file->key.llvm, file->key.triple, file->key.cpu, file->key.opt_level,
                                    to_string(file->key.sandbox), key_.llvm, key_.triple, key_.cpu, key_.opt_level,
                                    to_string(key_.sandbox),
                                    file->key.features == key_.features ? "" : ", other CPU features"));
        // The bundle travels on to peers, so it must be whole: its slice hashes are checked,
        // never its bitcode parsed.
        auto bundle = cache_->read(hash, DiskFile::bundle);
        if (!bundle) return tl::make_unexpected(bundle.error());
        auto view = BundleView::parse(*bundle);
        if (!view) return tl::make_unexpected(view.error());
        if (view->slices.size() != 1 || view->slices.front().hash != hash)
            return fail(Errc::malformed_bundle, "its bundle file does not hold exactly that slice");
        auto parts = engine_->link_object(file->object, file->entries, std::move(*bundle), hash);
        if (!parts) return tl::make_unexpected(parts.error());
        return std::make_shared<CompiledSlice>(engine_, std::move(*parts), hash);
    }

    /// The tier-up job: compiles `slice` at tier 1 and swaps it in. Nothing to do when the hash
    /// is already optimised or was evicted meanwhile (a later first call starts over: many
    /// distinct kernels under a small cap cost no optimiser time). Tier 0 keeps serving if
    /// this fails.
    void optimise_in_background(const std::vector<std::byte>& slice, const CodeHash& hash, bool from_disk) {
        const std::string hex = to_hex(hash, kHashDigitsInMessages);
        if (auto held = cache_->tier_of(hash); !held || *held >= static_cast<unsigned>(Tier::optimised)) return;
        auto built = build(slice, hash, Tier::optimised, from_disk);
        if (!built) {
            if (built.error().code == Errc::shutting_down) // stop_compiles(): the agent stops
                spdlog::info("jit: tier 1 of {} not made: {}", hex, built.error().message);
            else
                spdlog::warn("jit: tier 1 of {} failed, tier 0 keeps serving: {}", hex, built.error().describe());
            return;
        }
        const bool swapped = cache_->upgrade(built->code);
        spdlog::info("jit: optimised {} (tier 1, {}){}", hex, describe(built->code->stats()),
                     swapped ? "" : "; evicted meanwhile, not swapped in");
        keep_object(hash, *built);
    }

    Result<Built> build(std::span<const std::byte> bundle, const CodeHash& expected, Tier tier, bool from_disk,
                        std::string_view only = {}) {
        // A tier-0 request may come back optimised (a slice that holds state): its object is
        // kept too.
        auto parts = engine_->compile(bundle, expected, tier, cache_->has_dir(), only);
        if (!parts) return tl::make_unexpected(parts.error());
        parts->stats.from_disk = from_disk;
        Built out;
        out.object = std::move(parts->object);
        if (parts->stats.tier != static_cast<unsigned>(Tier::optimised)) out.object.clear();
        for (const auto& [name, fn] : parts->entries) out.entries.push_back(name);
        out.code = std::make_shared<CompiledSlice>(engine_, std::move(*parts), expected);
        return out;
    }

    void keep_object(const CodeHash& hash, const Built& built) {
        if (built.object.empty() || !cache_->has_dir()) return;
        ObjectFile file;
        file.key = key_;
        file.hash = hash;
        file.entries = built.entries;
        file.object = built.object;
        keep_on_disk(hash, DiskFile::object, encode_object_file(file));
    }

    void keep_on_disk(const CodeHash& hash, DiskFile kind, std::span<const std::byte> bytes) {
        if (!cache_->has_dir()) return;
        if (auto stored = cache_->store(hash, kind, bytes); !stored)
            spdlog::warn("jit: {} {} not kept on disk: {}", kind == DiskFile::bundle ? "slice" : "object of",
                         to_hex(hash, kHashDigitsInMessages), stored.error().describe());
    }

    std::shared_ptr<Engine> engine_; // declared before cache_: cached code unloads through it
    std::unique_ptr<CodeCache> cache_;
    std::shared_ptr<ObjectCompiler> compiler_; // the Engine's and ptx_'s: for stop_compiles()
    PtxCache ptx_; // after cache_, which it keeps PTX files in
    std::atomic<bool> stopping_{false};
    std::atomic<std::uint64_t> preloaded_{0};
    // After cache_ and engine_: its jobs (slice files written behind first calls, the preload)
    // use both, and it finishes them before they go.
    BackgroundJobs background_{"bitship-jit-bg"};
    const unsigned tiers_;
    const ObjectKey key_; // what this agent's objects are made for
    SingleFlight<CodeHash, CodeResult> in_flight_;
    std::unique_ptr<TierUp> tier_up_; // null with one tier
};

/// libdevice's bytes, for GPU slices' PTX: the file `options` names (an error when it cannot be
/// read), else the one find_libdevice() finds (a warning when it cannot be read), else none.
Result<std::vector<std::byte>> libdevice_for(const JitOptions& options) {
    if (!options.libdevice.empty()) return read_libdevice(options.libdevice);
    auto found = read_libdevice(find_libdevice());
    if (found) return found;
    spdlog::warn("jit: GPU kernels that call libdevice will not compile: {}", found.error().describe());
    return std::vector<std::byte>{};
}

/// The ObjectCompiler `options` ask for, checking for the allow-list's names. Shared by the
/// Engine (CPU code) and the PtxCache (GPU code).
Result<std::shared_ptr<ObjectCompiler>> make_compiler(const JitOptions& options, const AllowList& allow,
                                                      std::vector<std::byte> libdevice) {
    if (options.compiler.mode == CompilerMode::in_process) {
        SymbolNames names;
        for (const auto& [name, address] : allow.symbols()) names.insert(name);
        auto c = InProcessCompiler::create(std::move(names), options.opt_level, options.sandbox, std::move(libdevice));
        if (!c) return tl::make_unexpected(c.error());
        return std::shared_ptr<ObjectCompiler>(std::move(*c));
    }
    auto program = find_compiler_program(options.compiler.path);
    if (!program) return tl::make_unexpected(program.error());
    if (options.compiler.memory_mib == 0 || options.compiler.memory_mib > (std::numeric_limits<std::size_t>::max() >> kMibShift))
        return fail(Errc::invalid_argument, fmt::format("compiler memory limit {} MiB", options.compiler.memory_mib));
    CompilerProcessOptions po;
    po.program = *program;
    po.processes = options.compiler.processes;
    po.opt_level = options.opt_level;
    po.sandbox = options.sandbox;
    for (const auto& [name, address] : allow.symbols()) po.allowed.push_back(name);
    po.libdevice = std::move(libdevice);
    po.cpu_limit = options.compiler.cpu_limit;
    po.memory_bytes = options.compiler.memory_mib << kMibShift;
    auto c = CompilerProcesses::start(std::move(po));
    if (!c) return tl::make_unexpected(c.error());
    return std::shared_ptr<ObjectCompiler>(std::move(*c));
}

} // namespace

Result<std::unique_ptr<Jit>> Jit::create(JitOptions options) {
    if (options.opt_level > kMaxOptLevel)
        return fail(Errc::invalid_argument, fmt::format("opt_level {} (must be 0..{})", options.opt_level, kMaxOptLevel));
    if (options.tiers < 1 || options.tiers > kMaxTiers)
        return fail(Errc::invalid_argument, fmt::format("tiers {} (must be 1 or {})", options.tiers, kMaxTiers));
    constexpr std::size_t kMaxMib = std::numeric_limits<std::size_t>::max() >> kMibShift;
    if (options.cache_mib > kMaxMib || options.cache_disk_mib > kMaxMib)
        return fail(Errc::invalid_argument, "cache size over the address space");
    if (options.sandbox == Sandbox::sfi) {
        if (options.zones.code == nullptr || options.zones.data == nullptr)
            return fail(Errc::invalid_argument, "sandbox sfi needs the arena's code zones");
        for (const char* name : {kArenaBaseSymbol, kArenaMaskSymbol, kUnsafeStackSymbol, kStackOverflowSymbol})
            if (std::none_of(options.exports.begin(), options.exports.end(), [&](const Export& e) { return e.name == name; }))
                return fail(Errc::invalid_argument, fmt::format("sandbox sfi needs the export {}", name));
    } else if (options.sandbox != Sandbox::none) {
        return fail(Errc::invalid_argument, fmt::format("sandbox mode {}", static_cast<unsigned>(options.sandbox)));
    }
    auto allow = AllowList::make(options.exports);
    if (!allow) return tl::make_unexpected(allow.error());
    auto cache = CodeCache::open(options.cache_dir, options.cache_mib << kMibShift, options.cache_disk_mib << kMibShift);
    if (!cache) return tl::make_unexpected(cache.error());
    auto libdevice = libdevice_for(options);
    if (!libdevice) return tl::make_unexpected(libdevice.error());
    std::string libdevice_named = libdevice_id(*libdevice);
    auto compiler = make_compiler(options, *allow, std::move(*libdevice));
    if (!compiler) return tl::make_unexpected(compiler.error());
    auto engine = Engine::start(std::move(*allow), *compiler, options.sandbox, options.zones);
    if (!engine) return tl::make_unexpected(engine.error());
    return std::unique_ptr<Jit>(
        new JitImpl(std::shared_ptr<Engine>(std::move(*engine)), std::move(*cache), std::move(*compiler),
                    std::move(libdevice_named), options));
}

} // namespace bitship::jit
