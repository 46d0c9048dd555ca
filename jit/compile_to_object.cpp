// InProcessCompiler: bundle slice → relocatable object (see compile_to_object.hpp). Moved out
// of engine.cpp so that the same code runs in the agent or in a bitship-compiler process.
//
// Code generation uses a TargetMachine borrowed from the tier's pool (FastISel at
// CodeGenOptLevel::None for tier 0, the configured level for tier 1): TargetMachines are not
// safe to use from two threads at once.
#include "compile_to_object.hpp"

#include <chrono>
#include <mutex>
#include <utility>

#include <fmt/format.h>

#include <llvm/Bitcode/BitcodeReader.h>
#include <llvm/Bitcode/BitcodeWriter.h>
#include <llvm/ExecutionEngine/Orc/CompileUtils.h>
#include <llvm/ExecutionEngine/Orc/JITTargetMachineBuilder.h>
#include <llvm/IR/DebugInfo.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>
#include <llvm/IR/Verifier.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Target/TargetMachine.h>

#include "allow_list.hpp"
#include "call_guard.hpp"
#include "code_policy.hpp"
#include "llvm_error.hpp"
#include "optimise.hpp"
#include "sfi_pass.hpp"
#include "stage_clock.hpp"

namespace bitship::jit {
namespace {

namespace orc = llvm::orc;
using Clock = std::chrono::steady_clock;

constexpr std::size_t kHashDigitsInMessages = 16;

llvm::CodeGenOptLevel codegen_level(unsigned opt_level) {
    switch (opt_level) {
    case 0: return llvm::CodeGenOptLevel::None;
    case 1: return llvm::CodeGenOptLevel::Less;
    case 2: return llvm::CodeGenOptLevel::Default;
    default: return llvm::CodeGenOptLevel::Aggressive;
    }
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

/// A private constant C string in `module`, as clang makes for a literal.
llvm::GlobalVariable* b_string(llvm::Module& module, llvm::StringRef text) {
    auto* init = llvm::ConstantDataArray::getString(module.getContext(), text);
    auto* g = new llvm::GlobalVariable(module, init->getType(), true, llvm::GlobalValue::PrivateLinkage, init, ".str");
    g->setUnnamedAddr(llvm::GlobalValue::UnnamedAddr::Global);
    return g;
}

} // namespace

void init_native_target() {
    static std::once_flag once;
    std::call_once(once, [] {
        llvm::InitializeNativeTarget();
        llvm::InitializeNativeTargetAsmPrinter();
    });
}

struct InProcessCompiler::State {
    SymbolNames allowed;
    unsigned opt_level = 2;
    Sandbox sandbox = Sandbox::none;
    std::unique_ptr<TargetMachinePool> fast_machines;      // Tier::fast codegen
    std::unique_ptr<TargetMachinePool> optimised_machines; // Tier::optimised passes and codegen
};

InProcessCompiler::InProcessCompiler(std::unique_ptr<State> state) : state_(std::move(state)) {}
InProcessCompiler::~InProcessCompiler() = default;

Result<std::unique_ptr<InProcessCompiler>> InProcessCompiler::create(SymbolNames allowed, unsigned opt_level,
                                                                     Sandbox sandbox) {
    init_native_target();
    auto state = std::make_unique<State>();
    state->allowed = std::move(allowed);
    state->opt_level = opt_level;
    state->sandbox = sandbox;
    auto builder = orc::JITTargetMachineBuilder::detectHost();
    if (!builder) return tl::make_unexpected(to_error(builder.takeError(), Errc::internal, "detecting the host target"));
    // PIC: JITLink places code anywhere in the address space.
    builder->setRelocationModel(llvm::Reloc::PIC_);
    builder->setCodeModel(llvm::CodeModel::Small);
    // At CodeGenOptLevel::None the x86 backend selects instructions with FastISel and
    // allocates registers with the fast allocator: the cheapest codegen LLVM has.
    builder->setCodeGenOptLevel(llvm::CodeGenOptLevel::None);
    state->fast_machines = std::make_unique<TargetMachinePool>(*builder);
    builder->setCodeGenOptLevel(codegen_level(opt_level));
    state->optimised_machines = std::make_unique<TargetMachinePool>(*builder);
    return std::unique_ptr<InProcessCompiler>(new InProcessCompiler(std::move(state)));
}

Result<CompiledObject> InProcessCompiler::compile(std::span<const std::byte> bundle, const CodeHash& expected, Tier tier) {
    State& st = *state_;
    CompiledObject out;
    CompileStats& stats = out.stats;
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
    if (normalise_triple(slice->triple) == normalise_triple(kGpuTriple))
        return fail(Errc::no_matching_slice,
                    fmt::format("slice {} is for an NVIDIA GPU ({}); this agent runs {} and no GPU kernels (bundle has "
                                "slices for [{}])",
                                hex, slice->triple, me.triple, view->triples()));
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
        llvm::raw_string_ostream problem_out(problems);
        bool broken_debug_info = false;
        if (llvm::verifyModule(*module, &problem_out, &broken_debug_info))
            return fail(Errc::invalid_bitcode, "slice " + hex + " fails the IR verifier: " + problem_out.str());
        // As LLVM's own tools do: broken debug info is dropped, not fatal.
        if (broken_debug_info) llvm::StripDebugInfo(*module);
    }

    // 6. The code policy and the allow-list, before anything is optimised or generated; then
    //    the run-time checks of the indirect calls. Module passes that check or instrument
    //    shipped code go here, in this order.
    if (auto allowed = check_code_policy(*module); !allowed) return tl::make_unexpected(allowed.error());
    if (auto allowed = AllowList::check(*module, [&](std::string_view name) { return st.allowed.contains(name); });
        !allowed)
        return tl::make_unexpected(allowed.error());
    guard_indirect_calls(*module);

    // The bundle's entries this module defines (and exports); the others fail later, in
    // entry(), with entry_not_found.
    for (const auto& name : view->entries) {
        auto* f = module->getFunction(name);
        if (f != nullptr && !f->isDeclaration() && !f->hasLocalLinkage()) out.entries.push_back(name);
    }
    stats.parse_ms = lap_ms(mark);

    // 7. For this host: its CPU and features on every function, then (tier 1) the pass
    //    pipeline, and code generation with the tier's TargetMachine.
    const bool optimised = tier == Tier::optimised;
    auto& pool = optimised ? *st.optimised_machines : *st.fast_machines;
    {
        auto tm = pool.borrow();
        if (!tm) return tl::make_unexpected(to_error(tm.takeError(), Errc::compile_failed, "creating a target machine"));
        retarget(*module, **tm, me);
        if (optimised) optimise(*module, **tm, st.opt_level);
        // Sandbox::sfi: confined after the optimiser (so it costs least), before codegen;
        // call_guard above already checks the indirect calls in every mode.
        if (st.sandbox == Sandbox::sfi)
            if (auto confined = confine_memory(*module); !confined) return tl::make_unexpected(confined.error());
        stats.optimise_ms = lap_ms(mark);
        module->setModuleIdentifier(hex);
        auto made = orc::SimpleCompiler(**tm)(*module);
        if (!made) return tl::make_unexpected(to_error(made.takeError(), Errc::compile_failed, "generating code for slice " + hex));
        auto b = (*made)->getBuffer();
        auto* first = reinterpret_cast<const std::byte*>(b.data());
        out.object.assign(first, first + b.size());
    }
    stats.codegen_ms = lap_ms(mark);
    stats.tier = static_cast<unsigned>(tier);
    if (view->slices.size() != 1)
        out.slice_bundle = extract_slice(*view, static_cast<std::size_t>(slice - view->slices.data()));
    return out;
}

WarmUpBundle warm_up_bundle() {
    // Shaped like a kernel: a loop summing 0..n-1, loads and stores through pointer arguments,
    // a branch, and calls to an external symbol (memcpy, which every allow-list holds), so
    // that instruction selection, call lowering and the linker's GOT/PLT handling all pay
    // their first-use costs. Never run.
    llvm::LLVMContext context;
    llvm::Module module("bitship.warm_up", context);
    module.setTargetTriple(host().triple);
    auto* i64 = llvm::Type::getInt64Ty(context);
    auto* ptr = llvm::PointerType::get(context, 0);
    auto* memcpy_fn = llvm::Function::Create(llvm::FunctionType::get(ptr, {ptr, ptr, i64}, false),
                                             llvm::Function::ExternalLinkage, "memcpy", module);
    auto* fn = llvm::Function::Create(llvm::FunctionType::get(i64, {ptr, ptr, i64}, false),
                                      llvm::Function::ExternalLinkage, kWarmUpEntry, module);
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
    llvm::raw_svector_ostream bitcode(buffer);
    llvm::WriteBitcodeToFile(module, bitcode);
    auto bytes = std::as_bytes(std::span(buffer.data(), buffer.size()));
    std::vector<std::string> entries{kWarmUpEntry};
    SliceInput slice{host().triple, host().cpu, "bitship warm-up", host().llvm, bytes};
    return WarmUpBundle{write_bundle(entries, std::span(&slice, 1)), hash_code(bytes)};
}

} // namespace bitship::jit
