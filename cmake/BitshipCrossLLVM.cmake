# LLVM for a cross build, when the target's LLVM development package cannot be installed here.
#
# Debian's llvm-19-dev:arm64 conflicts with the amd64 llvm-19-dev (it would remove clang-19), but
# libllvm19:arm64 (the shared library alone) installs beside it. LLVM's headers are the same on
# both architectures except llvm/Config/llvm-config.h, which names the host and default triples
# and the native back end (LLVM_NATIVE_TARGET & co., what InitializeNativeTarget() calls). So the
# build uses the build machine's headers with a generated llvm-config.h for the target placed in
# front, and links the target's libLLVM as an imported library.
#
# In:  BITSHIP_CROSS_LLVM_LIBRARY, BITSHIP_CROSS_LLVM_TRIPLE, BITSHIP_CROSS_LLVM_NATIVE_ARCH
#      (set by the toolchain file); BITSHIP_CROSS_LLVM_HEADERS (default /usr/lib/llvm-19/include).
# Out: the imported target LLVM, LLVM_INCLUDE_DIRS, LLVM_DEFINITIONS, LLVM_VERSION_MAJOR,
#      LLVM_PACKAGE_VERSION, LLVM_DIR (what find_package(LLVM) would give jit/).
set(BITSHIP_CROSS_LLVM_HEADERS /usr/lib/llvm-19/include CACHE PATH "LLVM headers of the build machine (llvm-19-dev)")
foreach(var BITSHIP_CROSS_LLVM_LIBRARY BITSHIP_CROSS_LLVM_TRIPLE BITSHIP_CROSS_LLVM_NATIVE_ARCH)
  if(NOT ${var})
    message(FATAL_ERROR "bitship: cross build without ${var}: configure with a toolchain file such as cmake/toolchain-aarch64.cmake")
  endif()
endforeach()
set(_host_config "${BITSHIP_CROSS_LLVM_HEADERS}/llvm/Config/llvm-config.h")
if(NOT EXISTS "${_host_config}")
  message(FATAL_ERROR "bitship: no LLVM headers at ${BITSHIP_CROSS_LLVM_HEADERS} (run scripts/setup.sh)")
endif()
if(NOT EXISTS "${BITSHIP_CROSS_LLVM_LIBRARY}")
  message(FATAL_ERROR "bitship: no ${CMAKE_SYSTEM_PROCESSOR} libLLVM at ${BITSHIP_CROSS_LLVM_LIBRARY} (run scripts/setup.sh --with-${CMAKE_SYSTEM_PROCESSOR})")
endif()

file(READ "${_host_config}" _config)
string(REGEX MATCH "#define LLVM_VERSION_STRING \"([0-9.]+)[^\"]*\"" _ "${_config}")
set(LLVM_PACKAGE_VERSION "${CMAKE_MATCH_1}")
string(REGEX MATCH "#define LLVM_NATIVE_ARCH ([A-Za-z0-9_]+)" _ "${_config}")
set(_host_arch "${CMAKE_MATCH_1}")
string(REGEX MATCH "#define LLVM_HOST_TRIPLE \"([^\"]+)\"" _ "${_config}")
set(_host_triple "${CMAKE_MATCH_1}")
if(NOT LLVM_PACKAGE_VERSION OR NOT _host_arch OR NOT _host_triple)
  message(FATAL_ERROR "bitship: ${_host_config} does not look like LLVM's llvm-config.h")
endif()
string(REPLACE "." ";" _parts "${LLVM_PACKAGE_VERSION}")
list(GET _parts 0 LLVM_VERSION_MAJOR)
list(GET _parts 1 _minor)

# The headers and the library must come from the same LLVM release: libLLVM.so.MAJOR.MINOR.
get_filename_component(_lib_real "${BITSHIP_CROSS_LLVM_LIBRARY}" REALPATH)
get_filename_component(_lib_name "${_lib_real}" NAME)
if(NOT _lib_name MATCHES "\\.so\\.${LLVM_VERSION_MAJOR}\\.${_minor}$")
  message(FATAL_ERROR "bitship: ${_lib_real} is not LLVM ${LLVM_VERSION_MAJOR}.${_minor}, the release of the headers in ${BITSHIP_CROSS_LLVM_HEADERS}")
endif()

# Only the triples and the native back end differ; each replacement must have hit.
set(_overlay "${CMAKE_BINARY_DIR}/llvm-cross-overlay")
set(_generated "${_config}")
string(REPLACE "\"${_host_triple}\"" "\"${BITSHIP_CROSS_LLVM_TRIPLE}\"" _generated "${_generated}")
string(REGEX REPLACE "LLVMInitialize${_host_arch}([A-Za-z]+)" "LLVMInitialize${BITSHIP_CROSS_LLVM_NATIVE_ARCH}\\1" _generated "${_generated}")
string(REPLACE "#define LLVM_NATIVE_ARCH ${_host_arch}" "#define LLVM_NATIVE_ARCH ${BITSHIP_CROSS_LLVM_NATIVE_ARCH}" _generated "${_generated}")
foreach(check "\"${_host_triple}\"" "LLVMInitialize${_host_arch}" "LLVM_NATIVE_ARCH ${_host_arch}")
  string(FIND "${_generated}" "${check}" _left)
  if(NOT _left EQUAL -1)
    message(FATAL_ERROR "bitship: could not retarget ${check} in ${_host_config}")
  endif()
endforeach()
# A MCA back end is per architecture (x86 has one, AArch64 none in LLVM 19): the target has none.
string(REGEX REPLACE "#define LLVM_NATIVE_TARGETMCA [A-Za-z0-9_]+" "/* #undef LLVM_NATIVE_TARGETMCA */" _generated "${_generated}")
file(CONFIGURE OUTPUT "${_overlay}/llvm/Config/llvm-config.h" CONTENT "${_generated}" @ONLY)

add_library(LLVM SHARED IMPORTED)
set_target_properties(LLVM PROPERTIES IMPORTED_LOCATION "${BITSHIP_CROSS_LLVM_LIBRARY}")
set(LLVM_INCLUDE_DIRS "${_overlay}" "${BITSHIP_CROSS_LLVM_HEADERS}")
# What LLVMConfig.cmake sets (llvm-config --cppflags without the include path).
set(LLVM_DEFINITIONS "-D_GNU_SOURCE -D__STDC_CONSTANT_MACROS -D__STDC_FORMAT_MACROS -D__STDC_LIMIT_MACROS")
set(LLVM_DIR "${BITSHIP_CROSS_LLVM_LIBRARY} with ${BITSHIP_CROSS_LLVM_HEADERS} and ${_overlay}")
