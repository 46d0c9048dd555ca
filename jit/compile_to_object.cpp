// InProcessCompiler: bundle slice → relocatable object (see compile_to_object.hpp). Moved out
// of engine.cpp so that the same code runs in the agent or in a bitship-compiler process.
//
// Code generation uses a TargetMachine and its kept pass pipeline (object_emitter.hpp) borrowed
// from the tier's pool (FastISel at CodeGenOptLevel::None for tier 0, the configured level for
// tier 1): TargetMachines are not safe to use from two threads at once.
#include "compile_to_object.hpp"

#include <chrono>
#include <stdexcept>
#include <mutex>
#include <utility>

#include <fmt/format.h>

#include <llvm/Bitcode/BitcodeReader.h>
#include <llvm/Bitcode/BitcodeWriter.h>
#include <llvm/ExecutionEngine/Orc/JITTargetMachineBuilder.h>
#include <llvm/AsmParser/Parser.h>
#include <llvm/IR/DebugInfo.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>
#include <llvm/IR/Verifier.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/SourceMgr.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Target/TargetMachine.h>

#include "allow_list.hpp"
#include "call_guard.hpp"
#include "code_policy.hpp"
#include "entry_closure.hpp"
#include "llvm_error.hpp"
#include "object_emitter.hpp"
#include "optimise.hpp"
#include "ptx_compile.hpp"
#include "sfi_pass.hpp"
#include "slice_check.hpp"
#include "stage_clock.hpp"

namespace bitship::jit {
namespace {

namespace orc = llvm::orc;
using Clock = std::chrono::steady_clock;

llvm::CodeGenOptLevel codegen_level(unsigned opt_level) {
    switch (opt_level) {
    case 0: return llvm::CodeGenOptLevel::None;
    case 1: return llvm::CodeGenOptLevel::Less;
    case 2: return llvm::CodeGenOptLevel::Default;
    default: return llvm::CodeGenOptLevel::Aggressive;
    }
}

} // namespace

/// TargetMachines are not safe to use from two threads at once (their subtarget caches
/// mutate) and cost a little to build, as does the code generation pipeline made for each, so
/// optimisation and codegen borrow an ObjectEmitter (a machine and its kept pipeline) from here.
/// (Not in the anonymous namespace: InProcessCompiler::State, declared in the header, holds two.)
class EmitterPool {
public:
    explicit EmitterPool(orc::JITTargetMachineBuilder builder) : builder_(std::move(builder)) {}

    struct GiveBack {
        EmitterPool* pool;
        void operator()(ObjectEmitter* emitter) const noexcept { pool->give_back(emitter); }
    };
    using Lease = std::unique_ptr<ObjectEmitter, GiveBack>;

    llvm::Expected<Lease> borrow() {
        std::lock_guard lock(mutex_);
        if (!idle_.empty()) {
            auto emitter = std::move(idle_.back());
            idle_.pop_back();
            return Lease(emitter.release(), GiveBack{this});
        }
        auto tm = builder_.createTargetMachine();
        if (!tm) return tm.takeError();
        ++made_;
        return Lease(new ObjectEmitter(std::move(*tm)), GiveBack{this});
    }

    /// Emitters (machines, each with the one pipeline it builds) made so far.
    std::size_t made() {
        std::lock_guard lock(mutex_);
        return made_;
    }

private:
    void give_back(ObjectEmitter* emitter) noexcept {
        std::unique_ptr<ObjectEmitter> owned(emitter);
        std::lock_guard lock(mutex_);
        try {
            idle_.push_back(std::move(owned));
        } catch (...) { // out of memory: let this one go rather than throw from a deleter
        }
    }

    orc::JITTargetMachineBuilder builder_;
    std::mutex mutex_;
    std::vector<std::unique_ptr<ObjectEmitter>> idle_;
    std::size_t made_ = 0;
};

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
    std::unique_ptr<EmitterPool> fast_machines;      // Tier::fast codegen
    std::unique_ptr<EmitterPool> optimised_machines; // Tier::optimised passes and codegen
    std::vector<std::byte> libdevice; // what compile_ptx links; read-only after create
};

InProcessCompiler::InProcessCompiler(std::unique_ptr<State> state) : state_(std::move(state)) {}
InProcessCompiler::~InProcessCompiler() = default;

Result<std::unique_ptr<InProcessCompiler>> InProcessCompiler::create(SymbolNames allowed, unsigned opt_level,
                                                                     Sandbox sandbox, std::vector<std::byte> libdevice) {
    init_native_target();
    init_ptx_target();
    auto state = std::make_unique<State>();
    state->allowed = std::move(allowed);
    state->opt_level = opt_level;
    state->sandbox = sandbox;
    state->libdevice = std::move(libdevice);
    auto builder = orc::JITTargetMachineBuilder::detectHost();
    if (!builder) return tl::make_unexpected(to_error(builder.takeError(), Errc::internal, "detecting the host target"));
    // PIC: JITLink places code anywhere in the address space.
    builder->setRelocationModel(llvm::Reloc::PIC_);
    builder->setCodeModel(llvm::CodeModel::Small);
    // At CodeGenOptLevel::None the x86 backend selects instructions with FastISel and
    // allocates registers with the fast allocator: the cheapest codegen LLVM has.
    builder->setCodeGenOptLevel(llvm::CodeGenOptLevel::None);
    state->fast_machines = std::make_unique<EmitterPool>(*builder);
    builder->setCodeGenOptLevel(codegen_level(opt_level));
    state->optimised_machines = std::make_unique<EmitterPool>(*builder);
    return std::unique_ptr<InProcessCompiler>(new InProcessCompiler(std::move(state)));
}

Result<CompiledObject> InProcessCompiler::compile(std::span<const std::byte> bundle, const CodeHash& expected, Tier tier,
                                                  std::string_view only) {
    State& st = *state_;
    CompiledObject out;
    CompileStats& stats = out.stats;
    const HostInfo& me = host();
    const std::string hex = to_hex(expected, kHashDigitsInMessages);
    auto mark = Clock::now();

    // 1-4. The container, the slice asked for, made for this host by an LLVM not newer than ours.
    auto checked = check_slice(bundle, expected, SliceTarget::host);
    if (!checked) return tl::make_unexpected(checked.error());
    const BundleView* view = &checked->view;
    const SliceView* slice = &checked->slice();
    stats.verify_ms = lap_ms(mark);

    // 5. Bitcode → IR, in a context of its own (modules of other compiles never share it).
    //    Tier 0 for one call reads only that entry and what it reaches (entry_closure.hpp):
    //    the module's globals and declarations first, then the bodies it needs; the rest
    //    waits for tier 1, or for a call to one of them, and is checked when it is compiled.
    const bool part = !only.empty() && tier == Tier::fast;
    auto context = std::make_unique<llvm::LLVMContext>();
    llvm::MemoryBufferRef buffer(
        llvm::StringRef(reinterpret_cast<const char*>(slice->bitcode.data()), slice->bitcode.size()), hex);
    auto not_bitcode = [&](llvm::Error err) {
        return tl::make_unexpected(to_error(std::move(err), Errc::invalid_bitcode, "slice " + hex + " is not valid bitcode"));
    };
    auto parsed = part ? llvm::getLazyBitcodeModule(buffer, *context) : llvm::parseBitcodeFile(buffer, *context);
    if (!parsed) return not_bitcode(parsed.takeError());
    std::unique_ptr<llvm::Module> module = std::move(*parsed);
    if (part) {
        // The module-level rules (no aliases, ifuncs, appending or reserved globals, ...) on
        // what is read so far, before anything is removed: what is kept then refers to nothing
        // that goes. The bodies kept are checked below, with everything else.
        if (auto allowed = check_code_policy(*module); !allowed) return tl::make_unexpected(allowed.error());
        auto left_out = keep_only_entry(*module, only, view->entries);
        if (!left_out) return not_bitcode(left_out.takeError());
        out.left_out = std::move(*left_out);
    }
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
    // State kept between calls must live in one copy: such a slice gets the one compile it
    // will ever have, the optimised one (entry_closure.hpp: keep_only_entry kept it whole),
    // and says so in stats.tier.
    if (tier == Tier::fast && holds_state(*module)) tier = Tier::optimised;
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
        auto emitter = pool.borrow();
        if (!emitter)
            return tl::make_unexpected(to_error(emitter.takeError(), Errc::compile_failed, "creating a target machine"));
        llvm::TargetMachine& tm = (*emitter)->machine();
        retarget(*module, tm, me);
        if (optimised) optimise(*module, tm, st.opt_level);
        // Sandbox::sfi: confined after the optimiser (so it costs least), before codegen;
        // call_guard above already checks the indirect calls in every mode.
        if (st.sandbox == Sandbox::sfi)
            if (auto confined = confine_memory(*module); !confined) return tl::make_unexpected(confined.error());
        stats.optimise_ms = lap_ms(mark);
        module->setModuleIdentifier(hex);
        auto made = (*emitter)->emit(*module);
        if (!made) return tl::make_unexpected(to_error(made.takeError(), Errc::compile_failed, "generating code for slice " + hex));
        out.object = std::move(*made);
    }
    stats.codegen_ms = lap_ms(mark);
    stats.tier = static_cast<unsigned>(tier);
    if (view->slices.size() != 1) out.slice_bundle = extract_slice(*view, checked->index);
    return out;
}

std::size_t InProcessCompiler::emitters_made() const {
    return state_->fast_machines->made() + state_->optimised_machines->made();
}

Result<CompiledPtx> InProcessCompiler::compile_ptx(std::span<const std::byte> bundle, const CodeHash& expected,
                                                   unsigned sm) {
    CompiledPtx out;
    auto mark = Clock::now();
    // 1-4. As for a CPU slice, but for an NVIDIA GPU.
    auto checked = check_slice(bundle, expected, SliceTarget::gpu);
    if (!checked) return tl::make_unexpected(checked.error());
    out.stats.verify_ms = lap_ms(mark);
    // 5-7. Parse, verify, libdevice, O3 and PTX emission: compile_to_ptx's.
    auto ptx = compile_to_ptx(checked->slice().bitcode, sm, std::span<const std::byte>(state_->libdevice));
    if (!ptx) return tl::make_unexpected(ptx.error());
    out.stats.codegen_ms = lap_ms(mark);
    out.stats.tier = static_cast<unsigned>(Tier::optimised);
    out.ptx = std::move(*ptx);
    if (checked->view.slices.size() != 1) out.slice_bundle = extract_slice(checked->view, checked->index);
    return out;
}

namespace {
// The warm-up kernel as clang 19 writes one at -O2 (a kernel of bench/kernels, renamed): the
// attribute groups, TBAA and loop metadata, lifetime and memcpy intrinsics, a private string
// and llvm.compiler.used that real slices carry. Parsing, verifying, generating and linking
// it pays the first-use costs of those paths too: a module built by hand without them left
// the first real slice's parse 4x slower than the next one's (0.41 against 0.10 ms here).
constexpr const char* kWarmUpIr = R"IR(
@llvm.compiler.used = appending global [1 x ptr] [ptr @bitship_warm_up], section "llvm.metadata"
@.str = private unnamed_addr constant [37 x i8] c"mix: expected 144 bytes of arguments\00", align 1

define dso_local void @bitship_warm_up(ptr noundef %0) #0 {
  %2 = alloca i64, align 8
  %3 = alloca [16 x i64], align 16
  %4 = alloca i64, align 8
  call void @llvm.lifetime.start.p0(i64 8, ptr nonnull %2) #4
  %5 = call ptr @bs_args(ptr noundef %0, ptr noundef nonnull %2) #4
  %6 = load i64, ptr %2, align 8, !tbaa !5
  %7 = icmp eq i64 %6, 144
  br i1 %7, label %10, label %8

8:
  %9 = call i32 @bs_fail(ptr noundef %0, i32 noundef 1, ptr noundef nonnull @.str) #4
  br label %39

10:
  call void @llvm.lifetime.start.p0(i64 128, ptr nonnull %3) #4
  %11 = getelementptr inbounds i8, ptr %5, i64 16
  call void @llvm.memcpy.p0.p0.i64(ptr noundef nonnull align 16 dereferenceable(128) %3, ptr noundef nonnull align 8 dereferenceable(128) %11, i64 128, i1 false), !tbaa !5
  %12 = load i64, ptr %5, align 8, !tbaa !9
  call void @llvm.lifetime.start.p0(i64 8, ptr nonnull %4) #4
  %13 = getelementptr inbounds i8, ptr %5, i64 8
  %14 = load i64, ptr %13, align 8, !tbaa !11
  %15 = icmp eq i64 %14, 0
  br i1 %15, label %16, label %19

16:
  %17 = phi i64 [ 0, %10 ], [ %36, %19 ]
  store i64 %17, ptr %4, align 8, !tbaa !5
  %18 = call i32 @bs_reply(ptr noundef %0, ptr noundef nonnull %4, i64 noundef 8) #4
  call void @llvm.lifetime.end.p0(i64 8, ptr nonnull %4) #4
  call void @llvm.lifetime.end.p0(i64 128, ptr nonnull %3) #4
  br label %39

19:
  %20 = phi i64 [ %37, %19 ], [ 0, %10 ]
  %21 = phi i64 [ %24, %19 ], [ %12, %10 ]
  %22 = phi i64 [ %36, %19 ], [ 0, %10 ]
  %23 = mul i64 %21, 6364136223846793005
  %24 = add i64 %23, 1442695040888963407
  %25 = lshr i64 %24, 29
  %26 = lshr i64 %24, 60
  %27 = getelementptr inbounds [16 x i64], ptr %3, i64 0, i64 %26
  %28 = load i64, ptr %27, align 8, !tbaa !5
  %29 = xor i64 %28, %25
  %30 = and i64 %20, 15
  %31 = getelementptr inbounds [16 x i64], ptr %3, i64 0, i64 %30
  %32 = load i64, ptr %31, align 8, !tbaa !5
  %33 = add i64 %32, %29
  store i64 %33, ptr %31, align 8, !tbaa !5
  %34 = or i64 %20, 1
  %35 = mul i64 %29, %34
  %36 = add i64 %22, %35
  %37 = add nuw i64 %20, 1
  %38 = icmp eq i64 %37, %14
  br i1 %38, label %16, label %19, !llvm.loop !12

39:
  call void @llvm.lifetime.end.p0(i64 8, ptr nonnull %2) #4
  ret void
}

declare void @llvm.lifetime.start.p0(i64 immarg, ptr nocapture) #1
declare ptr @bs_args(ptr noundef, ptr noundef) local_unnamed_addr #2
declare i32 @bs_fail(ptr noundef, i32 noundef, ptr noundef) local_unnamed_addr #2
declare void @llvm.memcpy.p0.p0.i64(ptr noalias nocapture writeonly, ptr noalias nocapture readonly, i64, i1 immarg) #3
declare i32 @bs_reply(ptr noundef, ptr noundef, i64 noundef) local_unnamed_addr #2
declare void @llvm.lifetime.end.p0(i64 immarg, ptr nocapture) #1

attributes #0 = { nounwind uwtable "min-legal-vector-width"="0" "no-trapping-math"="true" "stack-protector-buffer-size"="8" }
attributes #1 = { nocallback nofree nosync nounwind willreturn memory(argmem: readwrite) }
attributes #2 = { "no-trapping-math"="true" "stack-protector-buffer-size"="8" }
attributes #3 = { nocallback nofree nounwind willreturn memory(argmem: readwrite) }
attributes #4 = { nounwind }

!llvm.module.flags = !{!0, !1, !2, !3}
!llvm.ident = !{!4}

!0 = !{i32 1, !"wchar_size", i32 4}
!1 = !{i32 8, !"PIC Level", i32 2}
!2 = !{i32 7, !"PIE Level", i32 2}
!3 = !{i32 7, !"uwtable", i32 2}
!4 = !{!"Debian clang version 19.1.7"}
!5 = !{!6, !6, i64 0}
!6 = !{!"long", !7, i64 0}
!7 = !{!"omnipotent char", !8, i64 0}
!8 = !{!"Simple C++ TBAA"}
!9 = !{!10, !6, i64 0}
!10 = !{!"mix_args", !6, i64 0, !6, i64 8, !7, i64 16}
!11 = !{!10, !6, i64 8}
!12 = distinct !{!12, !13}
!13 = !{!"llvm.loop.mustprogress"}
)IR";
} // namespace

WarmUpBundle warm_up_bundle() {
    llvm::LLVMContext context;
    llvm::SMDiagnostic problem;
    auto module = llvm::parseAssemblyString(kWarmUpIr, problem, context);
    if (!module) {
        // Our own text: a failure here is a bug in this file, and the warm-up is only a saving.
        std::string text;
        llvm::raw_string_ostream out(text);
        problem.print("bitship.warm_up", out);
        throw std::logic_error("the warm-up kernel does not parse: " + out.str());
    }
    module->setTargetTriple(host().triple);
    llvm::SmallVector<char, 0> buffer;
    llvm::raw_svector_ostream bitcode(buffer);
    llvm::WriteBitcodeToFile(*module, bitcode);
    auto bytes = std::as_bytes(std::span(buffer.data(), buffer.size()));
    std::vector<std::string> entries{kWarmUpEntry};
    SliceInput slice{host().triple, host().cpu, "bitship warm-up", host().llvm, bytes};
    return WarmUpBundle{write_bundle(entries, std::span(&slice, 1)), hash_code(bytes)};
}

} // namespace bitship::jit
