// Software fault isolation: confine_memory (see sfi_pass.hpp).
#include "sfi_pass.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>

#include <fmt/format.h>

#include <llvm/ADT/DenseMap.h>
#include <llvm/ADT/SmallPtrSet.h>
#include <llvm/ADT/SmallVector.h>
#include <llvm/Analysis/VectorUtils.h>
#include <llvm/IR/Constants.h>
#include <llvm/IR/DataLayout.h>
#include <llvm/IR/Function.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Instructions.h>
#include <llvm/IR/IntrinsicInst.h>
#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/Module.h>
#include <llvm/IR/NoFolder.h>
#include <llvm/IR/Operator.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Transforms/Utils/BasicBlockUtils.h>

#include "jit.hpp"

namespace bitship::jit {
namespace {

constexpr const char* kRuleAccessSize = "sfi-access-size";
constexpr const char* kRuleVarargs = "sfi-no-varargs";
constexpr const char* kRuleAddressSpace = "sfi-address-space";
constexpr const char* kRuleReserved = "sfi-reserved-name";
/// The unsafe stack's frames are aligned to at least this.
constexpr std::uint64_t kFrameAlign = 16;

Error refuse(const char* rule, std::string_view where, std::string_view says) {
    return Error{Errc::policy_violation, fmt::format("kernel code policy, rule {}: {}: {}", rule, where, says)};
}

// ---- the safety predicate, shared by the pass and the checker ----

/// Whether every use of `root` (an alloca or a byval parameter of `size` bytes) is a load or a
/// store through it, at a constant offset wholly inside [0, size), directly or through
/// constant-index inbounds GEPs, or a lifetime marker. Such an object needs no mask.
bool is_safe_object(const llvm::Value* root, std::uint64_t size, const llvm::DataLayout& dl) {
    struct Item {
        const llvm::Value* v;
        std::int64_t offset;
    };
    llvm::SmallVector<Item, 8> work{{root, 0}};
    auto in_bounds = [&](std::int64_t offset, llvm::TypeSize bytes) {
        if (bytes.isScalable() || offset < 0) return false;
        return static_cast<std::uint64_t>(offset) <= size && bytes.getFixedValue() <= size - static_cast<std::uint64_t>(offset);
    };
    while (!work.empty()) {
        Item item = work.pop_back_val();
        for (const llvm::Use& use : item.v->uses()) {
            const auto* user = llvm::dyn_cast<llvm::Instruction>(use.getUser());
            if (user == nullptr) return false;
            if (const auto* load = llvm::dyn_cast<llvm::LoadInst>(user)) {
                if (!in_bounds(item.offset, dl.getTypeStoreSize(load->getType()))) return false;
                continue;
            }
            if (const auto* store = llvm::dyn_cast<llvm::StoreInst>(user)) {
                if (use.getOperandNo() != llvm::StoreInst::getPointerOperandIndex()) return false; // stored as a value
                if (!in_bounds(item.offset, dl.getTypeStoreSize(store->getValueOperand()->getType()))) return false;
                continue;
            }
            if (const auto* gep = llvm::dyn_cast<llvm::GetElementPtrInst>(user)) {
                if (use.getOperandNo() != 0 || !gep->isInBounds()) return false;
                llvm::APInt offset(dl.getIndexTypeSizeInBits(gep->getType()), 0);
                if (!gep->accumulateConstantOffset(dl, offset) || !offset.isSignedIntN(32)) return false;
                work.push_back({gep, item.offset + offset.getSExtValue()});
                continue;
            }
            if (const auto* intrinsic = llvm::dyn_cast<llvm::IntrinsicInst>(user);
                intrinsic != nullptr && intrinsic->isLifetimeStartOrEnd())
                continue;
            return false;
        }
    }
    return true;
}

std::optional<std::uint64_t> static_size(const llvm::AllocaInst& alloca, const llvm::DataLayout& dl) {
    if (!alloca.isStaticAlloca()) return std::nullopt;
    auto size = alloca.getAllocationSize(dl);
    if (!size || size->isScalable()) return std::nullopt;
    return size->getFixedValue();
}

bool is_safe_alloca(const llvm::AllocaInst& alloca, const llvm::DataLayout& dl) {
    auto size = static_size(alloca, dl);
    return size && is_safe_object(&alloca, *size, dl);
}

bool is_safe_byval(const llvm::Argument& arg, const llvm::DataLayout& dl) {
    if (!arg.hasByValAttr()) return false;
    auto size = dl.getTypeAllocSize(arg.getParamByValType());
    return !size.isScalable() && is_safe_object(&arg, size.getFixedValue(), dl);
}

/// Whether `v` is a safe alloca or byval parameter, or a GEP chain from one (whose every step
/// the predicate has checked). `cache` remembers the verdict per root.
bool is_safe_pointer(const llvm::Value* v, const llvm::DataLayout& dl,
                     llvm::DenseMap<const llvm::Value*, bool>* cache = nullptr) {
    while (const auto* gep = llvm::dyn_cast<llvm::GetElementPtrInst>(v)) v = gep->getPointerOperand();
    if (cache != nullptr)
        if (auto it = cache->find(v); it != cache->end()) return it->second;
    bool safe = false;
    if (const auto* alloca = llvm::dyn_cast<llvm::AllocaInst>(v)) safe = is_safe_alloca(*alloca, dl);
    if (const auto* arg = llvm::dyn_cast<llvm::Argument>(v)) safe = is_safe_byval(*arg, dl);
    if (cache != nullptr) cache->try_emplace(v, safe);
    return safe;
}

// ---- the pass ----

/// Where a memory access keeps its pointer.
struct Access {
    llvm::Instruction* inst;
    unsigned operand;
};

/// The pointer operand index of an access to confine, if `inst` is one.
std::optional<unsigned> pointer_operand(const llvm::Instruction& inst) {
    if (llvm::isa<llvm::LoadInst>(inst)) return llvm::LoadInst::getPointerOperandIndex();
    if (llvm::isa<llvm::StoreInst>(inst)) return llvm::StoreInst::getPointerOperandIndex();
    if (llvm::isa<llvm::AtomicRMWInst>(inst)) return llvm::AtomicRMWInst::getPointerOperandIndex();
    if (llvm::isa<llvm::AtomicCmpXchgInst>(inst)) return llvm::AtomicCmpXchgInst::getPointerOperandIndex();
    if (const auto* intrinsic = llvm::dyn_cast<llvm::IntrinsicInst>(&inst)) {
        switch (intrinsic->getIntrinsicID()) {
        case llvm::Intrinsic::masked_load:
        case llvm::Intrinsic::masked_gather:
        case llvm::Intrinsic::masked_expandload: return 0;
        case llvm::Intrinsic::masked_store:
        case llvm::Intrinsic::masked_scatter:
        case llvm::Intrinsic::masked_compressstore: return 1;
        default: return std::nullopt;
        }
    }
    return std::nullopt;
}

/// The address space of a pointer `inst` uses or makes, when it is not the default one (on
/// x86-64, 256 and 257 are the gs and fs segments: a confined offset there reaches the thread's
/// own data, not the arena).
std::optional<unsigned> other_address_space(const llvm::Instruction& inst) {
    auto space_of = [](const llvm::Type* t) -> unsigned {
        if (const auto* vt = llvm::dyn_cast<llvm::VectorType>(t)) t = vt->getElementType();
        const auto* pt = llvm::dyn_cast<llvm::PointerType>(t);
        return pt != nullptr ? pt->getAddressSpace() : 0;
    };
    if (unsigned s = space_of(inst.getType()); s != 0) return s;
    for (const llvm::Use& op : inst.operands())
        if (unsigned s = space_of(op->getType()); s != 0) return s;
    return std::nullopt;
}

/// The bytes an access touches at most (a masked vector op: the whole vector; a gather or
/// scatter: one element per lane), for rule sfi-access-size.
std::uint64_t access_bytes(const llvm::Instruction& inst, const llvm::DataLayout& dl) {
    auto fixed = [&](llvm::Type* t) -> std::uint64_t {
        auto size = dl.getTypeStoreSize(t);
        return size.isScalable() ? UINT64_MAX : size.getFixedValue();
    };
    if (const auto* load = llvm::dyn_cast<llvm::LoadInst>(&inst)) return fixed(load->getType());
    if (const auto* store = llvm::dyn_cast<llvm::StoreInst>(&inst)) return fixed(store->getValueOperand()->getType());
    if (const auto* rmw = llvm::dyn_cast<llvm::AtomicRMWInst>(&inst)) return fixed(rmw->getValOperand()->getType());
    if (const auto* cx = llvm::dyn_cast<llvm::AtomicCmpXchgInst>(&inst)) return fixed(cx->getNewValOperand()->getType());
    if (const auto* intrinsic = llvm::dyn_cast<llvm::IntrinsicInst>(&inst)) {
        switch (intrinsic->getIntrinsicID()) {
        case llvm::Intrinsic::masked_load:
        case llvm::Intrinsic::masked_expandload: return fixed(intrinsic->getType());
        case llvm::Intrinsic::masked_store:
        case llvm::Intrinsic::masked_compressstore: return fixed(intrinsic->getArgOperand(0)->getType());
        case llvm::Intrinsic::masked_gather: return fixed(intrinsic->getType()->getScalarType());
        case llvm::Intrinsic::masked_scatter: return fixed(intrinsic->getArgOperand(0)->getType()->getScalarType());
        default: return 0;
        }
    }
    return 0;
}

class FunctionConfiner {
public:
    FunctionConfiner(llvm::Function& f, SfiStats& stats) : f_(f), m_(*f.getParent()), dl_(m_.getDataLayout()), ctx_(m_.getContext()), stats_(stats) {}

    Result<void> run() {
        if (f_.isVarArg())
            return tl::make_unexpected(refuse(kRuleVarargs, fmt::format("function '{}'", f_.getName().str()),
                                              "variadic functions cannot be confined (va_arg reads the real stack)"));
        // A frame larger than a page (large safe allocas, many spills) could move the stack
        // pointer past the thread stack's guard page into other memory, where its unmasked
        // accesses would land: the prologue touches every page on its way down instead (as
        // clang's -fstack-clash-protection does), so it faults on the guard.
        f_.addFnAttr("probe-stack", "inline-asm");
        i64_ = llvm::Type::getInt64Ty(ctx_);
        ptr_ = llvm::PointerType::get(ctx_, 0);
        if (auto ok = copy_unsafe_byval(); !ok) return ok;

        // What to do, decided before anything changes.
        llvm::SmallVector<llvm::AllocaInst*, 8> moved, dynamic;
        llvm::SmallVector<Access, 32> accesses;
        llvm::SmallVector<llvm::MemIntrinsic*, 8> mem;
        llvm::SmallVector<llvm::CallBase*, 8> byval_calls;
        llvm::SmallVector<llvm::IntrinsicInst*, 4> saves, restores;
        for (auto& block : f_)
            for (auto& inst : block) {
                if (exempt_.contains(&inst)) continue;
                if (auto* alloca = llvm::dyn_cast<llvm::AllocaInst>(&inst)) {
                    if (!static_size(*alloca, dl_)) {
                        dynamic.push_back(alloca);
                    } else if (is_safe_alloca(*alloca, dl_)) {
                        ++stats_.allocas_safe;
                    } else {
                        moved.push_back(alloca);
                    }
                    continue;
                }
                if (auto space = other_address_space(inst))
                    return tl::make_unexpected(refuse(
                        kRuleAddressSpace, fmt::format("function '{}'", f_.getName().str()),
                        fmt::format("memory in address space {} (a segment register, not the arena) is not allowed", *space)));
                if (auto op = pointer_operand(inst)) {
                    if (access_bytes(inst, dl_) > kSfiMaxAccessBytes)
                        return tl::make_unexpected(refuse(
                            kRuleAccessSize, fmt::format("function '{}'", f_.getName().str()),
                            fmt::format("a single memory access is wider than {} bytes", kSfiMaxAccessBytes)));
                    if (is_safe_pointer(inst.getOperand(*op), dl_, &safe_cache_)) {
                        ++stats_.accesses_safe;
                    } else {
                        accesses.push_back({&inst, *op});
                    }
                    continue;
                }
                if (auto* mi = llvm::dyn_cast<llvm::MemIntrinsic>(&inst)) {
                    mem.push_back(mi);
                    continue;
                }
                if (auto* intrinsic = llvm::dyn_cast<llvm::IntrinsicInst>(&inst)) {
                    if (intrinsic->getIntrinsicID() == llvm::Intrinsic::stacksave) saves.push_back(intrinsic);
                    if (intrinsic->getIntrinsicID() == llvm::Intrinsic::stackrestore) restores.push_back(intrinsic);
                    continue;
                }
                if (auto* call = llvm::dyn_cast<llvm::CallBase>(&inst)) {
                    for (unsigned i = 0; i < call->arg_size(); ++i)
                        if (call->isByValArgument(i)) {
                            byval_calls.push_back(call);
                            break;
                        }
                }
            }

        // Lifetime markers of what moves go first (they would mark a pointer into the unsafe
        // stack, and one may be where the frame set-up is inserted).
        for (auto* a : moved) drop_lifetime_markers(a);
        for (auto* a : dynamic) drop_lifetime_markers(a);
        make_arena_values();
        if (!moved.empty() || !dynamic.empty() || !saves.empty() || !restores.empty())
            build_unsafe_frame(moved, dynamic, saves, restores);
        for (const Access& a : accesses) {
            llvm::IRBuilder<> b(a.inst);
            a.inst->setOperand(a.operand, confine(b, a.inst->getOperand(a.operand)));
            ++stats_.accesses_masked;
        }
        for (llvm::CallBase* call : byval_calls) {
            llvm::IRBuilder<> b(call);
            for (unsigned i = 0; i < call->arg_size(); ++i)
                if (call->isByValArgument(i)) {
                    call->setArgOperand(i, confine(b, call->getArgOperand(i)));
                    ++stats_.accesses_masked;
                }
        }
        for (llvm::MemIntrinsic* mi : mem) confine_mem_intrinsic(mi);
        return {};
    }

private:
    /// A byval parameter whose address escapes (or that is accessed out of its bounds) gets a
    /// copy in a fresh alloca, made at entry from the real stack (unmasked, inline); the alloca
    /// then goes to the unsafe stack like any other.
    Result<void> copy_unsafe_byval() {
        for (auto& arg : f_.args()) {
            if (!arg.hasByValAttr()) continue;
            llvm::Type* type = arg.getParamByValType();
            const std::uint64_t size = dl_.getTypeAllocSize(type).getFixedValue();
            if (is_safe_object(&arg, size, dl_)) continue;
            if (size > kSfiMaxAccessBytes)
                return tl::make_unexpected(refuse(kRuleAccessSize, fmt::format("function '{}'", f_.getName().str()),
                                                  fmt::format("a struct passed by value is larger than {} bytes", kSfiMaxAccessBytes)));
            llvm::IRBuilder<> b(&*f_.getEntryBlock().getFirstInsertionPt());
            const llvm::Align align = arg.getParamAlign().value_or(dl_.getABITypeAlign(type));
            auto* copy = b.CreateAlloca(type, nullptr, arg.getName() + ".sfi");
            copy->setAlignment(align);
            arg.replaceAllUsesWith(copy);
            auto* memcpy = b.CreateMemCpyInline(copy, align, &arg, align, b.getInt64(size));
            exempt_.insert(memcpy);
            ++stats_.byval_copied;
        }
        return {};
    }

    /// Static allocas first in the entry block (the frame set-up below splits it, and an
    /// alloca left behind would become a dynamic one on the real stack); then base and mask,
    /// once per function. freeze keeps code generation from sinking them into every block
    /// (a GOT load each). Returns where the function's own code begins.
    void make_arena_values() {
        auto& entry = f_.getEntryBlock();
        llvm::SmallVector<llvm::AllocaInst*, 8> statics;
        for (auto& inst : entry)
            if (auto* a = llvm::dyn_cast<llvm::AllocaInst>(&inst); a && a->isStaticAlloca()) statics.push_back(a);
        llvm::Instruction* top = &*entry.getFirstInsertionPt();
        for (auto* a : statics)
            if (a != top) a->moveBefore(top);
            else top = top->getNextNode();
        llvm::BasicBlock::iterator code = entry.getFirstInsertionPt();
        while (llvm::isa<llvm::AllocaInst>(*code) && llvm::cast<llvm::AllocaInst>(*code).isStaticAlloca()) ++code;
        llvm::IRBuilder<llvm::NoFolder> b(&entry, code);
        base_ = b.CreateFreeze(b.CreatePtrToInt(arena_symbol(kArenaBaseSymbol), i64_, "sfi.base.addr"), "sfi.base");
        mask_ = b.CreateFreeze(b.CreatePtrToInt(arena_symbol(kArenaMaskSymbol), i64_, "sfi.mask.addr"), "sfi.mask");
        first_ = llvm::cast<llvm::Instruction>(mask_)->getNextNode();
    }

    llvm::GlobalVariable* arena_symbol(const char* name) {
        if (auto* g = m_.getNamedGlobal(name)) return g;
        // External, not dso_local: PIC code reaches it through the GOT, whose entry holds the
        // absolute symbol's address, which is its value.
        auto* g = new llvm::GlobalVariable(m_, llvm::Type::getInt8Ty(ctx_), true, llvm::GlobalValue::ExternalLinkage,
                                           nullptr, name);
        g->setDSOLocal(false);
        return g;
    }

    /// base + (p & mask): the same address when p is in the arena, somewhere in it otherwise.
    llvm::Value* confine(llvm::IRBuilder<>& b, llvm::Value* p) {
        llvm::Type* t = p->getType();
        if (auto* vt = llvm::dyn_cast<llvm::VectorType>(t)) {
            auto count = vt->getElementCount();
            auto* ints = b.CreatePtrToInt(p, llvm::VectorType::get(i64_, count));
            auto* masked = b.CreateAnd(ints, b.CreateVectorSplat(count, mask_));
            return b.CreateIntToPtr(b.CreateAdd(b.CreateVectorSplat(count, base_), masked), t, "sfi.ptrs");
        }
        auto* masked = b.CreateAnd(b.CreatePtrToInt(p, i64_), mask_);
        return b.CreateIntToPtr(b.CreateAdd(base_, masked), t, "sfi.ptr");
    }

    void confine_mem_intrinsic(llvm::MemIntrinsic* mi) {
        llvm::IRBuilder<> b(mi);
        auto* length = llvm::dyn_cast<llvm::ConstantInt>(mi->getLength());
        if (length != nullptr && length->getZExtValue() <= kSfiInlineMemBytes) {
            mi->setDest(confine(b, mi->getRawDest()));
            if (auto* transfer = llvm::dyn_cast<llvm::MemTransferInst>(mi)) transfer->setSource(confine(b, transfer->getRawSource()));
            ++stats_.mem_inline;
            return;
        }
        // A call of the agent's checked function; volatile has no meaning left for a call.
        llvm::Value* n = b.CreateZExtOrTrunc(mi->getLength(), i64_);
        llvm::Value* dest = confine(b, mi->getRawDest());
        if (auto* set = llvm::dyn_cast<llvm::MemSetInst>(mi)) {
            auto fn = m_.getOrInsertFunction("memset", llvm::FunctionType::get(ptr_, {ptr_, b.getInt32Ty(), i64_}, false));
            b.CreateCall(fn, {dest, b.CreateZExt(set->getValue(), b.getInt32Ty()), n});
        } else {
            auto* transfer = llvm::cast<llvm::MemTransferInst>(mi);
            const char* name = llvm::isa<llvm::MemMoveInst>(mi) ? "memmove" : "memcpy";
            auto fn = m_.getOrInsertFunction(name, llvm::FunctionType::get(ptr_, {ptr_, ptr_, i64_}, false));
            b.CreateCall(fn, {dest, confine(b, transfer->getRawSource()), n});
        }
        mi->eraseFromParent();
        ++stats_.mem_calls;
    }

    /// The unsafe-stack frame: entry moves sp down by the moved allocas (aligned), checking
    /// the limit; dynamic allocas bump it further; every return puts the entry sp back.
    void build_unsafe_frame(llvm::ArrayRef<llvm::AllocaInst*> moved, llvm::ArrayRef<llvm::AllocaInst*> dynamic,
                            llvm::ArrayRef<llvm::IntrinsicInst*> saves, llvm::ArrayRef<llvm::IntrinsicInst*> restores) {
        ++stats_.unsafe_frames;
        auto stack_fn = m_.getOrInsertFunction(kUnsafeStackSymbol, llvm::FunctionType::get(ptr_, false));
        if (auto* fn = llvm::dyn_cast<llvm::Function>(stack_fn.getCallee())) fn->setDoesNotThrow();
        overflow_ = m_.getOrInsertFunction(kStackOverflowSymbol, llvm::FunctionType::get(llvm::Type::getVoidTy(ctx_), false));
        if (auto* fn = llvm::dyn_cast<llvm::Function>(overflow_.getCallee())) {
            fn->setDoesNotReturn();
            fn->setDoesNotThrow();
        }

        llvm::IRBuilder<> b(first_);
        us_ = b.CreateCall(stack_fn, {}, "sfi.us");
        auto* sp = exempt(b.CreateLoad(ptr_, us_, "sfi.sp"));
        entry_sp_ = sp;

        // Frame layout: the moved allocas at increasing offsets from the new sp.
        std::uint64_t size = 0;
        std::uint64_t align = kFrameAlign;
        llvm::SmallVector<std::uint64_t, 8> offsets;
        for (auto* a : moved) {
            const std::uint64_t a_align = std::max<std::uint64_t>(a->getAlign().value(), 1);
            size = llvm::alignTo(size, a_align);
            offsets.push_back(size);
            size += *static_size(*a, dl_);
            align = std::max(align, a_align);
        }
        size = llvm::alignTo(size, kFrameAlign);
        if (size > 0) {
            llvm::Value* frame = bump(b, sp, b.getInt64(size), align);
            for (std::size_t i = 0; i < moved.size(); ++i) {
                auto* a = moved[i];
                llvm::Value* slot = b.CreateGEP(b.getInt8Ty(), frame, b.getInt64(offsets[i]), a->getName() + ".unsafe");
                a->replaceAllUsesWith(slot);
                a->eraseFromParent();
                ++stats_.allocas_moved;
            }
        }
        for (auto* a : dynamic) {
            llvm::IRBuilder<> here(a);
            auto* count = here.CreateZExtOrTrunc(a->getArraySize(), i64_);
            auto* bytes = here.CreateMul(count, here.getInt64(dl_.getTypeAllocSize(a->getAllocatedType()).getFixedValue()));
            auto* cur = exempt(here.CreateLoad(ptr_, us_, "sfi.sp"));
            llvm::Value* p = bump(here, cur, bytes, std::max<std::uint64_t>(a->getAlign().value(), kFrameAlign));
            p->takeName(a);
            a->replaceAllUsesWith(p);
            a->eraseFromParent();
            ++stats_.allocas_dynamic;
        }
        for (auto* s : saves) {
            llvm::IRBuilder<> here(s);
            auto* cur = exempt(here.CreateLoad(ptr_, us_, "sfi.saved"));
            s->replaceAllUsesWith(cur);
            s->eraseFromParent();
        }
        for (auto* r : restores) {
            // Only back up within this function's own frame: clamp to [limit, entry sp].
            llvm::IRBuilder<> here(r);
            auto* limit = exempt(here.CreateLoad(ptr_, limit_slot(here), "sfi.limit"));
            auto* want = here.CreatePtrToInt(r->getArgOperand(0), i64_);
            auto* lo = here.CreateBinaryIntrinsic(llvm::Intrinsic::umax, want, here.CreatePtrToInt(limit, i64_));
            auto* clamped = here.CreateBinaryIntrinsic(llvm::Intrinsic::umin, lo, here.CreatePtrToInt(entry_sp_, i64_));
            exempt(here.CreateStore(here.CreateIntToPtr(clamped, ptr_), us_));
            r->eraseFromParent();
        }
        // Every way out puts the caller's sp back (kernels do not unwind: no personality).
        llvm::SmallVector<llvm::Instruction*, 8> exits;
        for (auto& block : f_) {
            auto* term = block.getTerminator();
            if (llvm::isa<llvm::ReturnInst>(term)) {
                auto* before = term;
                if (auto* call = llvm::dyn_cast_or_null<llvm::CallInst>(term->getPrevNode()); call && call->isMustTailCall())
                    before = call;
                exits.push_back(before);
            }
        }
        for (auto* at : exits) {
            llvm::IRBuilder<> here(at);
            exempt(here.CreateStore(entry_sp_, us_));
        }
    }

    llvm::Value* limit_slot(llvm::IRBuilder<>& b) {
        return b.CreateConstInBoundsGEP1_64(b.getInt8Ty(), us_, offsetof(UnsafeStack, limit), "sfi.limit.slot");
    }

    /// sp - bytes, aligned down to `align`; calls the overflow handler when that passes the
    /// limit (or wraps), else stores it as the new sp. Leaves `b` after the store.
    llvm::Value* bump(llvm::IRBuilder<>& b, llvm::Value* sp, llvm::Value* bytes, std::uint64_t align) {
        auto* limit = exempt(b.CreateLoad(ptr_, limit_slot(b), "sfi.limit"));
        auto* sp_int = b.CreatePtrToInt(sp, i64_);
        auto* limit_int = b.CreatePtrToInt(limit, i64_);
        auto* next = b.CreateAnd(b.CreateSub(sp_int, bytes), b.getInt64(~(align - 1)));
        llvm::Value* over = b.CreateICmpULT(next, limit_int, "sfi.overflow");
        // A frame of constant size (below 2 GiB) cannot wrap around from an sp in the arena;
        // a dynamic size can, so it is also compared with the room left.
        auto* constant = llvm::dyn_cast<llvm::ConstantInt>(bytes);
        if (constant == nullptr || constant->getZExtValue() >= (std::uint64_t{1} << 31))
            over = b.CreateOr(b.CreateICmpUGT(bytes, b.CreateSub(sp_int, limit_int)), over, "sfi.overflow");
        llvm::Instruction* at = &*b.GetInsertPoint();
        llvm::Instruction* fail = llvm::SplitBlockAndInsertIfThen(over, at, /*Unreachable=*/true);
        llvm::IRBuilder<> stop(fail);
        stop.CreateCall(overflow_)->setDoesNotReturn();
        b.SetInsertPoint(at);
        auto* p = b.CreateIntToPtr(next, ptr_, "sfi.frame");
        exempt(b.CreateStore(p, us_));
        return p;
    }

    void drop_lifetime_markers(llvm::AllocaInst* a) {
        llvm::SmallVector<llvm::Instruction*, 4> dead;
        for (auto* user : a->users())
            if (auto* intrinsic = llvm::dyn_cast<llvm::IntrinsicInst>(user); intrinsic && intrinsic->isLifetimeStartOrEnd())
                dead.push_back(intrinsic);
        for (auto* i : dead) i->eraseFromParent();
    }

    template <class T> T* exempt(T* inst) {
        exempt_.insert(inst);
        return inst;
    }

    llvm::Function& f_;
    llvm::Module& m_;
    const llvm::DataLayout& dl_;
    llvm::LLVMContext& ctx_;
    SfiStats& stats_;
    llvm::Type* i64_ = nullptr;
    llvm::PointerType* ptr_ = nullptr;
    llvm::Value* base_ = nullptr;
    llvm::Value* mask_ = nullptr;
    llvm::Instruction* first_ = nullptr;
    llvm::Value* us_ = nullptr;
    llvm::Value* entry_sp_ = nullptr;
    llvm::FunctionCallee overflow_;
    llvm::SmallPtrSet<llvm::Instruction*, 16> exempt_;
    llvm::DenseMap<const llvm::Value*, bool> safe_cache_;
};

// ---- the checker ----

bool is_arena_value(const llvm::Value* v, const char* symbol) {
    if (const auto* freeze = llvm::dyn_cast<llvm::FreezeInst>(v)) v = freeze->getOperand(0);
    if (const auto* cast = llvm::dyn_cast<llvm::PtrToIntOperator>(v)) v = cast->getPointerOperand();
    const auto* g = llvm::dyn_cast<llvm::GlobalVariable>(v);
    return g != nullptr && g->getName() == symbol && g->isDeclaration();
}

const llvm::Value* unsplat(const llvm::Value* v) {
    if (v->getType()->isVectorTy())
        if (const llvm::Value* s = llvm::getSplatValue(v)) return s;
    return v;
}

bool is_confined_pointer(const llvm::Value* p) {
    const auto* cast = llvm::dyn_cast<llvm::IntToPtrInst>(p);
    if (cast == nullptr) return false;
    const auto* add = llvm::dyn_cast<llvm::BinaryOperator>(cast->getOperand(0));
    if (add == nullptr || add->getOpcode() != llvm::Instruction::Add) return false;
    for (unsigned i = 0; i < 2; ++i) {
        if (!is_arena_value(unsplat(add->getOperand(i)), kArenaBaseSymbol)) continue;
        const auto* masked = llvm::dyn_cast<llvm::BinaryOperator>(add->getOperand(1 - i));
        if (masked == nullptr || masked->getOpcode() != llvm::Instruction::And) return false;
        return is_arena_value(unsplat(masked->getOperand(0)), kArenaMaskSymbol) ||
               is_arena_value(unsplat(masked->getOperand(1)), kArenaMaskSymbol);
    }
    return false;
}

bool is_unsafe_stack_slot(const llvm::Value* p) {
    p = p->stripInBoundsConstantOffsets();
    const auto* call = llvm::dyn_cast<llvm::CallInst>(p);
    const auto* fn = call != nullptr ? call->getCalledFunction() : nullptr;
    return fn != nullptr && fn->getName() == kUnsafeStackSymbol;
}

} // namespace

Result<SfiStats> confine_memory(llvm::Module& module) {
    // The sandbox's own symbols are the pass's to use: shipped code that names them (the agent
    // exports them in this mode) is refused, so every use of them below is the pass's.
    for (const char* name : {kArenaBaseSymbol, kArenaMaskSymbol, kUnsafeStackSymbol, kStackOverflowSymbol})
        if (module.getNamedValue(name) != nullptr)
            return tl::make_unexpected(refuse(kRuleReserved, fmt::format("'{}'", name),
                                              "the sandbox's own symbols may not be used by shipped code"));
    SfiStats stats;
    for (auto& f : module) {
        if (f.isDeclaration()) continue;
        FunctionConfiner confiner(f, stats);
        if (auto ok = confiner.run(); !ok) return tl::make_unexpected(ok.error());
    }
    return stats;
}

std::vector<std::string> unconfined_accesses(const llvm::Module& module) {
    std::vector<std::string> out;
    const auto& dl = module.getDataLayout();
    for (const auto& f : module)
        for (const auto& block : f)
            for (const auto& inst : block) {
                std::vector<const llvm::Value*> pointers;
                if (auto op = pointer_operand(inst)) {
                    pointers.push_back(inst.getOperand(*op));
                } else if (const auto* mi = llvm::dyn_cast<llvm::MemIntrinsic>(&inst)) {
                    pointers.push_back(mi->getRawDest());
                    if (const auto* t = llvm::dyn_cast<llvm::MemTransferInst>(mi)) pointers.push_back(t->getRawSource());
                } else if (const auto* call = llvm::dyn_cast<llvm::CallBase>(&inst)) {
                    for (unsigned i = 0; i < call->arg_size(); ++i)
                        if (call->isByValArgument(i)) pointers.push_back(call->getArgOperand(i));
                }
                for (const llvm::Value* p : pointers) {
                    if (is_confined_pointer(p) || is_safe_pointer(p, dl) || is_unsafe_stack_slot(p)) continue;
                    // The pass's entry copy of a byval parameter that is not safe: from the
                    // parameter (the caller's copy, on the real stack) to its unsafe-stack slot.
                    if (const auto* copy = llvm::dyn_cast<llvm::MemCpyInlineInst>(&inst)) {
                        const auto* arg = llvm::dyn_cast<llvm::Argument>(copy->getRawSource());
                        if (arg != nullptr && arg->hasByValAttr()) break;
                    }
                    std::string text;
                    llvm::raw_string_ostream os(text);
                    inst.print(os);
                    out.push_back(fmt::format("function '{}': {}", f.getName().str(), os.str()));
                }
            }
    return out;
}

} // namespace bitship::jit

namespace bitship::jit {

std::string_view to_string(Sandbox mode) {
    switch (mode) {
    case Sandbox::none: return "none";
    case Sandbox::sfi: return "sfi";
    }
    return "unknown";
}

} // namespace bitship::jit
