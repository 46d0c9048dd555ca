#include "call_guard.hpp"

#include <vector>

#include <llvm/IR/Function.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/InstrTypes.h>
#include <llvm/IR/Instructions.h>
#include <llvm/IR/Module.h>
#include <llvm/Transforms/Utils/BasicBlockUtils.h>

#include "jit.hpp"

namespace bitship::jit {

unsigned guard_indirect_calls(llvm::Module& module) {
    // The only legal targets of an indirect call: functions this module defines and whose
    // address it takes. Anything else it could hold was made, not taken.
    std::vector<llvm::Function*> targets;
    std::vector<llvm::CallBase*> sites;
    for (auto& f : module) {
        if (!f.isDeclaration() && f.hasAddressTaken()) targets.push_back(&f);
        for (auto& block : f)
            for (auto& inst : block)
                if (auto* call = llvm::dyn_cast<llvm::CallBase>(&inst);
                    call && !call->isInlineAsm() && !llvm::isa<llvm::Function>(call->getCalledOperand()->stripPointerCasts()))
                    sites.push_back(call);
    }
    if (sites.empty()) return 0;

    auto& context = module.getContext();
    llvm::FunctionCallee stop = module.getOrInsertFunction(
        kForgedCallSymbol, llvm::FunctionType::get(llvm::Type::getVoidTy(context), false));
    if (auto* f = llvm::dyn_cast<llvm::Function>(stop.getCallee())) {
        f->setDoesNotReturn();
        f->setDoesNotThrow();
    }

    for (llvm::CallBase* call : sites) {
        llvm::IRBuilder<> b(call);
        llvm::Value* callee = call->getCalledOperand();
        llvm::Value* known = b.getFalse();
        for (llvm::Function* t : targets) known = b.CreateOr(known, b.CreateICmpEQ(callee, t));
        // Not a function of this module: stop the kernel there, never make the call.
        llvm::Instruction* forged = llvm::SplitBlockAndInsertIfThen(b.CreateNot(known), call, /*Unreachable=*/true);
        llvm::IRBuilder<> stop_here(forged);
        auto* stop_call = stop_here.CreateCall(stop);
        stop_call->setDoesNotReturn();
    }
    return static_cast<unsigned>(sites.size());
}

} // namespace bitship::jit
