include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# The installed tool finds the installed library beside it, wherever the prefix is moved.
set_target_properties(flexcp_cli PROPERTIES INSTALL_RPATH "$ORIGIN/../${CMAKE_INSTALL_LIBDIR}")

install(TARGETS flexcp flexcp_cli EXPORT flexcpTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/flexcp ${PROJECT_BINARY_DIR}/include/flexcp
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.h")
install(EXPORT flexcpTargets NAMESPACE flexcp:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/flexcp)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/flexcpConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/flexcpConfig.cmake
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/flexcp)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/flexcpConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/flexcpConfig.cmake ${PROJECT_BINARY_DIR}/flexcpConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/flexcp)
