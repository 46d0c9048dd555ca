// Engine: the LLVM side of the JIT (see engine.hpp).
//
// Linking: every slice gets a JITDylib of its own (different bundles may define the same entry
// names) whose only link order is the shared "bitship.runtime" JITDylib of absolute symbols:
// the allow-list. There is no process-symbol generator anywhere, and no platform, so nothing
// outside the allow-list can resolve.
//
// Memory: JITLink's InProcessMemoryManager (set explicitly below) maps slabs read-write,
// writes and fixes up the code there, then mprotects each segment to its final permissions
// (code R-X, read-only data R--, data RW-). No page is ever writable and executable at once;
// jit_test's "no JIT page is ever writable and executable" checks /proc/self/maps.
//
// Code generation: done here, on the compiling thread, with a TargetMachine borrowed from the
// tier's pool (FastISel at CodeGenOptLevel::None for tier 0, the configured level for tier 1),
// and the object is then added to the slice's JITDylib; looking the entries up links it. So the
// object code is in hand for the disk cache, and a cached object links without any IR at all.
//
// Threads: no compile threads here (the Jit owns the tier-up thread). Independent compiles
// parse, optimise and generate code in parallel; ORC's session lock serialises only the
// bookkeeping.
#include "engine.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <unordered_map>
#include <utility>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <llvm/Bitcode/BitcodeReader.h>
#include <llvm/ExecutionEngine/JITLink/EHFrameSupport.h>
#include <llvm/ExecutionEngine/JITLink/JITLink.h>
#include <llvm/ExecutionEngine/JITLink/JITLinkMemoryManager.h>
#include <llvm/ExecutionEngine/Orc/CompileUtils.h>
#include <llvm/ExecutionEngine/Orc/Core.h>
#include <llvm/ExecutionEngine/Orc/JITTargetMachineBuilder.h>
#include <llvm/ExecutionEngine/Orc/LLJIT.h>
#include <llvm/ExecutionEngine/Orc/ObjectLinkingLayer.h>
#include <llvm/ExecutionEngine/Orc/ThreadSafeModule.h>
#include <llvm/Bitcode/BitcodeWriter.h>
#include <llvm/IR/DebugInfo.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>
#include <llvm/IR/Verifier.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/Process.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Target/TargetMachine.h>

#include "call_guard.hpp"
#include "code_policy.hpp"
#include "llvm_error.hpp"
#include "optimise.hpp"

namespace bitship::jit {
namespace {

namespace orc = llvm::orc;
using Clock = std::chrono::steady_clock;

constexpr const char* kRuntimeDylib = "bitship.runtime";
constexpr std::size_t kHashDigitsInMessages = 16;

/// Milliseconds since `mark`, which then moves to now.
double lap_ms(Clock::time_point& mark) {
    auto now = Clock::now();
    double ms = std::chrono::duration<double, std::milli>(now - mark).count();
    mark = now;
    return ms;
}

llvm::CodeGenOptLevel codegen_level(unsigned opt_level) {
    switch (opt_level) {
    case 0: return llvm::CodeGenOptLevel::None;
    case 1: return llvm::CodeGenOptLevel::Less;
    case 2: return llvm::CodeGenOptLevel::Default;
    default: return llvm::CodeGenOptLevel::Aggressive;
    }
}

void init_llvm_once() {
    static std::once_flag once;
    std::call_once(once, [] {
        llvm::InitializeNativeTarget();
        llvm::InitializeNativeTargetAsmPrinter();
    });
}

/// TargetMachines are not safe to use from two threads at once (their subtarget caches
/// mutate) and cost a little to build, so optimisation and codegen borrow one from here.
class TargetMachinePool {
public:
    explicit TargetMachinePool(orc::JITTargetMachineBuilder builder) : builder_(std::move(builder)) {}

    struct GiveBack {
        TargetMachinePool* pool;
        void operator()(llvm::TargetMachine* tm) const noexcept { pool->give_back(tm); }
    };
    using Lease = std::unique_ptr<llvm::TargetMachine, GiveBack>;

    llvm::Expected<Lease> borrow() {
        std::lock_guard lock(mutex_);
        if (!idle_.empty()) {
            auto tm = std::move(idle_.back());
            idle_.pop_back();
            return Lease(tm.release(), GiveBack{this});
        }
        auto tm = builder_.createTargetMachine();
        if (!tm) return tm.takeError();
        return Lease(tm->release(), GiveBack{this});
    }

    [[nodiscard]] const orc::JITTargetMachineBuilder& builder() const { return builder_; }

private:
    void give_back(llvm::TargetMachine* tm) noexcept {
        std::unique_ptr<llvm::TargetMachine> owned(tm);
        std::lock_guard lock(mutex_);
        try {
            idle_.push_back(std::move(owned));
        } catch (...) { // out of memory: let this one go rather than throw from a deleter
        }
    }

    orc::JITTargetMachineBuilder builder_;
    std::mutex mutex_;
    std::vector<std::unique_ptr<llvm::TargetMachine>> idle_;
};

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
    unsigned opt_level = 2;
    std::unique_ptr<TargetMachinePool> fast_machines;      // Tier::fast codegen
    std::unique_ptr<TargetMachinePool> optimised_machines; // Tier::optimised passes and codegen
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
                                      bool keep_object) {
    State& st = *state_;
    CompiledParts parts;
    CompileStats& stats = parts.stats;
    const HostInfo& me = host();
    const std::string hex = to_hex(expected, kHashDigitsInMessages);
    auto mark = Clock::now();

    // 1. The container: lengths, offsets, and every slice against its hash.
    auto view = BundleView::parse(bundle);
    if (!view) return tl::make_unexpected(view.error());

    // 2. The slice asked for, by content.
    const SliceView* slice = nullptr;
    for (const auto& s : view->slices)
        if (s.hash == expected) slice = &s;
    if (slice == nullptr) return fail(Errc::malformed_bundle, "no slice hashes to " + hex);

    // 3. Made for this architecture and OS.
    if (normalise_triple(slice->triple) != normalise_triple(me.triple))
        return fail(Errc::no_matching_slice,
                    fmt::format("bundle has slices for [{}]; this agent runs {}", view->triples(), me.triple));

    // 4. Not made by a newer LLVM than ours. Bitcode is stable within a major.minor release
    //    line, so the patch level does not count.
    if (std::pair(slice->llvm.major, slice->llvm.minor) > std::pair(me.llvm.major, me.llvm.minor))
        return fail(Errc::producer_too_new,
                    fmt::format("slice {} was made by LLVM {}; this agent links LLVM {}", hex,
                                to_string(slice->llvm), to_string(me.llvm)));
    stats.verify_ms = lap_ms(mark);

    // 5. Bitcode → IR, in a context of its own (modules of other compiles never share it).
    auto context = std::make_unique<llvm::LLVMContext>();
    llvm::MemoryBufferRef buffer(
        llvm::StringRef(reinterpret_cast<const char*>(slice->bitcode.data()), slice->bitcode.size()), hex);
    auto parsed = llvm::parseBitcodeFile(buffer, *context);
    if (!parsed)
        return tl::make_unexpected(to_error(parsed.takeError(), Errc::invalid_bitcode, "slice " + hex + " is not valid bitcode"));
    std::unique_ptr<llvm::Module> module = std::move(*parsed);
    {
        std::string problems;
        llvm::raw_string_ostream out(problems);
        bool broken_debug_info = false;
        if (llvm::verifyModule(*module, &out, &broken_debug_info))
            return fail(Errc::invalid_bitcode, "slice " + hex + " fails the IR verifier: " + out.str());
        // As LLVM's own tools do: broken debug info is dropped, not fatal.
        if (broken_debug_info) llvm::StripDebugInfo(*module);
    }

    // 6. The code policy and the allow-list, before anything is optimised or generated.
    if (auto allowed = check_code_policy(*module); !allowed) return tl::make_unexpected(allowed.error());
    if (auto allowed = st.allow.check(*module); !allowed) return tl::make_unexpected(allowed.error());
    guard_indirect_calls(*module);

    // The bundle's entries this module defines (and exports); the others fail later, in
    // entry(), with entry_not_found.
    std::vector<std::string> entries;
    for (const auto& name : view->entries) {
        auto* f = module->getFunction(name);
        if (f != nullptr && !f->isDeclaration() && !f->hasLocalLinkage()) entries.push_back(name);
    }
    stats.parse_ms = lap_ms(mark);

    // 7. For this host: its CPU and features on every function, then (tier 1) the pass
    //    pipeline, and code generation with the tier's TargetMachine.
    const bool optimised = tier == Tier::optimised;
    auto& pool = optimised ? *st.optimised_machines : *st.fast_machines;
    std::unique_ptr<llvm::MemoryBuffer> object;
    {
        auto tm = pool.borrow();
        if (!tm) return tl::make_unexpected(to_error(tm.takeError(), Errc::compile_failed, "creating a target machine"));
        retarget(*module, **tm, me);
        if (optimised) optimise(*module, **tm, st.opt_level);
        stats.optimise_ms = lap_ms(mark);
        module->setModuleIdentifier(hex);
        auto made = orc::SimpleCompiler(**tm)(*module);
        if (!made) return tl::make_unexpected(to_error(made.takeError(), Errc::compile_failed, "generating code for slice " + hex));
        object = std::move(*made);
    }
    stats.codegen_ms = lap_ms(mark);
    stats.tier = static_cast<unsigned>(tier);
    if (keep_object) {
        auto b = llvm::arrayRefFromStringRef(object->getBuffer());
        parts.object.assign(reinterpret_cast<const std::byte*>(b.data()), reinterpret_cast<const std::byte*>(b.data()) + b.size());
    }
    // The IR and its context go now, before the link: only the object is needed from here.
    module.reset();
    context.reset();

    parts.bundle = view->slices.size() == 1
                       ? std::vector<std::byte>(bundle.begin(), bundle.end())
                       : extract_slice(*view, static_cast<std::size_t>(slice - view->slices.data()));
    if (auto linked = link(std::move(object), entries, hex, parts); !linked) return tl::make_unexpected(linked.error());
    stats.link_ms = lap_ms(mark);
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

/// Builds the LLJIT and the runtime dylib: detectHost, PIC (JITLink places code anywhere in the
/// address space), JITLink with in-process memory, no platform, no process symbols, and our
/// timed, thread-safe compiler.
namespace {
/// A private constant C string in `module`, as clang makes for a literal.
llvm::GlobalVariable* b_string(llvm::Module& module, llvm::StringRef text) {
    auto* init = llvm::ConstantDataArray::getString(module.getContext(), text);
    auto* g = new llvm::GlobalVariable(module, init->getType(), true, llvm::GlobalValue::PrivateLinkage, init, ".str");
    g->setUnnamedAddr(llvm::GlobalValue::UnnamedAddr::Global);
    return g;
}
} // namespace

Result<void> Engine::warm_up() {
    // Shaped like a kernel: a loop summing 0..n-1, loads and stores through pointer arguments,
    // a branch, and calls to an external symbol (memcpy, which every allow-list holds), so
    // that instruction selection, call lowering and the linker's GOT/PLT handling all pay
    // their first-use costs here. Never run.
    llvm::LLVMContext context;
    llvm::Module module("bitship.warm_up", context);
    module.setTargetTriple(host().triple);
    auto* i64 = llvm::Type::getInt64Ty(context);
    auto* ptr = llvm::PointerType::get(context, 0);
    auto* memcpy_fn = llvm::Function::Create(llvm::FunctionType::get(ptr, {ptr, ptr, i64}, false),
                                             llvm::Function::ExternalLinkage, "memcpy", module);
    auto* fn = llvm::Function::Create(llvm::FunctionType::get(i64, {ptr, ptr, i64}, false),
                                      llvm::Function::ExternalLinkage, "bitship_warm_up", module);
    // The attributes clang gives a kernel: the subtarget is cached by some of them, and unwind
    // tables need their own sections.
    fn->addFnAttr(llvm::Attribute::NoUnwind);
    fn->setUWTableKind(llvm::UWTableKind::Async);
    fn->addFnAttr("min-legal-vector-width", "0");
    auto* message = b_string(module, "bitship warm-up");
    auto* dst = fn->getArg(0);
    auto* src = fn->getArg(1);
    auto* n = fn->getArg(2);
    auto* entry = llvm::BasicBlock::Create(context, "entry", fn);
    auto* loop = llvm::BasicBlock::Create(context, "loop", fn);
    auto* done = llvm::BasicBlock::Create(context, "done", fn);
    auto* empty = llvm::BasicBlock::Create(context, "empty", fn);
    llvm::IRBuilder<> b(entry);
    b.CreateCondBr(b.CreateICmpEQ(n, llvm::ConstantInt::get(i64, 0)), empty, loop);
    b.SetInsertPoint(loop);
    auto* i = b.CreatePHI(i64, 2);
    auto* sum = b.CreatePHI(i64, 2);
    auto* loaded = b.CreateLoad(i64, b.CreateGEP(i64, src, i));
    auto* next_sum = b.CreateAdd(b.CreateAdd(sum, i), loaded);
    auto* next_i = b.CreateAdd(i, llvm::ConstantInt::get(i64, 1));
    b.CreateCondBr(b.CreateICmpULT(next_i, n), loop, done);
    i->addIncoming(llvm::ConstantInt::get(i64, 0), entry);
    i->addIncoming(next_i, loop);
    sum->addIncoming(llvm::ConstantInt::get(i64, 0), entry);
    sum->addIncoming(next_sum, loop);
    b.SetInsertPoint(done);
    b.CreateStore(next_sum, dst);
    b.CreateCall(memcpy_fn, {dst, src, n});
    b.CreateRet(next_sum);
    b.SetInsertPoint(empty);
    b.CreateCall(memcpy_fn, {dst, message, llvm::ConstantInt::get(i64, 8)});
    b.CreateRet(llvm::ConstantInt::get(i64, 0));

    llvm::SmallVector<char, 0> buffer;
    llvm::raw_svector_ostream out(buffer);
    llvm::WriteBitcodeToFile(module, out);
    auto bytes = std::as_bytes(std::span(buffer.data(), buffer.size()));
    std::vector<std::string> entries{"bitship_warm_up"};
    SliceInput slice{host().triple, host().cpu, "bitship warm-up", host().llvm, bytes};
    auto bundle = write_bundle(entries, std::span(&slice, 1));
    for (auto tier : {Tier::fast, Tier::optimised}) {
        auto parts = compile(bundle, hash_code(bytes), tier);
        if (!parts) return tl::make_unexpected(parts.error());
        unload(*parts->dylib);
    }
    return {};
}

Result<std::unique_ptr<Engine>> Engine::start(AllowList allow, unsigned opt_level) {
    auto state = std::make_unique<State>();
    State& engine = *state;
    engine.allow = std::move(allow);
    engine.opt_level = opt_level;
    init_llvm_once();
    auto fail_llvm = [](llvm::Error err, std::string_view what) {
        return tl::make_unexpected(to_error(std::move(err), Errc::internal, what));
    };
    auto builder = orc::JITTargetMachineBuilder::detectHost();
    if (!builder) return fail_llvm(builder.takeError(), "detecting the host target");
    builder->setRelocationModel(llvm::Reloc::PIC_);
    builder->setCodeModel(llvm::CodeModel::Small);
    // At CodeGenOptLevel::None the x86 backend selects instructions with FastISel and
    // allocates registers with the fast allocator: the cheapest codegen LLVM has.
    builder->setCodeGenOptLevel(llvm::CodeGenOptLevel::None);
    engine.fast_machines = std::make_unique<TargetMachinePool>(*builder);
    builder->setCodeGenOptLevel(codegen_level(engine.opt_level));
    engine.optimised_machines = std::make_unique<TargetMachinePool>(*builder);
    engine.log = std::make_shared<MaterialisationLog>();

    auto lljit = orc::LLJITBuilder()
                     .setJITTargetMachineBuilder(*builder)
                     .setLinkProcessSymbolsByDefault(false)
                     .setPlatformSetUp(orc::setUpInactivePlatform)
                     .setObjectLinkingLayerCreator(
                         [log = engine.log](orc::ExecutionSession& session, const llvm::Triple&)
                             -> llvm::Expected<std::unique_ptr<orc::ObjectLayer>> {
                             auto memory = llvm::jitlink::InProcessMemoryManager::Create();
                             if (!memory) return memory.takeError();
                             auto layer = std::make_unique<orc::ObjectLinkingLayer>(session, std::move(*memory));
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
