# bitship_add_kernels(TARGET name SOURCES a.c b.c [ARCHS x86_64 aarch64 nvptx64] [NAMESPACE ns]
#                     [INCLUDE_DIRECTORIES dirs...] [COMPILE_OPTIONS opts...])
#
# Compiles each kernel source with clang (the same major version as the agents' LLVM, or older)
# to one LLVM bitcode slice per architecture, packs the slices into a bundle, and makes a static
# library `name` that embeds it. Its header <name.hpp> declares, in namespace `ns` (default
# `name`), one `bitship::Kernel` per kernel entry point and `bundle()`.
#
# The bundle file itself is left at ${CMAKE_CURRENT_BINARY_DIR}/bitship_kernels/name/name.bundle.

# Override with -DBITSHIP_KERNEL_CLANG=... to build kernels with another (same or older) clang.
find_program(BITSHIP_KERNEL_CLANG NAMES clang-19 clang DOC "clang used to compile kernels to bitcode" REQUIRED)
find_program(BITSHIP_KERNEL_NM NAMES llvm-nm-19 llvm-nm HINTS /usr/lib/llvm-19/bin DOC "llvm-nm listing entry points" REQUIRED)
find_program(BITSHIP_KERNEL_LINK NAMES llvm-link-19 llvm-link HINTS /usr/lib/llvm-19/bin REQUIRED)

execute_process(COMMAND ${BITSHIP_KERNEL_CLANG} --version OUTPUT_VARIABLE _bs_clang_version_text)
string(REGEX MATCH "clang version ([0-9]+\\.[0-9]+\\.[0-9]+)" _ "${_bs_clang_version_text}")
set(BITSHIP_KERNEL_CLANG_VERSION "${CMAKE_MATCH_1}" CACHE INTERNAL "")
if(NOT BITSHIP_KERNEL_CLANG_VERSION)
  message(FATAL_ERROR "bitship: cannot read the version of ${BITSHIP_KERNEL_CLANG}")
endif()

execute_process(COMMAND ${BITSHIP_KERNEL_CLANG} -print-resource-dir OUTPUT_VARIABLE BITSHIP_KERNEL_CLANG_RESOURCE_DIR
                OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT DEFINED BITSHIP_KERNEL_INCLUDE_DIR)
  set(BITSHIP_KERNEL_INCLUDE_DIR "${CMAKE_CURRENT_LIST_DIR}/../include")
endif()

# The nvptx64 slice's front-end flags (see _bitship_arch_triple); tests compile with them too.
set(BITSHIP_NVPTX_KERNEL_FLAGS -ffreestanding -Werror=ignored-attributes -Werror=unknown-attributes
    -Werror=missing-prototypes)

# Each architecture's triple and CPU baseline: what the front end may assume of the machine
# (predefined __ARM_FEATURE_* macros, which intrinsics a kernel may call). The agent rewrites
# target-cpu and target-features to its own CPU before code generation, so the baseline is a
# floor for the source, not the code's tuning.
#
# aarch64 is the DPU class: BlueField-3's Cortex-A78AE cores are Armv8.2-A (+crypto, dotprod,
# fp16, rcpc); BlueField-2's Cortex-A72 cores are Armv8.0-A + CRC + crypto. The baseline is
# Armv8.2-A + crypto (AES, SHA-2) and no optional v8.2 extension: the BlueField-3 ISA level,
# without dotprod/fp16/rcpc, which BlueField-2 lacks. What v8.1/v8.2 adds beyond that (LSE
# atomics, RDM) is chosen in the back end from the agent's own features, so a kernel that calls
# no v8.1/v8.2-only intrinsic runs on both generations. x86_64 stays at clang's x86-64 default.
function(_bitship_arch_triple arch out_triple out_cpu out_flags)
  if(arch STREQUAL "x86_64")
    set(${out_triple} "x86_64-unknown-linux-gnu" PARENT_SCOPE)
    set(${out_cpu} "x86-64" PARENT_SCOPE)
    set(${out_flags} "" PARENT_SCOPE)
  elseif(arch STREQUAL "aarch64")
    set(${out_triple} "aarch64-unknown-linux-gnu" PARENT_SCOPE)
    set(${out_cpu} "armv8.2-a+crypto" PARENT_SCOPE)
    set(${out_flags} "-march=armv8.2-a+crypto" PARENT_SCOPE)
  elseif(arch STREQUAL "nvptx64")
    # NVIDIA GPUs: plain C (not CUDA) for nvptx64, kernels written with <bitship/gpu_kernel.h>.
    # The bitcode carries no target-cpu; sm_52 is clang 19's default for nvptx and only names
    # the floor. The agent emits PTX for its own GPU (sm_min(cc, 90)). A kernel that lost its
    # attribute must not become a silent .func: the attribute ignored or misspelt is an error,
    # and so is any non-static definition that did not come through BS_GPU_KERNEL (it declares
    # the kernel first; -Wmissing-prototypes catches a plain definition).
    set(${out_triple} "nvptx64-nvidia-cuda" PARENT_SCOPE)
    set(${out_cpu} "sm_52" PARENT_SCOPE)
    set(${out_flags} ${BITSHIP_NVPTX_KERNEL_FLAGS} PARENT_SCOPE)
  else()
    message(FATAL_ERROR "bitship_add_kernels: architecture '${arch}' is not supported yet (x86_64, aarch64, nvptx64)")
  endif()
endfunction()

function(bitship_add_kernels)
  cmake_parse_arguments(K "" "TARGET;NAMESPACE" "SOURCES;ARCHS;INCLUDE_DIRECTORIES;COMPILE_OPTIONS" ${ARGN})
  if(NOT K_TARGET OR NOT K_SOURCES)
    message(FATAL_ERROR "bitship_add_kernels: TARGET and SOURCES are required")
  endif()
  if(NOT K_ARCHS)
    set(K_ARCHS ${CMAKE_SYSTEM_PROCESSOR})
  endif()
  if(NOT K_NAMESPACE)
    set(K_NAMESPACE ${K_TARGET})
  endif()
  if(TARGET bitship-bundle)
    set(_tool $<TARGET_FILE:bitship-bundle>)
  else()
    set(_tool $<TARGET_FILE:bitship::bitship-bundle>)
  endif()

  set(_out "${CMAKE_CURRENT_BINARY_DIR}/bitship_kernels/${K_TARGET}")
  set(_slice_args)
  set(_slice_files)
  set(_includes)
  foreach(dir IN LISTS K_INCLUDE_DIRECTORIES)
    list(APPEND _includes "-I${dir}")
  endforeach()
  foreach(arch IN LISTS K_ARCHS)
    _bitship_arch_triple(${arch} _triple _cpu _baseline)
    # Another architecture's slice needs that architecture's C headers: Debian's cross libc
    # (libc6-dev-arm64-cross) when installed, else freestanding (kernel.h alone still works).
    set(_arch_flags ${_baseline})
    if(NOT arch STREQUAL "nvptx64") # the GPU has no stack protector to turn off
      list(APPEND _arch_flags -fno-stack-protector)
    endif()
    if(NOT arch STREQUAL CMAKE_SYSTEM_PROCESSOR AND NOT arch STREQUAL "nvptx64")
      if(EXISTS "/usr/${arch}-linux-gnu/include")
        list(APPEND _arch_flags -nostdinc -isystem ${BITSHIP_KERNEL_CLANG_RESOURCE_DIR}/include
                        -isystem /usr/${arch}-linux-gnu/include)
      else()
        list(APPEND _arch_flags -ffreestanding)
      endif()
    endif()
    set(_arch_bcs)
    foreach(src IN LISTS K_SOURCES)
      get_filename_component(_abs "${src}" ABSOLUTE)
      get_filename_component(_stem "${src}" NAME_WE)
      set(_bc "${_out}/${arch}/${_stem}.bc")
      add_custom_command(OUTPUT "${_bc}"
        COMMAND ${CMAKE_COMMAND} -E make_directory "${_out}/${arch}"
        COMMAND ${BITSHIP_KERNEL_CLANG} --target=${_triple} -O2 -emit-llvm -c -fno-exceptions ${_arch_flags} -I${BITSHIP_KERNEL_INCLUDE_DIR} ${_includes} ${K_COMPILE_OPTIONS}
                -o "${_bc}" "${_abs}"
        DEPENDS "${_abs}" "${BITSHIP_KERNEL_INCLUDE_DIR}/bitship/kernel.h"
                "${BITSHIP_KERNEL_INCLUDE_DIR}/bitship/gpu_kernel.h"
        COMMENT "bitship: kernel ${src} -> ${arch} bitcode"
        VERBATIM)
      list(APPEND _arch_bcs "${_bc}")
    endforeach()
    set(_linked "${_out}/${arch}.bc")
    add_custom_command(OUTPUT "${_linked}"
      COMMAND ${BITSHIP_KERNEL_LINK} -o "${_linked}" ${_arch_bcs}
      DEPENDS ${_arch_bcs}
      COMMENT "bitship: link ${K_TARGET} ${arch} slice"
      VERBATIM)
    list(APPEND _slice_args --slice "${_triple}:${_cpu}:${BITSHIP_KERNEL_CLANG_VERSION}:${_linked}")
    list(APPEND _slice_files "${_linked}")
  endforeach()

  add_custom_command(
    OUTPUT "${_out}/${K_TARGET}.bundle" "${_out}/${K_TARGET}_bundle.cpp" "${_out}/include/${K_TARGET}.hpp"
    COMMAND ${CMAKE_COMMAND} -E make_directory "${_out}/include"
    COMMAND ${_tool} --name ${K_TARGET} --namespace ${K_NAMESPACE} --nm ${BITSHIP_KERNEL_NM}
            ${_slice_args} --out-bundle "${_out}/${K_TARGET}.bundle"
            --out-cpp "${_out}/${K_TARGET}_bundle.cpp" --out-hpp "${_out}/include/${K_TARGET}.hpp"
    DEPENDS ${_slice_files} ${_tool}
    COMMENT "bitship: pack bundle ${K_TARGET} (${K_ARCHS})"
    VERBATIM)
  add_library(${K_TARGET} STATIC "${_out}/${K_TARGET}_bundle.cpp")
  target_include_directories(${K_TARGET} PUBLIC "${_out}/include")
  target_link_libraries(${K_TARGET} PUBLIC bitship::core)
  set_target_properties(${K_TARGET} PROPERTIES BITSHIP_BUNDLE_FILE "${_out}/${K_TARGET}.bundle")
endfunction()
