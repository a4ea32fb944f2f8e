# Fails naming file:line for every single-thread kernel launch in the public headers
# (include/**/*.hpp, *.cuh): a launch whose configuration starts with one block of one
# thread, `<<<1, 1` (spaces, a u suffix, dim3(1) or dim3{1} allowed, the configuration
# possibly continued on the next lines). Kernels are parallel over their data (DESIGN.md,
# "Device discipline"); a decision over a few words of state runs as one warp through
# kernels/cuda/grid.cuh's decision_launch. Lines that start with // are comments and are
# not checked; a trailing // comment is stripped first.
#
#   cmake -DROOT=<source dir> -P check_no_serial_launch.cmake
#   cmake -DSELF_TEST=<scratch dir> -P check_no_serial_launch.cmake
# SELF_TEST writes a header with planted launches (and lawful look-alikes) under the
# scratch folder and fails unless exactly the planted lines are reported.

cmake_minimum_required(VERSION 3.20)
include(${CMAKE_CURRENT_LIST_DIR}/header_lines.cmake)

set(one_re "(1|1u|1U|dim3\\(1u?U?\\)|dim3{1u?U?})")

# Appends "rel:line: ..." to the list `found_var` for every single-thread launch in `file`.
function(scan_file file rel found_var)
  set(found ${${found_var}})
  commpact_header_lines("${file}" lines code)
  list(LENGTH lines nlines)
  if(nlines EQUAL 0)
    return()
  endif()
  math(EXPR lastline "${nlines} - 1")
  foreach(i RANGE 0 ${lastline})
    list(GET code ${i} c)
    if(NOT c MATCHES "<<<")
      continue()
    endif()
    # The configuration: from the first <<< to >>>, over at most four more lines.
    string(FIND "${c}" "<<<" at)
    math(EXPR at "${at} + 3")
    string(SUBSTRING "${c}" ${at} -1 cfg)
    set(j ${i})
    while(NOT cfg MATCHES ">>>" AND j LESS lastline)
      math(EXPR j "${j} + 1")
      math(EXPR span "${j} - ${i}")
      if(span GREATER 4)
        break()
      endif()
      list(GET code ${j} next)
      string(APPEND cfg "${next}")
    endwhile()
    string(REGEX REPLACE ">>>.*$" "" cfg "${cfg}")
    string(REGEX REPLACE "[ \t]" "" cfg "${cfg}")
    if(cfg MATCHES "^${one_re},${one_re}(,|$)")
      math(EXPR ln "${i} + 1")
      list(APPEND found "${rel}:${ln}: a single-thread launch <<<${cfg}>>> (make the kernel parallel over its data, or a decision over a few words through decision_launch)")
    endif()
  endforeach()
  set(${found_var} "${found}" PARENT_SCOPE)
endfunction()

function(scan_tree root out_var count_var)
  file(GLOB_RECURSE headers RELATIVE ${root} ${root}/include/*.hpp ${root}/include/*.cuh)
  list(SORT headers)
  set(found "")
  foreach(h IN LISTS headers)
    scan_file(${root}/${h} ${h} found)
  endforeach()
  list(LENGTH headers n)
  set(${out_var} "${found}" PARENT_SCOPE)
  set(${count_var} ${n} PARENT_SCOPE)
endfunction()

if(DEFINED SELF_TEST)
  set(dir ${SELF_TEST})
  file(REMOVE_RECURSE ${dir})
  file(MAKE_DIRECTORY ${dir}/include/commpact)
  # Planted launches are marked PLANTED in a trailing comment (stripped before the scan).
  file(WRITE ${dir}/include/commpact/planted.cuh [=[
// SPDX-License-Identifier: Apache-2.0
// k<<<1, 1, 0, s>>>(x); in a comment line is not a launch
__global__ void k(float*);
inline void f(float* x, cudaStream_t s, unsigned g) {
  k<<<1, 1, 0, s>>>(x);  // PLANTED
  k<<<1,1,0,s>>>(x);  // PLANTED
  k<<< 1u , 1 , 0, s >>>(x);  // PLANTED
  k<<<dim3(1), dim3(1), 0, s>>>(x);  // PLANTED
  k<<<1,  // PLANTED
      1, 0, s>>>(x);
  k<<<1, 32, 0, s>>>(x);
  k<<<1, 128, 0, s>>>(x);
  k<<<g, 1, 0, s>>>(x);
  k<<<11, 1, 0, s>>>(x);
  k<<<1, 16, 0, s>>>(x);
  decision_launch(k, s, x);
}
]=])
  scan_tree(${dir} found n)
  file(STRINGS ${dir}/include/commpact/planted.cuh planted_lines)
  set(want "")
  set(ln 0)
  foreach(l IN LISTS planted_lines)
    math(EXPR ln "${ln} + 1")
    if(l MATCHES "// PLANTED")
      list(APPEND want "include/commpact/planted.cuh:${ln}")
    endif()
  endforeach()
  set(got "")
  foreach(f IN LISTS found)
    string(REGEX MATCH "^[^:]+:[0-9]+" w "${f}")
    list(APPEND got "${w}")
  endforeach()
  if(NOT got STREQUAL want)
    string(REPLACE ";" "\n  " g "${got}")
    string(REPLACE ";" "\n  " w "${want}")
    message(FATAL_ERROR "the self-test reported\n  ${g}\nbut the planted launches are\n  ${w}")
  endif()
  list(LENGTH want nw)
  message(STATUS "self-test: the ${nw} planted single-thread launches were reported, and nothing else")
  return()
endif()

if(NOT DEFINED ROOT)
  message(FATAL_ERROR "pass -DROOT=<source dir> or -DSELF_TEST=<scratch dir>")
endif()
scan_tree(${ROOT} found n)
if(n EQUAL 0)
  message(FATAL_ERROR "no headers under ${ROOT}/include: is ROOT the source folder?")
endif()
if(found)
  string(REPLACE ";" "\n  " f "${found}")
  message(FATAL_ERROR "single-thread kernel launches in the public headers:\n  ${f}")
endif()
message(STATUS "no single-thread kernel launch in the ${n} public headers")
