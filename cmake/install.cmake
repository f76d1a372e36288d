# `cmake --install`: the header, the shared library (with its SONAME links), a CMake
# package (find_package(kbit) gives kbit::kbit) and a pkg-config file (kbit.pc).
include(CMakePackageConfigHelpers)

install(TARGETS kbit EXPORT kbitTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# (kbit::kbit's include directory comes from the target's $<INSTALL_INTERFACE:...>.)
install(FILES ${PROJECT_SOURCE_DIR}/include/kbit.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

set(KBIT_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/kbit)
install(EXPORT kbitTargets NAMESPACE kbit:: DESTINATION ${KBIT_CMAKE_DIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/kbitConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/kbitConfig.cmake
                              INSTALL_DESTINATION ${KBIT_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/kbitConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/kbitConfig.cmake ${PROJECT_BINARY_DIR}/kbitConfigVersion.cmake
        DESTINATION ${KBIT_CMAKE_DIR})

# kbit.pc: paths relative to the installed file, so `cmake --install --prefix` anywhere
# (or a moved prefix) still works. An absolute LIBDIR or INCLUDEDIR (distribution
# packaging) is written as given.
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
  set(KBIT_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
else()
  file(RELATIVE_PATH _kbit_pc_up "/p/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/p")
  string(REGEX REPLACE "/$" "" _kbit_pc_up "${_kbit_pc_up}")
  set(KBIT_PC_PREFIX "\${pcfiledir}/${_kbit_pc_up}")
endif()
foreach(_dir LIBDIR INCLUDEDIR)
  if(IS_ABSOLUTE "${CMAKE_INSTALL_${_dir}}")
    set(KBIT_PC_${_dir} "${CMAKE_INSTALL_${_dir}}")
  else()
    set(KBIT_PC_${_dir} "\${prefix}/${CMAKE_INSTALL_${_dir}}")
  endif()
endforeach()
configure_file(${PROJECT_SOURCE_DIR}/cmake/kbit.pc.in ${PROJECT_BINARY_DIR}/kbit.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/kbit.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
