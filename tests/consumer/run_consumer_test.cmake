# Installs the build tree into a fresh prefix, then configures, builds and runs
# projects that use commpact only as an installed package (or through FetchContent).
# No consumer may find Eigen in commpact::commpact (tests/consumer/CMakeLists.txt fails
# at configure time if it does):
#   default        find_package without components, Eigen installed: not linked, not searched
#   components     COMPONENTS eigen (and mpi when built with MPI): commpact::eigen links Eigen
#   no-eigen       Eigen hidden: the umbrella header and every public header without MPI
#                  or CUDA build and run, <Eigen/Core> is unreachable, the config is silent
#                  about Eigen; COMPONENTS eigen fails, naming the way out
#   eigen5, eigen3.2  fake Eigen packages whose version files behave as Eigen's
#                  (SameMajorVersion): 5.0.0 accepted, 3.2.10 refused for COMPONENTS eigen
#                  and ignored without it
#   bad-component  an unknown component fails a REQUIRED find_package
#   fetchcontent   FetchContent_MakeAvailable on the source folder
#   vcpkg-consumer examples/vcpkg-consumer, built against the prefix with Eigen hidden
#   conan-test-package  test_package/ (Conan's), built against the prefix with Eigen hidden
# Variables: BUILD_DIR SOURCE_DIR (tests/consumer) ROOT_DIR WORK_DIR WITH_MPI EIGEN_INCLUDE
file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)
execute_process(COMMAND ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix} RESULT_VARIABLE rc
  OUTPUT_QUIET)
if(rc)
  message(FATAL_ERROR "install failed: ${rc}")
endif()
foreach(f IN ITEMS share/cmake/commpact/commpactConfig.cmake include/commpact/commpact.hpp
                   share/doc/commpact/LICENSE)
  if(NOT EXISTS ${prefix}/${f})
    message(FATAL_ERROR "the install lacks ${f}")
  endif()
endforeach()

# consumer(<name> [FAIL] [SOURCE dir] [PREFIX path...] [EXPECT regex...] [REJECT regex...]
#          [RUN program...] [ARGS -D...])
# Configures (and, unless FAIL, builds) one consumer; every EXPECT regex must match the
# configure output and no REJECT regex may; each RUN program must exit 0. FAIL:
# configuring must fail.
function(consumer name)
  cmake_parse_arguments(c "FAIL" "SOURCE" "PREFIX;EXPECT;REJECT;RUN;ARGS" ${ARGN})
  if(NOT c_SOURCE)
    set(c_SOURCE ${SOURCE_DIR})
  endif()
  if(NOT c_PREFIX)
    set(c_PREFIX ${prefix})
  endif()
  set(bin ${WORK_DIR}/${name})
  execute_process(COMMAND ${CMAKE_COMMAND} -S ${c_SOURCE} -B ${bin} -DCMAKE_BUILD_TYPE=Release
    "-DCMAKE_PREFIX_PATH=${c_PREFIX}" ${c_ARGS}
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  set(log "${out}${err}")
  if(c_FAIL AND NOT rc)
    message(FATAL_ERROR "${name}: configuring succeeded but should have failed:\n${log}")
  elseif(NOT c_FAIL AND rc)
    message(FATAL_ERROR "${name}: configuring failed:\n${log}")
  endif()
  foreach(re IN LISTS c_EXPECT)
    if(NOT log MATCHES "${re}")
      message(FATAL_ERROR "${name}: the configure output does not match '${re}':\n${log}")
    endif()
  endforeach()
  foreach(re IN LISTS c_REJECT)
    if(log MATCHES "${re}")
      message(FATAL_ERROR "${name}: the configure output matches '${re}' (it should not):\n${log}")
    endif()
  endforeach()
  if(c_FAIL)
    message(STATUS "${name}: failed as it should")
    return()
  endif()
  execute_process(COMMAND ${CMAKE_COMMAND} --build ${bin} RESULT_VARIABLE rc OUTPUT_VARIABLE out
    ERROR_VARIABLE out)
  if(rc)
    message(FATAL_ERROR "${name}: building failed:\n${out}")
  endif()
  foreach(p IN LISTS c_RUN)
    execute_process(COMMAND ${bin}/${p} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
    if(rc)
      message(FATAL_ERROR "${name}: ${p} failed (${rc}):\n${out}")
    endif()
    string(STRIP "${out}" out)
    message(STATUS "${name}: ${out}")
  endforeach()
  message(STATUS "${name}: passed")
endfunction()

set(hide_eigen -DCMAKE_DISABLE_FIND_PACKAGE_Eigen3=ON)
# What the installed config said about Eigen before it stopped linking it.
set(eigen_talk "without Eigen|power.hpp|gossip_mixer.hpp")

# Eigen is installed here (the build found it), yet commpact::commpact must not link it.
consumer(default ARGS -DCONSUMER_PROGRAMS=consumer -DCONSUMER_EXPECT_NO_EIGEN=ON RUN consumer
  EXPECT "consumer: eigen-linked=no" "license=Apache-2.0" REJECT "${eigen_talk}")

if(WITH_MPI)
  consumer(components ARGS -DCONSUMER_COMPONENTS=eigen,mpi -DCONSUMER_PROGRAMS=consumer_mpi
    RUN consumer_mpi EXPECT "eigen-linked=no eigen-dir=[^ ]")
else()
  consumer(components ARGS -DCONSUMER_COMPONENTS=eigen -DCONSUMER_PROGRAMS=consumer
    RUN consumer EXPECT "eigen-linked=no eigen-dir=[^ ]")
endif()

consumer(no-eigen ARGS ${hide_eigen} -DCONSUMER_PROGRAMS=consumer_core,consumer,consumer_headers
  -DCONSUMER_EXPECT_NO_EIGEN=ON RUN consumer_core consumer consumer_headers
  EXPECT "eigen-linked=no" REJECT "${eigen_talk}")
consumer(no-eigen-required FAIL ARGS ${hide_eigen} -DCONSUMER_COMPONENTS=eigen
  EXPECT "component eigen: Eigen 3.3 or newer was not found")

# Fake Eigen packages: the real headers, a version file made as Eigen makes its own.
include(CMakePackageConfigHelpers)
foreach(v IN ITEMS 5.0.0 3.2.10)
  set(dir ${WORK_DIR}/fake-eigen-${v}/share/eigen3/cmake)
  file(WRITE ${dir}/Eigen3Config.cmake "
if(NOT TARGET Eigen3::Eigen)
  add_library(Eigen3::Eigen INTERFACE IMPORTED)
  set_target_properties(Eigen3::Eigen PROPERTIES INTERFACE_INCLUDE_DIRECTORIES \"${EIGEN_INCLUDE}\")
endif()
")
  write_basic_package_version_file(${dir}/Eigen3ConfigVersion.cmake VERSION ${v}
    COMPATIBILITY SameMajorVersion ARCH_INDEPENDENT)
endforeach()
consumer(eigen5 PREFIX ${WORK_DIR}/fake-eigen-5.0.0 ${prefix} ARGS -DCONSUMER_COMPONENTS=eigen
  -DCONSUMER_PROGRAMS= EXPECT "eigen-linked=no eigen-dir=[^ ]*fake-eigen-5.0.0")
consumer(eigen3.2-required FAIL PREFIX ${WORK_DIR}/fake-eigen-3.2.10 ${prefix}
  ARGS -DCONSUMER_COMPONENTS=eigen EXPECT "Eigen 3.2.10 was found at [^ ]*fake-eigen-3.2.10")
# Without the component an unusable Eigen does not matter: the config does not look.
consumer(eigen3.2 PREFIX ${WORK_DIR}/fake-eigen-3.2.10 ${prefix} ARGS -DCONSUMER_PROGRAMS=
  EXPECT "eigen-linked=no eigen-dir= " REJECT "${eigen_talk}|3[.]2[.]10")

consumer(bad-component FAIL ARGS -DCONSUMER_COMPONENTS=no_such_component
  EXPECT "component no_such_component: commpact has no component 'no_such_component'")

if(WITH_MPI)
  set(fetch_components eigen,mpi)
else()
  set(fetch_components eigen)
endif()
consumer(fetchcontent ARGS -DCONSUMER_FETCH_SOURCE=${ROOT_DIR} -DCONSUMER_PROGRAMS=consumer
  -DCONSUMER_COMPONENTS=${fetch_components} RUN consumer EXPECT "eigen-linked=no" "license=Apache-2.0")

# The package managers' own consumers need no Eigen (Conan's option with_eigen and
# vcpkg's feature eigen are off by default).
consumer(vcpkg-consumer SOURCE ${ROOT_DIR}/examples/vcpkg-consumer ARGS ${hide_eigen} RUN vcpkg_consumer)
consumer(conan-test-package SOURCE ${ROOT_DIR}/test_package ARGS ${hide_eigen} RUN test_package)

message(STATUS "consumer package test passed")
