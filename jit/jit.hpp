#pragma once
// The agent's JIT: verifies a bundle slice, retargets it to this host, optimises it, links it
// against an allow-list only, and keeps the result in a content-addressed cache (memory + disk).
// No LLVM type appears here: jit/ converts llvm::Error to bitship::Error at its boundary.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <bitship/bundle.hpp>
#include <bitship/errc.hpp>
#include <bitship/kernel.h>

namespace bitship::jit {

/// What this host is, as LLVM sees it; sent to clients on connect.
struct HostInfo {
    std::string triple;   ///< e.g. "x86_64-pc-linux-gnu"
    std::string cpu;      ///< e.g. "znver3"
    std::string features; ///< e.g. "+avx2,+fma,..."
    LlvmVersion llvm;     ///< the LLVM this agent links
};

/// Detected once, then cached.
const HostInfo& host();

/// A symbol the JIT may link kernels against.
struct Export {
    std::string name;
    void* address = nullptr;
};

/// The curated libc/libm/compiler-runtime subset every agent exports (memcpy, memset, sqrt, ...).
std::vector<Export> curated_exports();

/// Where shipped bitcode is read, checked, optimised and turned into object code.
enum class CompilerMode {
    /// In this process: the cheapest, and what a process without seccomp or a test needs; a
    /// crafted slice that crashes LLVM takes the process down.
    in_process,
    /// In long-lived bitship-compiler processes, confined (seccomp) and limited (CPU time,
    /// address space) per compile; their crash is one caller's compile_failed. The object code
    /// they return is linked here, against the allow-list only.
    process,
};

/// Where compiles run, and within what limits.
struct CompilerOptions {
    CompilerMode mode = CompilerMode::in_process;
    /// The bitship-compiler program; empty: the one beside this program's executable.
    std::filesystem::path path;
    /// How many compiles may run at once (one process each); more wait for one.
    unsigned processes = 2;
    /// Each compile's CPU time, and each process's address space beyond its start-up size.
    std::chrono::seconds cpu_limit{10};
    std::size_t memory_mib = 2048;
};

/// What shipped code calls, instead of making the call, when the run-time check of policy rule
/// no-forged-call finds an indirect call to something the kernel does not define. It never
/// returns. The curated export traps (SIGILL); an agent exports its own under this name that
/// stops the kernel with policy_violation.
inline constexpr const char* kForgedCallSymbol = "__bitship_forged_call";

/// How shipped code is confined (xagent --sandbox).
enum class Sandbox : unsigned {
    /// Today's behaviour: kernels reach all of the agent's memory (operators who trust their code).
    none = 0,
    /// Software fault isolation (sfi_pass.hpp): every load, store and memory intrinsic is
    /// confined to the agent's arena, address-taken stack data lives on an unsafe stack inside
    /// it, return addresses and spills stay on the thread's own stack outside it.
    sfi = 1,
};
[[nodiscard]] std::string_view to_string(Sandbox mode);

/// Symbols code compiled for Sandbox::sfi refers to; the agent defines them in that mode.
/// Absolute symbols whose *address* is the value: the arena's base (aligned to its size) and
/// its size minus one. A confined address is (address & mask) | base.
inline constexpr const char* kArenaBaseSymbol = "__bs_arena_base";
inline constexpr const char* kArenaMaskSymbol = "__bs_arena_mask";
/// `bs_unsafe_stack* __bs_unsafe_stack(void)`: the calling thread's unsafe stack (below).
inline constexpr const char* kUnsafeStackSymbol = "__bs_unsafe_stack";
/// `void __bs_stack_overflow(void)`, never returns: a frame would go below the unsafe stack's limit.
inline constexpr const char* kStackOverflowSymbol = "__bs_stack_overflow";

/// What __bs_unsafe_stack returns: a thread's stack for address-taken data, inside the arena,
/// growing down. Instrumented functions move `sp` down by their frame on entry (calling
/// __bs_stack_overflow when it would pass `limit`) and put it back on return.
struct UnsafeStack {
    std::byte* sp = nullptr;
    std::byte* limit = nullptr;
};

/// Where the linker places sandboxed code: data (read-only and writable segments, the GOT)
/// inside the arena so that confined loads and stores reach it, code (R-X) outside it, and the
/// two within 2 GiB of each other (code model small: PC-relative references). Both ranges are
/// reserved (PROT_NONE) by their owner and page-aligned; the JIT maps and protects pages in them.
struct CodeZones {
    std::byte* data = nullptr;
    std::size_t data_size = 0;
    std::byte* code = nullptr;
    std::size_t code_size = 0;
};

struct JitOptions {
    /// The kernel.h runtime plus what the operator exports on purpose; the curated libc/libm
    /// subset is added by the JIT itself. Nothing outside these resolves.
    std::vector<Export> exports;
    /// 0..3: the optimisation level of the compile.
    unsigned opt_level = 2;
    /// Where compiled slices are kept across restarts (the bundle, and the optimised object
    /// code for this host); empty keeps them in memory only.
    std::filesystem::path cache_dir;
    /// 2: a new hash is first compiled fast (tier 0) and runs at once, while the full
    /// optimisation at `opt_level` (tier 1) runs on a background thread and is swapped in for
    /// later calls. 1: every compile is the full one, on the caller's thread.
    unsigned tiers = 2;
    /// Caps the compiled code held in memory, MiB (least recently used evicted first, never
    /// code a call holds); 0: unbounded.
    std::size_t cache_mib = 0;
    /// Caps the files in `cache_dir`, MiB (least recently used evicted first); 0: unbounded.
    std::size_t cache_disk_mib = 0;
    /// Where compiles run (xagent's default: CompilerMode::process).
    CompilerOptions compiler;
    /// How shipped code is confined. Sandbox::sfi needs `zones`, and `exports` defining the
    /// kArena*/kUnsafeStack/kStackOverflow symbols; its objects are cached apart from none's.
    Sandbox sandbox = Sandbox::none;
    CodeZones zones;
    /// libdevice.10.bc, which GPU kernels' __nv_* calls are linked against (Jit::compile_ptx);
    /// read once, by create() (no_device when it cannot be read), and handed to the compiler.
    /// Empty: the one find_libdevice() finds ($CUDA_HOME, $CUDA_PATH, /usr/local/cuda), or none.
    std::filesystem::path libdevice;
};

/// Where a compile spent its time, in milliseconds.
struct CompileStats {
    double verify_ms = 0;   ///< bundle checks, slice choice, hash check
    double parse_ms = 0;    ///< bitcode → IR, IR verifier, allow-list check
    double optimise_ms = 0; ///< host retargeting + the pass pipeline
    double codegen_ms = 0;  ///< IR → object code
    double link_ms = 0;     ///< JIT linking, symbol resolution, entry lookups
    bool from_disk = false; ///< the slice came from the disk cache, not the wire
    bool from_object = false; ///< loaded as object code from the disk cache: no parse, optimise or codegen
    unsigned tier = 0;        ///< 0: the fast first compile; 1: fully optimised
    [[nodiscard]] double total_ms() const { return verify_ms + parse_ms + optimise_ms + codegen_ms + link_ms; }
};

/// One compiled slice: its entry points resolved once. Immutable after compile, so any thread
/// may call entry(); it stays loaded while anyone holds it.
class CompiledCode {
public:
    virtual ~CompiledCode() = default;
    /// The address of kernel `name`, or entry_not_found naming it.
    [[nodiscard]] virtual Result<bs_entry_fn> entry(std::string_view name) const = 0;
    /// Whether kernel `name` is in the slice but not in this code: the tier-0 compile for a
    /// slice's first call holds only the kernel that call named and what it reaches (see
    /// Jit::compile). To run it, compile the slice again naming it.
    [[nodiscard]] virtual bool left_out(std::string_view name) const = 0;
    /// Whether some of the slice's kernels are left out of this code.
    [[nodiscard]] virtual bool partial() const = 0;
    [[nodiscard]] virtual const CodeHash& hash() const = 0;
    [[nodiscard]] virtual const CompileStats& stats() const = 0;
    /// The single-slice bundle this was compiled from: what an agent forwards to a peer.
    [[nodiscard]] virtual const std::vector<std::byte>& bundle() const = 0;
    /// The memory its code and data occupy, bytes (the JIT linker's segments, page-rounded).
    [[nodiscard]] virtual std::size_t code_bytes() const = 0;

    /// Marks it used at `now_ns` (the coarse monotonic clock): the memory cache evicts the
    /// least recently used first. Any thread; written only when the clock moved, so the calls
    /// of a burst do not all dirty the line.
    void touch(std::int64_t now_ns) const noexcept {
        if (last_use_.load(std::memory_order_relaxed) != now_ns) last_use_.store(now_ns, std::memory_order_relaxed);
    }
    [[nodiscard]] std::int64_t last_use() const noexcept { return last_use_.load(std::memory_order_relaxed); }

private:
    // Here, not in the cache's entry: a caller that holds the code (Agent's last call) marks it
    // used without the cache's lock, and the entry may be gone by then.
    mutable std::atomic<std::int64_t> last_use_{0};
};

/// One entry of the in-memory code cache, as an operator sees it (Jit::cached()).
struct CachedCodeInfo {
    CodeHash hash{};
    std::size_t code_bytes = 0; ///< see CompiledCode::code_bytes
    std::size_t disk_bytes = 0; ///< its bundle and object files in the disk cache (0: none)
    unsigned tier = 0;          ///< 0: fast first compile; 1: fully optimised
    std::chrono::steady_clock::time_point last_use; ///< last find() or compile (a few ms coarse)
    bool in_use = false;        ///< held outside the cache when listed (e.g. by a running call)
    CompileStats stats;         ///< how the held tier was made
};

/// Thread-safe: several worker threads may compile at once; lookups are cheap.
class Jit {
public:
    static Result<std::unique_ptr<Jit>> create(JitOptions options);
    virtual ~Jit() = default;

    /// Compiles `bundle` (usually holding just the slice for this host) and caches it under
    /// `expected`: at tier 0 when tiering is on (tier 1 follows in the background). With
    /// `entry` (the kernel the call that brought it names), that tier-0 compile holds only
    /// that kernel and what it reaches; a later compile naming a kernel left out makes the
    /// whole slice at tier 0 and replaces it, unless tier 1 is there first. A slice that
    /// defines a writable global (state its kernels keep between calls) is compiled once, whole
    /// and at tier 1, and never swapped: two compiles would each hold a copy of that state. It
    /// stays until evicted (an evicted slice starts over with fresh state). Errors:
    /// malformed_bundle (also: no slice hashes to `expected`), no_matching_slice (names the bundle's triples and this host's), producer_too_new (names
    /// both versions), invalid_bitcode, unresolved_symbol (names every missing symbol),
    /// compile_failed. Compiling a hash already cached returns the cached code.
    virtual Result<std::shared_ptr<const CompiledCode>> compile(std::span<const std::byte> bundle,
                                                               const CodeHash& expected, std::string_view entry = {}) = 0;

    /// The best cached code for `hash` from memory (tier 1 once it is ready), or nullptr.
    /// Never touches the disk; a shared lock and a map lookup. Code a caller holds stays
    /// loaded however the cache changes meanwhile (tier swap, eviction).
    [[nodiscard]] virtual std::shared_ptr<const CompiledCode> find(const CodeHash& hash) const = 0;
    /// Changes whenever the memory cache holds other code for some hash (a compile, a tier swap,
    /// an eviction): while it has not changed, code found before is still what find() gives,
    /// so a caller that keeps it may use it again without a lookup (touching it). One load.
    [[nodiscard]] virtual std::uint64_t cache_generation() const noexcept = 0;

    /// Every entry of the memory cache, least recently used first.
    [[nodiscard]] virtual std::vector<CachedCodeInfo> cached() const = 0;

    /// Drops the cache's reference to `hash` (memory only; the disk copy stays), and the PTX
    /// held for it. Code a caller still holds is freed when the last holder lets go. False when
    /// `hash` was not cached.
    virtual bool evict(const CodeHash& hash) = 0;

    /// The PTX for the nvptx64 slice `expected` of `bundle`, for GPUs of compute capability `sm`
    /// (major*10+minor; PTX is made for sm_min(sm, 90), and kept once for all sm from 90 on):
    /// checked like compile() checks a CPU slice (bundle structure, the slice hashing to
    /// `expected`, triple nvptx64, producer LLVM not newer than ours), compiled where CPU code is
    /// compiled (a bitship-compiler process, or in-process) with libdevice
    /// (JitOptions::libdevice), and kept by (hash, sm) in memory and in the disk cache (the
    /// slice's bundle too, so on_disk(expected) holds). An empty `bundle` takes the slice from
    /// the disk cache (code_missing when it is not there). Concurrent first calls for one
    /// (hash, sm) compile once.
    /// Errors as compile(), plus no_device when libdevice is needed and not found, and
    /// invalid_argument for an sm below 20.
    /// @code
    ///   auto ptx = jit->compile_ptx(bundle, hash, gpu.sm());   // first call: compiled
    ///   gpu.load_module(hash, **ptx);
    ///   auto again = jit->compile_ptx({}, hash, gpu.sm());     // memory, or disk after a restart
    /// @endcode
    virtual Result<std::shared_ptr<const std::string>> compile_ptx(std::span<const std::byte> bundle,
                                                                   const CodeHash& expected, unsigned sm) = 0;
    /// PTX made by compile_ptx so far: compiles, not calls served from memory or disk.
    [[nodiscard]] virtual std::uint64_t ptx_compiles() const = 0;

    /// Blocks until every background tier-1 compile queued so far has finished, and every
    /// slice kept so far is on disk (with two tiers, a new slice's file is written behind its
    /// first call): tests and benchmarks that want the steady state.
    virtual void drain_tier_ups() = 0;
    /// Background tier-1 compiles queued or running now (0 with one tier), and finished so far.
    [[nodiscard]] virtual std::size_t tier_ups_pending() = 0;
    [[nodiscard]] virtual std::uint64_t tier_ups_finished() const = 0;

    /// Whether the disk cache holds `hash` (one stat call).
    [[nodiscard]] virtual bool on_disk(const CodeHash& hash) const = 0;

    /// Loads `hash` from the disk cache: the optimised object straight into the linker when one
    /// made for this LLVM, CPU, features and opt level is there (stats().from_object), else
    /// compiles the kept bundle (stats().from_disk); an object made for anything else is
    /// removed and replaced. code_missing when the bundle is absent or unusable;
    /// no_matching_slice when it holds a GPU slice (compile_ptx's), which stays.
    virtual Result<std::shared_ptr<const CompiledCode>> load(const CodeHash& hash) = 0;

    /// Pays LLVM's one-time set-up now (a throwaway compile at each tier) so the first shipped kernel does
    /// not. Takes a few milliseconds; an agent calls it once at start.
    virtual Result<void> warm_up() = 0;

    /// A restarted agent's warm start: links, on a background thread, the disk cache's objects
    /// for this host, most recently used first, at most `max_objects` of them and only while
    /// the memory cache is under half its cap; so the first call to code an agent ran before
    /// finds it linked (about 0.3 ms of linking each, here). Only objects: no bundle is
    /// compiled (one whose object is refused is compiled again from its bundle, as load()
    /// does). A call for a hash being preloaded waits for it instead of linking it again.
    /// Returns at once; stops early when the Jit is destroyed.
    virtual void preload(std::size_t max_objects) = 0;
    /// Objects linked by preload() so far.
    [[nodiscard]] virtual std::uint64_t preloaded() const = 0;

    /// For an agent that stops: compiles under way in compiler processes (calls' and tier-ups')
    /// end within ~20 ms with shutting_down, and every later compile fails so at once; a compile
    /// in the agent's own process (CompilerMode::in_process) runs to its end. For good.
    virtual void stop_compiles() = 0;
};

} // namespace bitship::jit
