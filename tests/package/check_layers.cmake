# Fails naming file:line for every #include in the public headers (include/commpact/,
# .hpp and .cuh) that points up the library's layers, lowest first:
#   0  config.hpp, error.hpp, state.hpp, detail/
#   1  space/, wire/ (the frame formats on the wire: bytes, no space)
#   2  concepts.hpp, concepts/ (they name host_space as the default space)
#   3  kernels/
#   4  comm/, topology/, nonfinite.hpp (the policy and its scan, over kernels/)
#   5  compress/
#   6  gossip/, sync/
#   7  train/, ps/
#   8  torch/
#   9  commpact.hpp, cuda.cuh, torch.hpp (the umbrellas)
# A header may include its own layer and those below it. The includes that point up
# today are listed, each with its reason, in layers_allowed.txt (next to this file): an
# include up that is not listed fails, and so does a listed one that is gone (the list
# only shrinks, with the code).
#
#   cmake -DROOT=<source dir> -P check_layers.cmake
#   cmake -DSELF_TEST=<scratch dir> -P check_layers.cmake
# SELF_TEST writes a small tree with planted includes up (and lawful ones) and fails
# unless exactly the planted lines are reported.

cmake_minimum_required(VERSION 3.20)
include(${CMAKE_CURRENT_LIST_DIR}/header_lines.cmake)

# The layer of a path relative to include/commpact (the rank above).
function(commpact_layer rel out_var)
  set(r -1)
  if(rel MATCHES "^(config|error|state)\\.hpp$" OR rel MATCHES "^detail/")
    set(r 0)
  elseif(rel MATCHES "^(space|wire)/")
    set(r 1)
  elseif(rel STREQUAL "concepts.hpp" OR rel MATCHES "^concepts/")
    set(r 2)
  elseif(rel MATCHES "^kernels/")
    set(r 3)
  elseif(rel MATCHES "^(comm|topology)/" OR rel STREQUAL "nonfinite.hpp")
    set(r 4)
  elseif(rel MATCHES "^compress/")
    set(r 5)
  elseif(rel MATCHES "^(gossip|sync)/")
    set(r 6)
  elseif(rel MATCHES "^(train|ps)/")
    set(r 7)
  elseif(rel MATCHES "^torch/")
    set(r 8)
  elseif(rel MATCHES "^(commpact\\.hpp|cuda\\.cuh|torch\\.hpp)$")
    set(r 9)
  endif()
  set(${out_var} ${r} PARENT_SCOPE)
endfunction()

# Every include up under `base` (include/commpact) as "file -> target" entries in
# `found_var`, and "file:line: ..." messages in `where_var`; headers outside every layer
# in `unknown_var`.
function(commpact_scan base found_var where_var unknown_var)
  file(GLOB_RECURSE headers RELATIVE "${base}" "${base}/*.hpp" "${base}/*.cuh")
  list(SORT headers)
  set(found "")
  set(where "")
  set(unknown "")
  foreach(rel IN LISTS headers)
    commpact_layer("${rel}" from)
    if(from EQUAL -1)
      list(APPEND unknown "${rel}")
      continue()
    endif()
    commpact_header_lines("${base}/${rel}" lines code)
    set(ln 0)
    get_filename_component(dir "${base}/${rel}" DIRECTORY)
    foreach(line IN LISTS lines)
      math(EXPR ln "${ln} + 1")
      if(NOT line MATCHES "^[ \t]*#[ \t]*include[ \t]+\"([^\"]+)\"")
        continue()
      endif()
      get_filename_component(abs "${dir}/${CMAKE_MATCH_1}" ABSOLUTE)
      file(RELATIVE_PATH tgt "${base}" "${abs}")
      if(tgt MATCHES "^\\.\\./")
        continue()  # outside the library
      endif()
      commpact_layer("${tgt}" to)
      if(to GREATER from)
        list(APPEND found "${rel} -> ${tgt}")
        list(APPEND where "include/commpact/${rel}:${ln}: includes ${tgt} (layer ${to}) from layer ${from}")
      endif()
    endforeach()
  endforeach()
  set(${found_var} "${found}" PARENT_SCOPE)
  set(${where_var} "${where}" PARENT_SCOPE)
  set(${unknown_var} "${unknown}" PARENT_SCOPE)
endfunction()

# The entries of an allow list: lines "file -> target  # reason"; blank and # lines skipped.
function(commpact_allowed file out_var)
  set(out "")
  if(EXISTS "${file}")
    file(STRINGS "${file}" lines)
    foreach(line IN LISTS lines)
      if(line MATCHES "^[ \t]*(#|$)")
        continue()
      endif()
      if(NOT line MATCHES "^([^ ]+ -> [^ ]+)[ \t]+#[ \t]*[^ \t]")
        message(FATAL_ERROR "check_layers: ${file}: '${line}' is not 'file -> target  # reason'")
      endif()
      list(APPEND out "${CMAKE_MATCH_1}")
    endforeach()
  endif()
  set(${out_var} "${out}" PARENT_SCOPE)
endfunction()

# Compares; `bad_var` gets the failures (empty when the tree keeps its layers).
function(commpact_check base allow_file bad_var)
  commpact_scan("${base}" found where unknown)
  commpact_allowed("${allow_file}" allowed)
  set(bad "")
  foreach(h IN LISTS unknown)
    list(APPEND bad "include/commpact/${h}: in no layer; add its folder to check_layers.cmake's list")
  endforeach()
  list(LENGTH found n)
  if(n GREATER 0)
    math(EXPR last "${n} - 1")
    foreach(i RANGE 0 ${last})
      list(GET found ${i} f)
      list(GET where ${i} w)
      list(FIND allowed "${f}" at)
      if(at EQUAL -1)
        list(APPEND bad "${w}")
      endif()
    endforeach()
  endif()
  foreach(a IN LISTS allowed)
    list(FIND found "${a}" at)
    if(at EQUAL -1)
      list(APPEND bad "layers_allowed.txt lists '${a}', which no longer exists: remove the line")
    endif()
  endforeach()
  set(${bad_var} "${bad}" PARENT_SCOPE)
endfunction()

if(DEFINED SELF_TEST)
  set(t "${SELF_TEST}/include/commpact")
  file(REMOVE_RECURSE "${SELF_TEST}")
  file(WRITE "${t}/error.hpp" "#pragma once\n")
  file(WRITE "${t}/space/host.hpp" "#include \"../error.hpp\"\n#include \"../kernels/ops.hpp\"\n")
  file(WRITE "${t}/kernels/ops.hpp" "#include \"../space/host.hpp\"\n  #  include \"../compress/frame.hpp\"\n#include <vector>\n")
  file(WRITE "${t}/kernels/cuda/x.cuh" "#include \"../ops.hpp\"\n#include \"../../comm/tree.hpp\"\n")
  file(WRITE "${t}/compress/frame.hpp" "#include \"../kernels/ops.hpp\"\n#include \"../comm/tree.hpp\"\n")
  file(WRITE "${t}/comm/tree.hpp" "#include \"../compress/frame.hpp\"\n")
  file(WRITE "${t}/commpact.hpp" "#include \"comm/tree.hpp\"\n")
  file(WRITE "${t}/extra/y.hpp" "\n")
  file(WRITE "${t}/wire/f.hpp" "#include \"../space/host.hpp\"\n#include \"../kernels/ops.hpp\"\n")
  file(WRITE "${SELF_TEST}/allowed.txt" "# planted\ncomm/tree.hpp -> compress/frame.hpp  # allowed for the test\nkernels/ops.hpp -> gossip/gone.hpp  # gone\n")
  commpact_check("${t}" "${SELF_TEST}/allowed.txt" bad)
  set(expect
    "include/commpact/extra/y.hpp: in no layer; add its folder to check_layers.cmake's list"
    "include/commpact/kernels/cuda/x.cuh:2: includes comm/tree.hpp (layer 4) from layer 3"
    "include/commpact/kernels/ops.hpp:2: includes compress/frame.hpp (layer 5) from layer 3"
    "include/commpact/space/host.hpp:2: includes kernels/ops.hpp (layer 3) from layer 1"
    "include/commpact/wire/f.hpp:2: includes kernels/ops.hpp (layer 3) from layer 1"
    "layers_allowed.txt lists 'kernels/ops.hpp -> gossip/gone.hpp', which no longer exists: remove the line")
  if(NOT bad STREQUAL expect)
    string(REPLACE ";" "\n  " b "${bad}")
    string(REPLACE ";" "\n  " e "${expect}")
    message(FATAL_ERROR "check_layers self-test: reported\n  ${b}\nexpected\n  ${e}")
  endif()
  message(STATUS "check_layers self-test: the planted includes up, and only they, are reported")
  return()
endif()

if(NOT DEFINED ROOT)
  message(FATAL_ERROR "usage: cmake -DROOT=<source dir> -P check_layers.cmake")
endif()
commpact_check("${ROOT}/include/commpact" "${CMAKE_CURRENT_LIST_DIR}/layers_allowed.txt" bad)
if(bad)
  string(REPLACE ";" "\n  " b "${bad}")
  message(FATAL_ERROR "check_layers: includes that point up the layers (docs/architecture.md, \"Layers\"):\n  ${b}")
endif()
commpact_allowed("${CMAKE_CURRENT_LIST_DIR}/layers_allowed.txt" allowed)
list(LENGTH allowed na)
message(STATUS "check_layers: every include points down or across (${na} listed exceptions)")
