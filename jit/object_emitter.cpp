// ObjectEmitter: code generation with a pass pipeline kept between modules (object_emitter.hpp).
#include "object_emitter.hpp"

#include <utility>

#include <llvm/IR/Module.h>
#include <llvm/MC/MCContext.h>

namespace bitship::jit {
namespace {
/// What the output buffer keeps between objects; a larger one (a large module's) is let go.
constexpr std::size_t kKeptCapacity = std::size_t{1} << 20;
} // namespace

ObjectEmitter::ObjectEmitter(std::unique_ptr<llvm::TargetMachine> machine) : machine_(std::move(machine)) {}

ObjectEmitter::~ObjectEmitter() = default;

llvm::Expected<std::vector<std::byte>> ObjectEmitter::emit(llvm::Module& module) {
    if (!pipeline_) {
        auto pipeline = std::make_unique<llvm::legacy::PassManager>();
        llvm::MCContext* context = nullptr;
        // As orc::SimpleCompiler does, once: the passes write the object into stream_.
        if (machine_->addPassesToEmitMC(*pipeline, context, stream_))
            return llvm::createStringError(llvm::inconvertibleErrorCode(), "the target cannot emit object code");
        pipeline_ = std::move(pipeline);
    }
    buffer_.clear(); // raw_svector_ostream is unbuffered and writes at buffer_.size()
    pipeline_->run(module);
    auto* first = reinterpret_cast<const std::byte*>(buffer_.data());
    std::vector<std::byte> object(first, first + buffer_.size());
    buffer_.clear();
    if (buffer_.capacity() > kKeptCapacity) llvm::SmallVector<char, 0>().swap(buffer_); // the stream holds buffer_ itself
    return object;
}

} // namespace bitship::jit
