// keep_only_entry (entry_closure.hpp): the functions and globals one kernel reaches, read from
// the bitcode as they are found, and the rest of the module removed unread.
#include "entry_closure.hpp"

#include <llvm/ADT/SmallPtrSet.h>
#include <llvm/ADT/SmallVector.h>
#include <llvm/IR/Constants.h>
#include <llvm/IR/Function.h>
#include <llvm/IR/GlobalAlias.h>
#include <llvm/IR/GlobalIFunc.h>
#include <llvm/IR/GlobalVariable.h>
#include <llvm/IR/InstIterator.h>
#include <llvm/IR/Metadata.h>
#include <llvm/IR/Module.h>

namespace bitship::jit {
namespace {

/// Every global value `root` refers to, directly or through constants and the initialisers
/// of the globals it refers to; each function reached is materialised (read from a lazily
/// loaded module's bitcode) before its instructions are walked.
class Reach {
public:
    explicit Reach(llvm::GlobalValue* root) { add(root); }

    llvm::Error run() {
        while (!work_.empty()) {
            llvm::GlobalValue* g = work_.pop_back_val();
            if (auto* f = llvm::dyn_cast<llvm::Function>(g)) {
                if (auto err = f->materialize()) return err;
                // Its personality function, prefix or prologue data (which the code policy
                // refuses): what is kept must not refer to what goes, whatever it holds.
                for (llvm::Value* operand : f->operands()) operand_of_code(operand);
                for (auto& inst : llvm::instructions(*f))
                    for (llvm::Value* operand : inst.operands()) operand_of_code(operand);
            } else if (auto* v = llvm::dyn_cast<llvm::GlobalVariable>(g); v && v->hasInitializer()) {
                constant(v->getInitializer());
            } else if (auto* a = llvm::dyn_cast<llvm::GlobalAlias>(g)) { // refused later, kept whole now
                constant(a->getAliasee());
            } else if (auto* i = llvm::dyn_cast<llvm::GlobalIFunc>(g)) {
                constant(i->getResolver());
            }
        }
        return llvm::Error::success();
    }

    [[nodiscard]] bool contains(const llvm::GlobalValue* g) const { return kept_.contains(g); }

private:
    void add(llvm::GlobalValue* g) {
        if (kept_.insert(g).second) work_.push_back(g);
    }

    void operand_of_code(llvm::Value* operand) {
        if (operand == nullptr) return;
        if (auto* c = llvm::dyn_cast<llvm::Constant>(operand)) {
            constant(c);
        } else if (auto* wrapped = llvm::dyn_cast<llvm::MetadataAsValue>(operand)) {
            // A debug intrinsic's operand may name a global.
            if (auto* value = llvm::dyn_cast<llvm::ValueAsMetadata>(wrapped->getMetadata()))
                if (auto* c = llvm::dyn_cast<llvm::Constant>(value->getValue())) constant(c);
        }
    }

    void constant(llvm::Constant* c) {
        if (auto* g = llvm::dyn_cast<llvm::GlobalValue>(c)) {
            add(g);
            return;
        }
        if (!seen_.insert(c).second) return;
        for (llvm::Value* operand : c->operands())
            if (auto* inner = llvm::dyn_cast<llvm::Constant>(operand)) constant(inner);
    }

    llvm::SmallPtrSet<const llvm::GlobalValue*, 16> kept_;
    llvm::SmallPtrSet<const llvm::Constant*, 32> seen_;
    llvm::SmallVector<llvm::GlobalValue*, 16> work_;
};

bool reserved(const llvm::GlobalValue& g) { return g.getName().starts_with("llvm."); }

} // namespace

bool holds_state(const llvm::Module& module) {
    for (const auto& g : module.globals())
        if (!g.isDeclaration() && !g.isConstant() && !reserved(g)) return true;
    return false;
}

llvm::Expected<std::vector<std::string>> keep_only_entry(llvm::Module& module, std::string_view entry,
                                                         const std::vector<std::string>& entries) {
    llvm::Function* root = module.getFunction(llvm::StringRef(entry.data(), entry.size()));
    if (root == nullptr || root->isDeclaration() || holds_state(module)) {
        if (auto err = module.materializeAll()) return err;
        return std::vector<std::string>{};
    }

    Reach reach(root);
    if (auto err = reach.run()) return err;
    // A function not yet read is no declaration: it counts as defined.
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
    // bodies (a function never read, its promise of one) and initialisers, none of them has a
    // use left. One that still has a use (through a construct the code policy refuses, such as
    // another llvm.* global) stays, as an external declaration: refused later by name, never
    // freed while in use.
    for (auto* f : dead_functions) f->deleteBody();
    for (auto* g : dead_globals) g->setInitializer(nullptr);
    for (auto* f : dead_functions) {
        f->removeDeadConstantUsers();
        if (f->use_empty()) f->eraseFromParent();
    }
    for (auto* g : dead_globals) {
        g->removeDeadConstantUsers();
        if (g->use_empty()) g->eraseFromParent();
    }
    // What only the removed code called: the allow-list checks the declarations that are left.
    std::vector<llvm::Function*> unused;
    for (auto& f : module)
        if (f.isDeclaration() && !reach.contains(&f) && f.use_empty()) unused.push_back(&f);
    for (auto* f : unused) f->eraseFromParent();
    // The module's metadata and upgrades; no function body is left to read.
    if (auto err = module.materializeAll()) return err;
    return left_out;
}

} // namespace bitship::jit
