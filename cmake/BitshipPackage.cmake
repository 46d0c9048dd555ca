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
