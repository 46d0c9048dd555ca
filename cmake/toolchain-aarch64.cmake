# Cross-builds xagent for aarch64 Linux (BlueField DPUs' Arm cores) on an x86-64 Debian 12 host:
#   bash scripts/setup.sh --with-aarch64 && cmake --preset aarch64 && cmake --build --preset aarch64
#
# Debian's cross compilers (crossbuild-essential-arm64) and the arm64 multiarch libraries
# (libucx-dev:arm64, libllvm19:arm64, ... under /usr/lib/aarch64-linux-gnu) installed beside the
# amd64 ones. LLVM's headers are the amd64 llvm-19-dev ones (llvm-19-dev:arm64 cannot be
# installed beside them) with an arm64 llvm-config.h in front: see cmake/BitshipCrossLLVM.cmake.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)

# Libraries and packages from the arm64 multiarch directories only; programs (clang-19 for
# kernels, pkg-config) from the build machine.
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(ENV{PKG_CONFIG_LIBDIR} "/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig")
set(ENV{PKG_CONFIG_PATH} "")

# The arm64 libLLVM from libllvm19:arm64, linked as an imported target (BitshipCrossLLVM).
set(BITSHIP_CROSS_LLVM_LIBRARY /usr/lib/aarch64-linux-gnu/libLLVM-19.so CACHE FILEPATH "the target's libLLVM")
set(BITSHIP_CROSS_LLVM_TRIPLE aarch64-unknown-linux-gnu CACHE STRING "the target's LLVM triple")
set(BITSHIP_CROSS_LLVM_NATIVE_ARCH AArch64 CACHE STRING "LLVM's name for the target's native back end")

# Programs built here run on a build machine through qemu-user (binfmt); no QEMU_LD_PREFIX:
# the arm64 loader and libc come from libc6:arm64, and mixing in the cross libc hangs threads.
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64-static)
