#pragma once
// Host retargeting and the optimisation pipeline, run on a kernel's module before it is handed
// to the JIT (so the time is ours to measure, and independent modules optimise in parallel).
// Private to jit/.

namespace llvm {
class Module;
class TargetMachine;
} // namespace llvm

namespace bitship::jit {

struct HostInfo;

/// Makes `module` code for this host: every defined function gets the host's target-cpu,
/// tune-cpu and target-features (whatever CPU baseline the client compiled for), and the
/// module takes `tm`'s triple and data layout.
void retarget(llvm::Module& module, const llvm::TargetMachine& tm, const HostInfo& host);

/// The new pass manager's default per-module pipeline at `opt_level` (1..3; 0 does nothing).
/// `tm` supplies the target's cost model; it must not be used by another thread meanwhile.
void optimise(llvm::Module& module, llvm::TargetMachine& tm, unsigned opt_level);

} // namespace bitship::jit
