# Installs the client library, headers, the bundle tool and xagent, and exports them as the
# `bitship::` package so users can `find_package(bitship)` and call bitship_add_kernels().
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# Exported as bitship::core and bitship::bundle, the same names the build tree's aliases use.
set_target_properties(bitship_core PROPERTIES EXPORT_NAME core)
set_target_properties(bitship_bundle PROPERTIES EXPORT_NAME bundle)
install(TARGETS bitship_bundle bitship_core bitship-bundle xagent EXPORT bitshipTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# xagent's compiler process, beside it (xagent looks there).
install(TARGETS bitship-compiler bitship-gpu RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/bitship DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT bitshipTargets NAMESPACE bitship:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/bitship)

configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/bitshipConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/bitshipConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/bitship
  PATH_VARS CMAKE_INSTALL_INCLUDEDIR)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/bitshipConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/bitshipConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/bitshipConfigVersion.cmake
  ${CMAKE_CURRENT_LIST_DIR}/BitshipKernels.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/bitship)

# --- The operator's side: xctl, a pkg-config file, the systemd unit and its config file ---
if(TARGET xctl) # not in the agent-only (cross) build
  install(TARGETS xctl RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
file(RELATIVE_PATH BITSHIP_PC_TO_PREFIX "/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/")
string(REGEX REPLACE "/$" "" BITSHIP_PC_TO_PREFIX "${BITSHIP_PC_TO_PREFIX}")
configure_file(${PROJECT_SOURCE_DIR}/packaging/bitship.pc.in ${CMAKE_CURRENT_BINARY_DIR}/bitship.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/bitship.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
# The unit and the config file belong to the system root (/lib/systemd/system, /etc/bitship)
# when the prefix is a system's /usr (also CPack's staging .../usr for the Debian package): they
# go beside it. Under any other prefix they stay inside it, so `cmake --install --prefix DIR`
# never writes outside DIR. Decided at install time, when the prefix is known.
function(bitship_install_system_file file dir)
  install(CODE "
    if(CMAKE_INSTALL_PREFIX MATCHES \"(^|/)usr/?$\")
      get_filename_component(_root \"\${CMAKE_INSTALL_PREFIX}\" DIRECTORY)
      string(REGEX REPLACE \"/$\" \"\" _root \"\${_root}\") # '/' → '': never a '//' path
      set(_dir \"\${_root}/${dir}\")
    else()
      set(_dir \"\${CMAKE_INSTALL_PREFIX}/${dir}\")
    endif()
    file(INSTALL \"${file}\" DESTINATION \"\${_dir}\") # file(INSTALL) adds DESTDIR itself")
endfunction()
bitship_install_system_file(${PROJECT_SOURCE_DIR}/packaging/xagent.service lib/systemd/system)
bitship_install_system_file(${PROJECT_SOURCE_DIR}/packaging/xagent.toml etc/bitship)
# Debian wants a copyright file and a compressed changelog beside it.
execute_process(COMMAND gzip -9nc ${PROJECT_SOURCE_DIR}/packaging/changelog
  OUTPUT_FILE ${CMAKE_CURRENT_BINARY_DIR}/changelog.gz COMMAND_ERROR_IS_FATAL ANY)
install(FILES ${PROJECT_SOURCE_DIR}/packaging/copyright ${CMAKE_CURRENT_BINARY_DIR}/changelog.gz
  DESTINATION ${CMAKE_INSTALL_DATAROOTDIR}/doc/bitship)

# --- cpack -G DEB: one package, bitship, installed under /usr with its config in /etc ---
set(CPACK_PACKAGE_NAME bitship)
set(CPACK_PACKAGE_VENDOR "the bitship authors")
set(BITSHIP_PACKAGE_CONTACT "bitship maintainers <maintainers@bitship.example.org>" CACHE STRING
  "The Debian package's Maintainer field")
set(CPACK_PACKAGE_CONTACT "${BITSHIP_PACKAGE_CONTACT}")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "ship LLVM-bitcode kernels to resident agents that run them next to the data")
set(CPACK_PACKAGE_DESCRIPTION "bitship moves compute to data: kernels compiled to LLVM bitcode
travel over UCX to a resident agent (xagent) that JIT-compiles them for its
host and runs them there. This package has xagent with its systemd unit and
config file, xctl, the bundle tool, the client library, its headers, its
CMake package and its pkg-config file.")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION devel)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# What find_package(bitship) and bitship_add_kernels() need on the machine that builds clients.
set(CPACK_DEBIAN_PACKAGE_DEPENDS "libucx-dev, libfmt-dev, libspdlog-dev, libexpected-dev, libsodium-dev, clang-19, llvm-19")
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
  "${PROJECT_SOURCE_DIR}/packaging/postinst;${PROJECT_SOURCE_DIR}/packaging/prerm;${PROJECT_SOURCE_DIR}/packaging/postrm;${PROJECT_SOURCE_DIR}/packaging/conffiles")
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
include(CPack)
