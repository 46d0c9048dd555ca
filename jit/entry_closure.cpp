// keep_only_entry (entry_closure.hpp): the functions and globals one kernel reaches, and the
// rest of the module removed.
#include "entry_closure.hpp"

#include <llvm/ADT/SmallPtrSet.h>
#include <llvm/ADT/SmallVector.h>
#include <llvm/IR/Constants.h>
#include <llvm/IR/Function.h>
#include <llvm/IR/GlobalVariable.h>
#include <llvm/IR/InstIterator.h>
#include <llvm/IR/Metadata.h>
#include <llvm/IR/Module.h>

namespace bitship::jit {
namespace {

/// Every global value `root` refers to, directly or through constants and the initialisers
/// of the globals it refers to.
class Reach {
public:
    explicit Reach(const llvm::GlobalValue* root) { add(root); }

    void run() {
        while (!work_.empty()) {
            const llvm::GlobalValue* g = work_.pop_back_val();
            if (const auto* f = llvm::dyn_cast<llvm::Function>(g)) {
                for (const auto& inst : llvm::instructions(*f))
                    for (const llvm::Value* operand : inst.operands()) operand_of_code(operand);
            } else if (const auto* v = llvm::dyn_cast<llvm::GlobalVariable>(g); v && v->hasInitializer()) {
                constant(v->getInitializer());
            }
        }
    }

    [[nodiscard]] bool contains(const llvm::GlobalValue* g) const { return kept_.contains(g); }

private:
    void add(const llvm::GlobalValue* g) {
        if (kept_.insert(g).second) work_.push_back(g);
    }

    void operand_of_code(const llvm::Value* operand) {
        if (const auto* c = llvm::dyn_cast<llvm::Constant>(operand)) {
            constant(c);
        } else if (const auto* wrapped = llvm::dyn_cast<llvm::MetadataAsValue>(operand)) {
            // A debug intrinsic's operand may name a global.
            if (const auto* value = llvm::dyn_cast<llvm::ValueAsMetadata>(wrapped->getMetadata()))
                if (const auto* c = llvm::dyn_cast<llvm::Constant>(value->getValue())) constant(c);
        }
    }

    void constant(const llvm::Constant* c) {
        if (const auto* g = llvm::dyn_cast<llvm::GlobalValue>(c)) {
            add(g);
            return;
        }
        if (!seen_.insert(c).second) return;
        for (const llvm::Value* operand : c->operands())
            if (const auto* inner = llvm::dyn_cast<llvm::Constant>(operand)) constant(inner);
    }

    llvm::SmallPtrSet<const llvm::GlobalValue*, 16> kept_;
    llvm::SmallPtrSet<const llvm::Constant*, 32> seen_;
    llvm::SmallVector<const llvm::GlobalValue*, 16> work_;
};

bool reserved(const llvm::GlobalValue& g) { return g.getName().starts_with("llvm."); }

} // namespace

bool holds_state(const llvm::Module& module) {
    for (const auto& g : module.globals())
        if (!g.isDeclaration() && !g.isConstant() && !reserved(g)) return true;
    return false;
}

std::vector<std::string> keep_only_entry(llvm::Module& module, std::string_view entry,
                                         const std::vector<std::string>& entries) {
    llvm::Function* root = module.getFunction(llvm::StringRef(entry.data(), entry.size()));
    if (root == nullptr || root->isDeclaration() || holds_state(module)) return {};

    Reach reach(root);
    reach.run();
    std::vector<std::string> left_out;
    for (const auto& name : entries)
        if (auto* f = module.getFunction(name); f != nullptr && !f->isDeclaration() && !reach.contains(f))
            left_out.push_back(name);

    // llvm.used and llvm.compiler.used keep symbols from the optimiser, which tier 0 does not
    // run; they name functions this part leaves out.
    for (const char* keeper : {"llvm.used", "llvm.compiler.used"})
        if (auto* g = module.getNamedGlobal(keeper)) g->eraseFromParent();
    std::vector<llvm::Function*> dead_functions;
    std::vector<llvm::GlobalVariable*> dead_globals;
    for (auto& f : module)
        if (!f.isDeclaration() && !reach.contains(&f)) dead_functions.push_back(&f);
    for (auto& g : module.globals())
        if (!g.isDeclaration() && !reserved(g) && !reach.contains(&g)) dead_globals.push_back(&g);
    // Nothing kept refers to what goes (that is what Reach found), so once the dead drop their
    // references to one another, none of them has a use left.
    for (auto* f : dead_functions) f->dropAllReferences();
    for (auto* g : dead_globals) g->setInitializer(nullptr);
    for (auto* f : dead_functions) {
        f->removeDeadConstantUsers();
        f->eraseFromParent();
    }
    for (auto* g : dead_globals) {
        g->removeDeadConstantUsers();
        g->eraseFromParent();
    }
    return left_out;
}

} // namespace bitship::jit
