#include "optimise.hpp"

#include <llvm/Analysis/CGSCCPassManager.h>
#include <llvm/Analysis/LoopAnalysisManager.h>
#include <llvm/IR/Module.h>
#include <llvm/IR/PassManager.h>
#include <llvm/Passes/OptimizationLevel.h>
#include <llvm/Passes/PassBuilder.h>
#include <llvm/Target/TargetMachine.h>

#include "jit.hpp"

namespace bitship::jit {

void retarget(llvm::Module& module, const llvm::TargetMachine& tm, const HostInfo& host) {
    module.setTargetTriple(tm.getTargetTriple().str());
    module.setDataLayout(tm.createDataLayout());
    for (auto& f : module.functions()) {
        if (f.isDeclaration()) continue;
        f.addFnAttr("target-cpu", host.cpu);
        f.addFnAttr("tune-cpu", host.cpu);
        f.addFnAttr("target-features", host.features);
    }
}

void optimise(llvm::Module& module, llvm::TargetMachine& tm, unsigned opt_level) {
    if (opt_level == 0) return;
    const llvm::OptimizationLevel level = opt_level == 1   ? llvm::OptimizationLevel::O1
                                          : opt_level == 2 ? llvm::OptimizationLevel::O2
                                                           : llvm::OptimizationLevel::O3;
    // Declared in this order so that they are destroyed in the right one: the proxies make
    // each manager refer to the others (the idiom from LLVM's "Using the New Pass Manager").
    llvm::LoopAnalysisManager lam;
    llvm::FunctionAnalysisManager fam;
    llvm::CGSCCAnalysisManager cgam;
    llvm::ModuleAnalysisManager mam;
    llvm::PassBuilder builder(&tm);
    builder.registerModuleAnalyses(mam);
    builder.registerCGSCCAnalyses(cgam);
    builder.registerFunctionAnalyses(fam);
    builder.registerLoopAnalyses(lam);
    builder.crossRegisterProxies(lam, fam, cgam, mam);
    builder.buildPerModuleDefaultPipeline(level).run(module, mam);
}

} // namespace bitship::jit
