// Engine: the linking side of the JIT (see engine.hpp).
//
// Linking: every slice gets a JITDylib of its own (different bundles may define the same entry
// names) whose only link order is the shared "bitship.runtime" JITDylib of absolute symbols:
// the allow-list. There is no process-symbol generator anywhere, and no platform, so nothing
// outside the allow-list can resolve. The object code comes from the ObjectCompiler (a
// bitship-compiler process by default): it is linked only against that allow-list, whoever made
// it.
//
// Memory: in Sandbox::sfi, ArenaMemory (arena_memory.hpp) places code in the code zone and
// data in the arena's data zone, with the same permissions as below. Otherwise JITLink's
// InProcessMemoryManager (set explicitly below) maps slabs read-write,
// writes and fixes up the code there, then mprotects each segment to its final permissions
// (code R-X, read-only data R--, data RW-). No page is ever writable and executable at once;
// jit_test's "no JIT page is ever writable and executable" checks /proc/self/maps.
//
// Threads: no compile threads here (the Jit owns the tier-up thread). Independent compiles
// run in parallel; ORC's session lock serialises only the linker's bookkeeping.
#include "engine.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <unordered_map>
#include <utility>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <llvm/ExecutionEngine/JITLink/EHFrameSupport.h>
#include <llvm/ExecutionEngine/JITLink/JITLink.h>
#include <llvm/ExecutionEngine/JITLink/JITLinkMemoryManager.h>
#include <llvm/ExecutionEngine/Orc/Core.h>
#include <llvm/ExecutionEngine/Orc/JITTargetMachineBuilder.h>
#include <llvm/ExecutionEngine/Orc/LLJIT.h>
#include <llvm/ExecutionEngine/Orc/ObjectLinkingLayer.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/Process.h>

#include "arena_memory.hpp"
#include "compile_to_object.hpp"
#include "llvm_error.hpp"
#include "stage_clock.hpp"

namespace bitship::jit {
namespace {

namespace orc = llvm::orc;
using Clock = std::chrono::steady_clock;

constexpr const char* kRuntimeDylib = "bitship.runtime";

/// What happened while an object was linked (the memory it took, link errors), filed under
/// its JITDylib's name (unique per compile) and collected by the compile that added it. Linking
/// may run on any thread; this does not care which.
class MaterialisationLog {
public:
    void add_code_bytes(const std::string& dylib, std::size_t bytes) {
        std::lock_guard lock(mutex_);
        entries_[dylib].code_bytes += bytes;
    }
    void add_error(const std::string& dylib, llvm::Error error) {
        std::lock_guard lock(mutex_);
        auto& e = entries_[dylib].error;
        e = llvm::joinErrors(std::move(e), std::move(error));
    }
    struct Entry {
        std::size_t code_bytes = 0;
        llvm::Error error = llvm::Error::success();
    };
    Entry take(const std::string& dylib) {
        std::lock_guard lock(mutex_);
        auto it = entries_.find(dylib);
        if (it == entries_.end()) return {};
        Entry out = std::move(it->second);
        entries_.erase(it);
        return out;
    }

private:
    std::mutex mutex_;
    std::unordered_map<std::string, Entry> entries_;
};

/// Marks an error already filed in the MaterialisationLog; the session's reporter drops it.
class FiledError final : public llvm::ErrorInfo<FiledError> {
public:
    static char ID;
    void log(llvm::raw_ostream& out) const override { out << "reported with its compile"; }
    std::error_code convertToErrorCode() const override { return llvm::inconvertibleErrorCode(); }
};
char FiledError::ID = 0;

/// The JITDylib whose link is failing on this thread. JITLink calls every plugin's
/// notifyFailed and then ExecutionSession::reportError with the cause, on the same thread and
/// before the lookup is told; LinkObserver sets this, the reporter reads and clears it.
thread_local std::string t_failing_dylib;

/// Attributes link failures to their JITDylib (above), and files how much memory each link's
/// segments take, as the in-process memory manager maps them (page-rounded), for the cache cap.
class LinkObserver final : public orc::ObjectLinkingLayer::Plugin {
public:
    explicit LinkObserver(std::shared_ptr<MaterialisationLog> log) : log_(std::move(log)) {}

    void modifyPassConfig(orc::MaterializationResponsibility& responsibility, llvm::jitlink::LinkGraph&,
                          llvm::jitlink::PassConfiguration& config) override {
        config.PostAllocationPasses.push_back(
            [log = log_, dylib = responsibility.getTargetJITDylib().getName()](llvm::jitlink::LinkGraph& graph) -> llvm::Error {
                llvm::jitlink::BasicLayout layout(graph);
                auto sizes = layout.getContiguousPageBasedLayoutSizes(llvm::sys::Process::getPageSizeEstimate());
                if (!sizes) return sizes.takeError();
                // Finalize segments are freed once the link is done; the standard ones stay.
                log->add_code_bytes(dylib, static_cast<std::size_t>(sizes->StandardSegs));
                return llvm::Error::success();
            });
    }

    llvm::Error notifyFailed(orc::MaterializationResponsibility& responsibility) override {
        t_failing_dylib = responsibility.getTargetJITDylib().getName();
        return llvm::Error::success();
    }
    llvm::Error notifyRemovingResources(orc::JITDylib&, orc::ResourceKey) override { return llvm::Error::success(); }
    void notifyTransferringResources(orc::JITDylib&, orc::ResourceKey, orc::ResourceKey) override {}

private:
    std::shared_ptr<MaterialisationLog> log_;
};

} // namespace

struct Engine::State {
    ~State() {
        // Every slice dylib is gone (each CompiledCode holds the Engine); ending the session
        // is all that is left, and LLJIT's destructor does it, before the log that its link
        // plugin and error reporter share.
        lljit.reset();
    }

    AllowList allow;
    std::shared_ptr<ObjectCompiler> compiler; // shared with the Jit's PtxCache
    std::shared_ptr<MaterialisationLog> log; // shared with the link plugin and the session's error reporter
    std::unique_ptr<orc::LLJIT> lljit;
    orc::JITDylib* runtime = nullptr;
    std::atomic<std::uint64_t> serial{0}; // makes every slice dylib name unique
};

Engine::Engine(std::unique_ptr<State> state) : state_(std::move(state)) {}
Engine::~Engine() = default;

void Engine::unload(llvm::orc::JITDylib& dylib) noexcept {
    if (auto err = state_->lljit->getExecutionSession().removeJITDylib(dylib))
        spdlog::warn("jit: {}", to_error(std::move(err), Errc::internal, "unloading " + dylib.getName()).describe());
}

Result<CompiledParts> Engine::compile(std::span<const std::byte> bundle, const CodeHash& expected, Tier tier,
                                      bool keep_object, std::string_view only) {
    // 1-7. Bundle checks, parse, verify, policy, allow-list, retarget, optimise, codegen: the
    //      ObjectCompiler's (compile_to_object.cpp), in a compiler process by default.
    auto made = state_->compiler->compile(bundle, expected, tier, only);
    if (!made) return tl::make_unexpected(made.error());
    CompiledParts parts;
    parts.left_out = std::move(made->left_out);
    parts.stats = made->stats; // its tier too: a slice that holds state is made optimised at once
    const std::string hex = to_hex(expected, kHashDigitsInMessages);
    auto mark = Clock::now();
    auto object = llvm::MemoryBuffer::getMemBufferCopy(
        llvm::StringRef(reinterpret_cast<const char*>(made->object.data()), made->object.size()), hex);
    if (keep_object) parts.object = std::move(made->object);
    parts.bundle = made->slice_bundle.empty() ? std::vector<std::byte>(bundle.begin(), bundle.end())
                                              : std::move(made->slice_bundle);
    // 8. Linked here, in the agent, against the allow-list only.
    if (auto linked = link(std::move(object), made->entries, hex, parts); !linked) return tl::make_unexpected(linked.error());
    parts.stats.link_ms = lap_ms(mark);
    return parts;
}

Result<CompiledParts> Engine::link_object(std::span<const std::byte> object, const std::vector<std::string>& entries,
                                          std::vector<std::byte> bundle, const CodeHash& hash) {
    CompiledParts parts;
    const std::string hex = to_hex(hash, kHashDigitsInMessages);
    auto mark = Clock::now();
    auto buffer = llvm::MemoryBuffer::getMemBufferCopy(
        llvm::StringRef(reinterpret_cast<const char*>(object.data()), object.size()), hex);
    parts.bundle = std::move(bundle);
    parts.stats.tier = static_cast<unsigned>(Tier::optimised);
    parts.stats.from_object = true;
    parts.stats.from_disk = true;
    parts.stats.verify_ms = lap_ms(mark);
    if (auto linked = link(std::move(buffer), entries, hex, parts); !linked) return tl::make_unexpected(linked.error());
    parts.stats.link_ms = lap_ms(mark);
    return parts;
}

/// 8. A JITDylib of its own (bundles may reuse entry names), linked to the runtime only, gets
///    `object`; looking the entries up links it. Fills parts.dylib, entries and code_bytes.
Result<void> Engine::link(std::unique_ptr<llvm::MemoryBuffer> object, const std::vector<std::string>& entries,
                          const std::string& hex, CompiledParts& parts) {
    State& st = *state_;
    auto& session = st.lljit->getExecutionSession();
    const std::string dylib_name = fmt::format("bitship.slice.{}.{}", hex, st.serial++);
    auto& dylib = session.createBareJITDylib(dylib_name);
    dylib.setLinkOrder({{st.runtime, orc::JITDylibLookupFlags::MatchExportedSymbolsOnly}});
    // Nothing half-linked stays behind a failure.
    auto discard = [&](Error error) -> Result<void> {
        if (auto err = session.removeJITDylib(dylib))
            spdlog::warn("jit: {}", to_error(std::move(err), Errc::internal, "discarding " + dylib_name).describe());
        st.log->take(dylib_name);
        return tl::make_unexpected(std::move(error));
    };
    if (auto err = st.lljit->addObjectFile(dylib, std::move(object)))
        return discard(to_error(std::move(err), Errc::compile_failed, "adding slice " + hex));

    orc::SymbolLookupSet wanted;
    std::map<orc::SymbolStringPtr, std::string> names;
    for (const auto& name : entries) {
        auto mangled = st.lljit->mangleAndIntern(name);
        wanted.add(mangled);
        names.emplace(mangled, name);
    }
    auto found = session.lookup(orc::makeJITDylibSearchOrder(&dylib, orc::JITDylibLookupFlags::MatchExportedSymbolsOnly),
                                std::move(wanted));
    auto linked = st.log->take(dylib_name);
    if (!found) {
        // The cause (e.g. the symbols the linker could not resolve) first, then the lookup's
        // own "failed to materialize".
        auto error = to_error(llvm::joinErrors(std::move(linked.error), found.takeError()), Errc::compile_failed,
                              "compiling slice " + hex);
        // The IR passed the allow-list, so what is missing now the backend asked for.
        if (error.code == Errc::unresolved_symbol) error.message += " (a call introduced by code generation)";
        return discard(std::move(error));
    }
    if (linked.error)
        spdlog::warn("jit: {}", to_error(std::move(linked.error), Errc::internal, "slice " + hex).describe());

    for (const auto& [mangled, symbol] : *found)
        parts.entries.emplace(names.at(mangled), symbol.getAddress().toPtr<bs_entry_fn>());
    parts.dylib = &dylib;
    parts.code_bytes = linked.code_bytes;
    return {};
}

Result<void> Engine::warm_up() {
    auto warm = warm_up_bundle();
    for (auto tier : {Tier::fast, Tier::optimised}) {
        auto parts = compile(warm.bundle, warm.hash, tier);
        if (!parts) return tl::make_unexpected(parts.error());
        unload(*parts->dylib);
    }
    return {};
}

/// Builds the LLJIT and the runtime dylib: detectHost, PIC (JITLink places code anywhere in the
/// address space), JITLink with in-process memory, no platform, no process symbols.
Result<std::unique_ptr<Engine>> Engine::start(AllowList allow, std::shared_ptr<ObjectCompiler> compiler,
                                              Sandbox sandbox, CodeZones zones) {
    auto state = std::make_unique<State>();
    State& engine = *state;
    engine.allow = std::move(allow);
    engine.compiler = std::move(compiler);
    init_native_target();
    auto fail_llvm = [](llvm::Error err, std::string_view what) {
        return tl::make_unexpected(to_error(std::move(err), Errc::internal, what));
    };
    auto builder = orc::JITTargetMachineBuilder::detectHost();
    if (!builder) return fail_llvm(builder.takeError(), "detecting the host target");
    builder->setRelocationModel(llvm::Reloc::PIC_);
    builder->setCodeModel(llvm::CodeModel::Small);
    engine.log = std::make_shared<MaterialisationLog>();

    auto lljit = orc::LLJITBuilder()
                     .setJITTargetMachineBuilder(*builder)
                     .setLinkProcessSymbolsByDefault(false)
                     .setPlatformSetUp(orc::setUpInactivePlatform)
                     .setObjectLinkingLayerCreator(
                         [log = engine.log, sandbox, zones](orc::ExecutionSession& session, const llvm::Triple&)
                             -> llvm::Expected<std::unique_ptr<orc::ObjectLayer>> {
                             std::unique_ptr<llvm::jitlink::JITLinkMemoryManager> memory;
                             if (sandbox == Sandbox::sfi) {
                                 auto arena = make_arena_memory(zones);
                                 if (!arena)
                                     return llvm::make_error<llvm::StringError>(arena.error().message,
                                                                                llvm::inconvertibleErrorCode());
                                 memory = std::move(*arena);
                             } else {
                                 auto in_process = llvm::jitlink::InProcessMemoryManager::Create();
                                 if (!in_process) return in_process.takeError();
                                 memory = std::move(*in_process);
                             }
                             auto layer = std::make_unique<orc::ObjectLinkingLayer>(session, std::move(memory));
                             // Unwind tables, so a debugger or a crash handler can walk through
                             // kernel frames.
                             layer->addPlugin(std::make_unique<orc::EHFrameRegistrationPlugin>(
                                 session, std::make_unique<llvm::jitlink::InProcessEHFrameRegistrar>()));
                             layer->addPlugin(std::make_unique<LinkObserver>(log));
                             return layer;
                         })
                     .create();
    if (!lljit) return fail_llvm(lljit.takeError(), "starting the JIT");
    engine.lljit = std::move(*lljit);

    auto& session = engine.lljit->getExecutionSession();
    session.setErrorReporter([log = engine.log](llvm::Error err) {
        std::string dylib = std::exchange(t_failing_dylib, {});
        err = llvm::handleErrors(std::move(err), [](const FiledError&) {});
        if (!err) return;
        if (!dylib.empty()) {
            log->add_error(dylib, std::move(err));
            return;
        }
        // Not a link of ours: no compile will collect it, so it is logged here.
        spdlog::warn("jit: {}", to_error(std::move(err), Errc::internal, "JIT session").describe());
    });

    orc::SymbolMap symbols;
    for (const auto& [name, address] : engine.allow.symbols())
        symbols[engine.lljit->mangleAndIntern(name)] = {orc::ExecutorAddr::fromPtr(address), llvm::JITSymbolFlags::Exported};
    auto& runtime = session.createBareJITDylib(kRuntimeDylib);
    if (auto err = runtime.define(orc::absoluteSymbols(std::move(symbols))))
        return fail_llvm(std::move(err), "defining the runtime symbols");
    engine.runtime = &runtime;
    return std::unique_ptr<Engine>(new Engine(std::move(state)));
}

} // namespace bitship::jit
