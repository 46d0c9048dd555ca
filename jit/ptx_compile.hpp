#pragma once
// An nvptx64 bundle slice → PTX text for one GPU architecture, in this process, with LLVM's
// NVPTX back end: libdevice linked lazily, everything but the kernels internalized, NVVMReflect,
// O3, PTX for sm_min(sm, 90) at LLVM's default PTX version. No LLVM type here. Private to jit/.

#include <cstddef>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include <bitship/errc.hpp>

namespace bitship::jit {

/// The highest sm_XX LLVM 19's NVPTX back end knows; newer GPUs get PTX for this one (the driver
/// compiles PTX forward).
inline constexpr unsigned kMaxPtxSm = 90;
/// The lowest it knows (Fermi); today's CUDA drivers run nothing older than sm_50 anyway.
inline constexpr unsigned kMinPtxSm = 20;

/// Compiles nvptx64 LLVM bitcode (one slice, as bitship_add_kernels builds it) to PTX for
/// `sm_<min(sm, kMaxPtxSm)>` (`sm` is the compute capability as major*10 + minor, e.g. 90).
/// Links what the module calls from `libdevice` (the bytes of libdevice.10.bc, read_libdevice();
/// may be empty when the module calls nothing of it), keeps only the kernels external, runs
/// NVVMReflect and the O3 pipeline, and returns the PTX text (no trailing NUL). Reads no file, so
/// a confined compiler process runs it. Errors: invalid_bitcode when the bitcode does not parse
/// or verify, or is not for nvptx64; no_device when libdevice is needed but empty;
/// compile_failed (naming what failed) when linking, a kernel-less module, an unresolved call or
/// code generation fails. Thread-safe.
Result<std::string> compile_to_ptx(std::span<const std::byte> bitcode, unsigned sm, std::span<const std::byte> libdevice);

/// The same with libdevice read from the file `libdevice` (find_libdevice(); empty: none).
Result<std::string> compile_to_ptx(std::span<const std::byte> bitcode, unsigned sm,
                                   const std::filesystem::path& libdevice);

/// The bytes of the libdevice file at `path`; none when `path` is empty. no_device naming the
/// path when it cannot be read.
Result<std::vector<std::byte>> read_libdevice(const std::filesystem::path& path);

/// Registers LLVM's NVPTX target (once per process): a compiler process does it before it
/// confines itself, with the rest of LLVM's set-up.
void init_ptx_target();

/// Where libdevice is: $CUDA_HOME then $CUDA_PATH (each + nvvm/libdevice/libdevice.10.bc), then
/// /usr/local/cuda/nvvm/libdevice/libdevice.10.bc; the first that exists. Empty when none does.
std::filesystem::path find_libdevice();

} // namespace bitship::jit
