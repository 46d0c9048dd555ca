#pragma once
// A TargetMachine and the code generation pass pipeline built for it, kept from one module's
// object to the next. Building the legacy pipeline (LLVMTargetMachine::addPassesToEmitMC:
// some hundred passes scheduled one by one) was a fifth of a tier-0 compile's instructions, as
// much as the passes then took to run on a small kernel; LLVM's pass managers are made to run
// module after module (every pass's doInitialization/doFinalization per module, the MC
// context, the streamer and the object writer reset between them), so one pipeline serves
// every compile of its TargetMachine. test/jit/object_emitter_test.cpp checks that an object is the same
// byte for byte whether its pipeline is new or has made others before it. Private to jit/.

#include <cstddef>
#include <memory>
#include <vector>

#include <llvm/ADT/SmallVector.h>
#include <llvm/IR/LegacyPassManager.h>
#include <llvm/Support/Error.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Target/TargetMachine.h>

namespace bitship::jit {

/// One thread at a time: TargetMachines and pass pipelines are not safe to share.
class ObjectEmitter {
public:
    explicit ObjectEmitter(std::unique_ptr<llvm::TargetMachine> machine);
    ~ObjectEmitter();
    ObjectEmitter(const ObjectEmitter&) = delete;
    ObjectEmitter& operator=(const ObjectEmitter&) = delete;

    llvm::TargetMachine& machine() { return *machine_; }

    /// `module`'s relocatable object, made by the kept pipeline (built at the first call).
    /// The module must already be retargeted to machine() (optimise.hpp: retarget).
    llvm::Expected<std::vector<std::byte>> emit(llvm::Module& module);

private:
    // Declared in this order so that the pipeline, which holds the stream and the machine, goes
    // first.
    std::unique_ptr<llvm::TargetMachine> machine_;
    llvm::SmallVector<char, 0> buffer_;
    llvm::raw_svector_ostream stream_{buffer_};
    std::unique_ptr<llvm::legacy::PassManager> pipeline_;
};

} // namespace bitship::jit
