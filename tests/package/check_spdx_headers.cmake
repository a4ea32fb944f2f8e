# Fails naming every public header (include/**/*.hpp, *.cuh) whose first line is not
# the licence line. scripts/spdx-headers adds it.
#   cmake -DROOT=<source dir> -P check_spdx_headers.cmake
set(line "// SPDX-License-Identifier: Apache-2.0")
file(GLOB_RECURSE headers RELATIVE ${ROOT} ${ROOT}/include/*.hpp ${ROOT}/include/*.cuh)
list(SORT headers)
list(LENGTH headers n)
if(n EQUAL 0)
  message(FATAL_ERROR "no headers under ${ROOT}/include: is ROOT the source folder?")
endif()
set(missing "")
foreach(h IN LISTS headers)
  file(READ ${ROOT}/${h} head LIMIT 256)
  string(REGEX MATCH "^[^\r\n]*" first "${head}")
  if(NOT first STREQUAL line)
    string(APPEND missing "\n  ${h}")
  endif()
endforeach()
if(missing)
  message(FATAL_ERROR "these public headers do not start with '${line}' "
    "(run scripts/spdx-headers to add it):${missing}")
endif()
message(STATUS "all ${n} public headers start with the licence line")
