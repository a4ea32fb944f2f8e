# Overlay port of commpact (header-only). The source is the checkout this port lives
# in (ports/commpact/../..); a registry port would use vcpkg_from_github with a
# release tag and its SHA512 instead. vcpkg's binary cache keys on this folder, not on
# the sources: after changing them, install with VCPKG_BINARY_SOURCES=clear (or remove
# the cached package) so that a stale copy is not restored.
get_filename_component(SOURCE_PATH "${CMAKE_CURRENT_LIST_DIR}/../.." ABSOLUTE)
if(NOT EXISTS "${SOURCE_PATH}/include/commpact/commpact.hpp")
  message(FATAL_ERROR "commpact's overlay port expects the commpact checkout two folders above "
    "${CMAKE_CURRENT_LIST_DIR}; copy the whole checkout, not only ports/")
endif()

# Nothing is compiled: one (release) configuration installs the headers and the config.
set(VCPKG_BUILD_TYPE release)
# No ELF file is installed; the extension-less `usage` must not be scanned as one.
set(VCPKG_FIXUP_ELF_RPATH OFF)

# The features only pull in dependencies (eigen, mpi, cuda): commpact's installed config
# creates commpact::eigen, commpact::mpi, commpact::cuda and commpact::nccl when a
# consumer asks for them. Without the feature eigen nothing needs Eigen.
vcpkg_cmake_configure(
  SOURCE_PATH "${SOURCE_PATH}"
  OPTIONS
    -DCOMMPACT_BUILD_TESTS=OFF
    -DCOMMPACT_BUILD_BENCH=OFF
    -DCOMMPACT_BUILD_EXAMPLES=OFF
)
vcpkg_cmake_install()
vcpkg_cmake_config_fixup(CONFIG_PATH share/cmake/commpact)

# Header-only: no lib/ and no debug tree; the licence goes to share/commpact/copyright.
file(REMOVE_RECURSE "${CURRENT_PACKAGES_DIR}/lib" "${CURRENT_PACKAGES_DIR}/debug"
     "${CURRENT_PACKAGES_DIR}/share/doc")
file(INSTALL "${CMAKE_CURRENT_LIST_DIR}/usage" DESTINATION "${CURRENT_PACKAGES_DIR}/share/${PORT}")
vcpkg_install_copyright(FILE_LIST "${SOURCE_PATH}/LICENSE")
