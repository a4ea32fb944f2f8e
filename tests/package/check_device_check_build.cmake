# Proves scripts/device-check's NCCL include and link line without a GPU: lays out a folder
# like pip's nvidia-nccl-cu13 wheel (nvidia/nccl/include/nccl.h and nvidia/nccl/lib/libnccl.so.2,
# no libnccl.so, which nvcc would need for -lnccl), puts it on PYTHONPATH with NCCL_ROOT and
# NCCL_HOME unset, and runs `device-check --build-only --nccl-only --only <name>` at -O0 for
# the smallest tests/cuda/*.cu that includes nccl_comm.hpp (one program keeps CI short).
# Fails unless the script picked the wheel's NCCL and the program built, and (with readelf)
# unless the program needs libnccl.so.2 with the wheel's lib folder as its run path.
#   cmake -DROOT=<source dir> -DWORK_DIR=<dir> -DNCCL_H=<nccl.h> -DNCCL_SO2=<libnccl.so.2>
#         -DNVCC=<nvcc> -DBASH=<bash> [-DREADELF=<readelf>] -P check_device_check_build.cmake
foreach(v ROOT WORK_DIR NCCL_H NCCL_SO2 NVCC BASH)
  if(NOT ${v})
    message(FATAL_ERROR "check_device_check_build: -D${v}= is required")
  endif()
endforeach()

set(site ${WORK_DIR}/site)
set(wheel ${site}/nvidia/nccl)
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${wheel}/include ${wheel}/lib)
file(COPY_FILE ${NCCL_H} ${wheel}/include/nccl.h)
# The library is large (about 200 MB): a hard link where the file system allows one.
file(REAL_PATH ${NCCL_SO2} so2)
file(CREATE_LINK ${so2} ${wheel}/lib/libnccl.so.2 COPY_ON_ERROR)

# The smallest test that includes NcclComm.
file(GLOB tests ${ROOT}/tests/cuda/test_*.cu)
set(pick "")
foreach(t IN LISTS tests)
  file(STRINGS ${t} uses REGEX "nccl_comm\\.hpp")
  if(uses)
    file(SIZE ${t} size)
    if(NOT pick OR size LESS pick_size)
      set(pick ${t})
      set(pick_size ${size})
    endif()
  endif()
endforeach()
if(NOT pick)
  message(FATAL_ERROR "check_device_check_build: no tests/cuda/test_*.cu includes nccl_comm.hpp")
endif()
get_filename_component(name ${pick} NAME_WE)

execute_process(
  COMMAND ${CMAKE_COMMAND} -E env --unset=NCCL_ROOT --unset=NCCL_HOME
    PYTHONPATH=${site} OUT=${WORK_DIR}/out WORK=${WORK_DIR}/work NVCC=${NVCC}
    "OPT=-O0 -Xptxas=-O0" JOBS=2 BUDGET=600
    ${BASH} ${ROOT}/scripts/device-check --build-only --nccl-only --only ${name}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT rc EQUAL 0)
  file(READ ${WORK_DIR}/out/build.log build_log)
  message(FATAL_ERROR "device-check --build-only --nccl-only failed (exit ${rc}):\n${build_log}")
endif()
string(FIND "${out}" "nccl: ${wheel} (python site" at)
if(at EQUAL -1)
  message(FATAL_ERROR "device-check did not take NCCL from the wheel layout ${wheel} on PYTHONPATH")
endif()
set(bin ${WORK_DIR}/work/bin/${name})
if(NOT EXISTS ${bin})
  message(FATAL_ERROR "device-check exited 0 but ${bin} is missing")
endif()
if(READELF)
  execute_process(COMMAND ${READELF} -d ${bin} OUTPUT_VARIABLE dyn RESULT_VARIABLE rc)
  string(FIND "${dyn}" "${wheel}/lib" in_path)
  if(NOT rc EQUAL 0 OR NOT dyn MATCHES "NEEDED[^\n]*libnccl\\.so\\.2" OR NOT dyn MATCHES "(RUNPATH|RPATH)"
     OR in_path EQUAL -1)
    message(FATAL_ERROR "${bin} does not need libnccl.so.2 with the run path ${wheel}/lib:\n${dyn}")
  endif()
endif()
message(STATUS "device-check built ${name} against the wheel layout ${wheel}")
