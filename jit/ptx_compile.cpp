#include "ptx_compile.hpp"

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <set>
#include <system_error>
#include <vector>

#include <fmt/format.h>
#include <llvm/ADT/SmallString.h>
#include <llvm/Analysis/CGSCCPassManager.h>
#include <llvm/Analysis/LoopAnalysisManager.h>
#include <llvm/Bitcode/BitcodeReader.h>
#include <llvm/IR/Constants.h>
#include <llvm/IR/DiagnosticInfo.h>
#include <llvm/IR/DiagnosticPrinter.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/LegacyPassManager.h>
#include <llvm/IR/Metadata.h>
#include <llvm/IR/Module.h>
#include <llvm/IR/PassManager.h>
#include <llvm/IR/Verifier.h>
#include <llvm/Linker/Linker.h>
#include <llvm/MC/TargetRegistry.h>
#include <llvm/Passes/PassBuilder.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Target/TargetMachine.h>
#include <llvm/Target/TargetOptions.h>
#include <llvm/TargetParser/Triple.h>
#include <llvm/Transforms/IPO/Internalize.h>

#include "llvm_error.hpp"

// The NVPTX target's registration functions (what llvm/Config/Targets.def would expand to);
// Debian's libLLVM-19 is built with NVPTX.
extern "C" {
void LLVMInitializeNVPTXTargetInfo();
void LLVMInitializeNVPTXTarget();
void LLVMInitializeNVPTXTargetMC();
void LLVMInitializeNVPTXAsmPrinter();
}

namespace bitship::jit {
namespace {

constexpr const char* kTriple = "nvptx64-nvidia-cuda";
constexpr llvm::StringLiteral kGeometryPrefix = "bs_gpu_geometry_"; // BS_GPU_GEOMETRY_PREFIX (gpu_kernel.h)

// Externals a kernel may leave for ptxas and the driver: the device's system calls.
bool is_device_syscall(llvm::StringRef name) { return name == "vprintf" || name == "malloc" || name == "free"; }

// The kernels: functions with the PTX kernel calling convention, or named kernels in
// !nvvm.annotations (what clang 19 emits for __attribute__((nvptx_kernel))).
std::set<std::string, std::less<>> kernel_names(llvm::Module& m) {
    std::set<std::string, std::less<>> names;
    for (auto& f : m)
        if (!f.isDeclaration() && f.getCallingConv() == llvm::CallingConv::PTX_Kernel) names.insert(f.getName().str());
    if (auto* annotations = m.getNamedMetadata("nvvm.annotations")) {
        for (auto* node : annotations->operands()) {
            // {ptr @f, !"kernel", i32 1} (and possibly more key/value pairs).
            if (node->getNumOperands() < 3) continue;
            auto* fn = llvm::mdconst::dyn_extract_or_null<llvm::Function>(node->getOperand(0));
            if (!fn || fn->isDeclaration()) continue;
            for (unsigned i = 1; i + 1 < node->getNumOperands(); i += 2) {
                auto* key = llvm::dyn_cast_or_null<llvm::MDString>(node->getOperand(i));
                auto* value = llvm::mdconst::dyn_extract_or_null<llvm::ConstantInt>(node->getOperand(i + 1));
                if (key && key->getString() == "kernel" && value && value->isOne()) names.insert(fn->getName().str());
            }
        }
    }
    return names;
}

// What the target-cpu/target-features attributes from the client's clang say (e.g. +ptx85,
// from whatever CUDA it found) is not for this agent: the TargetMachine's sm_XX and LLVM's
// default PTX version for it decide.
void drop_target_attributes(llvm::Module& m) {
    for (auto& f : m) {
        f.removeFnAttr("target-cpu");
        f.removeFnAttr("target-features");
    }
}

std::string join(const std::vector<std::string>& names) {
    std::string out;
    for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
    return out;
}

} // namespace

void init_ptx_target() {
    static std::once_flag once;
    std::call_once(once, [] {
        LLVMInitializeNVPTXTargetInfo();
        LLVMInitializeNVPTXTarget();
        LLVMInitializeNVPTXTargetMC();
        LLVMInitializeNVPTXAsmPrinter();
    });
}

Result<std::vector<std::byte>> read_libdevice(const std::filesystem::path& path) {
    if (path.empty()) return std::vector<std::byte>{};
    auto file = llvm::MemoryBuffer::getFile(path.string(), /*IsText=*/false, /*RequiresNullTerminator=*/false);
    if (!file) return fail(Errc::no_device, fmt::format("cannot read libdevice {}: {}", path.string(), file.getError().message()));
    auto* first = reinterpret_cast<const std::byte*>((*file)->getBufferStart());
    return std::vector<std::byte>(first, first + (*file)->getBufferSize());
}

Result<std::string> compile_to_ptx(std::span<const std::byte> bitcode, unsigned sm,
                                   const std::filesystem::path& libdevice) {
    auto bytes = read_libdevice(libdevice);
    if (!bytes) return tl::make_unexpected(bytes.error());
    return compile_to_ptx(bitcode, sm, std::span<const std::byte>(*bytes));
}

std::filesystem::path find_libdevice() {
    const std::filesystem::path rel = "nvvm/libdevice/libdevice.10.bc";
    std::vector<std::filesystem::path> candidates;
    for (const char* var : {"CUDA_HOME", "CUDA_PATH"})
        if (const char* dir = std::getenv(var); dir && *dir) candidates.emplace_back(std::filesystem::path(dir) / rel);
    candidates.emplace_back(std::filesystem::path("/usr/local/cuda") / rel);
    for (const auto& p : candidates) {
        std::error_code ec;
        if (std::filesystem::is_regular_file(p, ec)) return p;
    }
    return {};
}

Result<std::string> compile_to_ptx(std::span<const std::byte> bitcode, unsigned sm,
                                   std::span<const std::byte> libdevice) {
    init_ptx_target();
    llvm::LLVMContext context;
    // Linker and back-end diagnostics land here, so a failure can say what went wrong.
    std::string diagnostics;
    context.setDiagnosticHandlerCallBack(
        [](const llvm::DiagnosticInfo* info, void* out) {
            if (info->getSeverity() != llvm::DS_Error) return;
            std::string text;
            llvm::raw_string_ostream os(text);
            llvm::DiagnosticPrinterRawOStream printer(os);
            info->print(printer);
            auto& all = *static_cast<std::string*>(out);
            all += (all.empty() ? "" : "; ") + os.str();
        },
        &diagnostics);

    llvm::MemoryBufferRef buffer(
        llvm::StringRef(reinterpret_cast<const char*>(bitcode.data()), bitcode.size()), "nvptx64 slice");
    auto parsed = llvm::parseBitcodeFile(buffer, context);
    if (!parsed) return tl::make_unexpected(to_error(parsed.takeError(), Errc::invalid_bitcode, "parsing the nvptx64 slice"));
    std::unique_ptr<llvm::Module> module = std::move(*parsed);
    if (llvm::Triple(module->getTargetTriple()).getArch() != llvm::Triple::nvptx64)
        return fail(Errc::invalid_bitcode,
                    fmt::format("the slice is for '{}', not nvptx64-nvidia-cuda", module->getTargetTriple()));
    {
        std::string problem;
        llvm::raw_string_ostream problem_out(problem);
        if (llvm::verifyModule(*module, &problem_out))
            return fail(Errc::invalid_bitcode, "the nvptx64 slice does not verify: " + problem_out.str());
    }

    auto kernels = kernel_names(*module);
    if (kernels.empty())
        return fail(Errc::compile_failed, "the nvptx64 slice defines no kernel (define kernels with BS_GPU_KERNEL)");
    // An external definition that is not a kernel would be a .func no launch can reach: the
    // source lost its kernel attribute. Say so instead of compiling it into nothing.
    std::vector<std::string> not_kernels;
    for (auto& f : *module)
        if (!f.isDeclaration() && f.hasExternalLinkage() && !kernels.contains(f.getName()))
            not_kernels.push_back(f.getName().str());
    if (!not_kernels.empty())
        return fail(Errc::compile_failed,
                    fmt::format("external function(s) {} are not kernels (no nvptx_kernel attribute: define them "
                                "with BS_GPU_KERNEL, or make them static)",
                                join(not_kernels)));

    std::string error;
    const llvm::Target* target = llvm::TargetRegistry::lookupTarget(kTriple, error);
    if (!target) return fail(Errc::compile_failed, "no NVPTX target in this LLVM: " + error);
    const std::string cpu = fmt::format("sm_{}", std::min(sm, kMaxPtxSm));
    llvm::TargetOptions options;
    std::unique_ptr<llvm::TargetMachine> machine(target->createTargetMachine(
        kTriple, cpu, "", options, std::nullopt, std::nullopt, llvm::CodeGenOptLevel::Aggressive));
    if (!machine) return fail(Errc::compile_failed, "cannot make an NVPTX target machine for " + cpu);
    module->setTargetTriple(kTriple);
    module->setDataLayout(machine->createDataLayout());
    drop_target_attributes(*module);

    // libdevice, lazily: only what the kernels call, and only when they call any of it.
    bool calls_libdevice = std::any_of(module->begin(), module->end(), [](const llvm::Function& f) {
        return f.isDeclaration() && f.getName().starts_with("__nv_");
    });
    if (calls_libdevice) {
        if (libdevice.empty())
            return fail(Errc::no_device, "the kernel calls libdevice (__nv_*) but no libdevice.10.bc was found "
                                         "(set CUDA_HOME, or install the CUDA Toolkit)");
        // A view, not a copy: the module is linked and gone before this call returns.
        auto file = llvm::MemoryBuffer::getMemBuffer(
            llvm::StringRef(reinterpret_cast<const char*>(libdevice.data()), libdevice.size()), "libdevice.10.bc",
            /*RequiresNullTerminator=*/false);
        auto lib = llvm::getOwningLazyBitcodeModule(std::move(file), context);
        if (!lib) return tl::make_unexpected(to_error(lib.takeError(), Errc::compile_failed, "reading libdevice"));
        (*lib)->setTargetTriple(kTriple);
        (*lib)->setDataLayout(module->getDataLayout());
        if (llvm::Linker::linkModules(*module, std::move(*lib), llvm::Linker::Flags::LinkOnlyNeeded))
            return fail(Errc::compile_failed, "linking libdevice: " + diagnostics);
        drop_target_attributes(*module);
    }

    // The kernels stay external, and so do their declared geometries (BS_GPU_GEOMETRY): the
    // agent reads those from the PTX.
    llvm::internalizeModule(*module, [&](const llvm::GlobalValue& gv) {
        return kernels.contains(gv.getName()) ||
               (llvm::isa<llvm::GlobalVariable>(gv) && gv.getName().starts_with(kGeometryPrefix));
    });

    // O3 with the NVPTX TargetMachine: its PassBuilder callbacks put NVVMReflect (and
    // NVVMIntrRange) at the start of the pipeline, which folds libdevice's __nvvm_reflect.
    {
        llvm::LoopAnalysisManager lam;
        llvm::FunctionAnalysisManager fam;
        llvm::CGSCCAnalysisManager cgam;
        llvm::ModuleAnalysisManager mam;
        llvm::PassBuilder builder(machine.get());
        builder.registerModuleAnalyses(mam);
        builder.registerCGSCCAnalyses(cgam);
        builder.registerFunctionAnalyses(fam);
        builder.registerLoopAnalyses(lam);
        builder.crossRegisterProxies(lam, fam, cgam, mam);
        auto pipeline = builder.buildPerModuleDefaultPipeline(llvm::OptimizationLevel::O3);
        pipeline.run(*module, mam);
    }

    // Whatever is still only declared and called must be an intrinsic or a device system call;
    // anything else (a libdevice name libdevice lacks, libm's expf, __nvvm_reflect) would fail
    // in ptxas or at load time with a worse message.
    std::vector<std::string> unresolved;
    for (auto& f : *module)
        if (f.isDeclaration() && !f.isIntrinsic() && !f.use_empty() && !is_device_syscall(f.getName()))
            unresolved.push_back(f.getName().str());
    if (!unresolved.empty())
        return fail(Errc::compile_failed,
                    fmt::format("the kernel calls {} which neither libdevice nor the device provides", join(unresolved)));

    llvm::SmallString<0> ptx;
    {
        llvm::raw_svector_ostream out(ptx);
        llvm::legacy::PassManager codegen;
        if (machine->addPassesToEmitFile(codegen, out, nullptr, llvm::CodeGenFileType::AssemblyFile))
            return fail(Errc::compile_failed, "the NVPTX target cannot emit PTX");
        codegen.run(*module);
    }
    if (!diagnostics.empty()) return fail(Errc::compile_failed, "PTX code generation for " + cpu + ": " + diagnostics);
    return std::string(ptx.str());
}

} // namespace bitship::jit
