# SPDX-License-Identifier: Apache-2.0
# Compiles every C++ example of the docs: the ```cpp and ```c++ blocks of README.md and
# docs/*.md, and the \code ... \endcode blocks of the doc comments (//!) of the public
# headers (include/**/*.hpp, *.cuh). Fails naming file:line of each block that does not
# compile, with the compiler's errors (the generated files carry #line directives, so the
# compiler itself reports docs/x.md:N).
#
#   cmake -DROOT=<source dir> -DWORK_DIR=<dir> -DCXX=<c++> [-DINCLUDES=<dir|dir|...>]
#         [-DMPI_INCLUDES=<dir|...>] [-DTORCH_INCLUDES=<dir|...>] [-DTORCH_DEFINES=<d|d|...>]
#         [-DNVCC=<nvcc>] [-DCUDA_INCLUDES=<dir|...>]
#         [-DMIN_BLOCKS=<n>] -P check_doc_snippets.cmake
#   cmake -DSELF_TEST=<scratch dir> -DROOT=<source dir> -DCXX=<c++> [-DINCLUDES=...]
#         -P check_doc_snippets.cmake
#
# Three translation units, each compiled once (CI time):
#   host   every block that needs only the library, and, when MPI_INCLUDES is given, the
#          blocks that need MPI (MpiComm, mpi_comm.hpp, MPI_*); g++/clang++ -fsyntax-only
#          (templates a block uses are still instantiated, so an error in their bodies
#          is reported). Without MPI_INCLUDES the MPI blocks are reported as not compiled.
#   torch  the blocks that need LibTorch (TorchComm, torch.hpp, c10d), when TORCH_INCLUDES
#          is given (LibTorch's include folders, torch/csrc/api/include among them;
#          TORCH_DEFINES: its targets' compile definitions, USE_C10D_GLOO among them, and
#          _GLIBCXX_USE_CXX11_ABI).
#   cuda   the blocks that need nvcc (.cuh, cuda_space, cuda_span, NcclComm, cuda_kernels,
#          CUDA runtime calls), compiled with NVCC to PTX for sm_90 (front end and cicc:
#          host and device code checked, templates instantiated), when NVCC
#          is given (with nccl.h on its include path or in CUDA_INCLUDES: NcclComm's blocks).
# Every block's #include lines are hoisted to the top of its unit; the other lines become
# the body of a function `void snippet()` in a namespace of its own, after the prelude
# tests/package/doc_snippets_prelude.hpp, which declares (extern, never defined: nothing
# is linked) the names the docs assume the reader has: comm, world, grads, params, lr,
# steps, backward(...), sgd_update(...), ...
#
# A block may be preceded, on the line right before its fence (README.md, docs/*.md) or
# its \code line (headers, as a //! line), by a marker: an HTML comment, which neither
# Markdown nor Doxygen shows:
#   <!-- snippet: OPTION; OPTION; ... -->        (headers: //! <!-- snippet: ... -->)
# OPTIONs:
#   namespace        the block goes at namespace scope (its own namespace), not in a
#                    function body: it defines a template, a struct with member
#                    templates or declared-only members, or main()
#   NAME=TYPE        in this block, NAME is a `TYPE&` (a parameter of the block's
#                    function, hiding the prelude's NAME): e.g. comm=commpact::MpiComm
#   using NAME=TYPE  a type the block assumes (`using NAME = TYPE;` before it): e.g.
#                    using C=commpact::ThreadComm
#   needs=WHAT       the unit the block needs (host, mpi, torch or cuda) when the words
#                    of the block do not say it
#   skip (REASON)    not compiled, the reason printed: only for listings of the library's
#                    own declarations and the like; a reason is required
# An unknown option, a skip without a reason, a marker that is not right before a block
# or an unclosed block fails the check, and so does finding fewer than MIN_BLOCKS blocks
# (default 60; a check that extracts nothing must not pass).
#
# SELF_TEST writes a small tree with planted blocks (good ones, a broken one in a Markdown
# file and in a header, an error inside a template body a block instantiates) and runs the
# check on it; it fails unless the check fails naming exactly the planted files and lines.
# It also checks that a malformed marker and too few blocks fail.

cmake_minimum_required(VERSION 3.20)
include(${CMAKE_CURRENT_LIST_DIR}/header_lines.cmake)
set(prelude ${CMAKE_CURRENT_LIST_DIR}/doc_snippets_prelude.hpp)

macro(snip_unprotect var)
  string(REPLACE "<BS>" "\\" ${var} "${${var}}")
  string(REPLACE "<SC>" ";" ${var} "${${var}}")
  string(REPLACE "<LB>" "[" ${var} "${${var}}")
  string(REPLACE "<RB>" "]" ${var} "${${var}}")
endmacro()

function(split_dirs value out_var)
  string(REPLACE "|" ";" dirs "${value}")
  set(flags "")
  foreach(d IN LISTS dirs)
    if(d)
      list(APPEND flags -I${d})
    endif()
  endforeach()
  set(${out_var} "${flags}" PARENT_SCOPE)
endfunction()

# The unit a block needs, from its words (cuda before torch before mpi before host).
function(snip_guess_unit text out_var)
  if(text MATCHES "\\.cuh|cuda_space|cuda_span|CudaStagedComm|NcclComm|nccl|cuda_kernels|cudaMalloc|cudaStream|TorchCudaComm|cuda_allocator|CUDACachingAllocator")
    set(u cuda)
  elseif(text MATCHES "TorchComm|torch|c10d|c10::")
    set(u torch)
  elseif(text MATCHES "MpiComm|mpi_comm\\.hpp|MPI_|hierarchical_mpi")
    set(u mpi)
  else()
    set(u host)
  endif()
  set(${out_var} ${u} PARENT_SCOPE)
endfunction()

# Appends one block to the generated unit. Globals: gen_<unit>, inc_<unit> (hoisted
# includes), blocks (file|first|last|unit), skipped (messages), nblock.
function(snip_add rel first last marker body_lines)
  set(ns OFF)
  set(params "")
  set(aliases "")
  set(unit "")
  set(skip "")
  if(NOT marker STREQUAL "")
    string(REPLACE "<SC>" ";" opts "${marker}")
    foreach(o IN LISTS opts)
      string(STRIP "${o}" o)
      if(o STREQUAL "")
        continue()
      elseif(o STREQUAL "namespace")
        set(ns ON)
      elseif(o MATCHES "^skip[ \t]*\\((.*)\\)$")
        string(STRIP "${CMAKE_MATCH_1}" skip)
        if(skip STREQUAL "")
          set(skip "?")
        endif()
      elseif(o MATCHES "^using[ \t]+([A-Za-z_][A-Za-z0-9_]*)[ \t]*=[ \t]*(.+)$")
        set(t "${CMAKE_MATCH_2}")
        snip_unprotect(t)
        string(APPEND aliases "using ${CMAKE_MATCH_1} = ${t};\n")
      elseif(o MATCHES "^needs[ \t]*=[ \t]*(host|mpi|torch|cuda)$")
        set(unit ${CMAKE_MATCH_1})
      elseif(o MATCHES "^([A-Za-z_][A-Za-z0-9_]*)[ \t]*=[ \t]*(.+)$" AND NOT CMAKE_MATCH_1 STREQUAL "needs")
        set(t "${CMAKE_MATCH_2}")
        snip_unprotect(t)
        if(params)
          string(APPEND params ", ")
        endif()
        string(APPEND params "${t}& ${CMAKE_MATCH_1}")
      else()
        snip_unprotect(o)
        set(malformed ${malformed} "${rel}:${first}: unknown snippet option '${o}' (namespace, NAME=TYPE, using NAME=TYPE, needs=host|mpi|torch|cuda, skip (reason))" PARENT_SCOPE)
        return()
      endif()
    endforeach()
  endif()
  if(skip STREQUAL "?")
    set(malformed ${malformed} "${rel}:${first}: a skip needs its reason: <!-- snippet: skip (why) -->" PARENT_SCOPE)
    return()
  endif()
  math(EXPR n "${nblock} + 1")
  set(nblock ${n} PARENT_SCOPE)
  if(NOT skip STREQUAL "")
    snip_unprotect(skip)
    set(skipped ${skipped} "${rel}:${first}: skipped (${skip})" PARENT_SCOPE)
    set(blocks ${blocks} "${rel}|${first}|${last}|skip" PARENT_SCOPE)
    return()
  endif()
  if(unit STREQUAL "")
    # the words of the code, not of its comments, and the marker's types
    set(words "")
    foreach(l IN LISTS body_lines)
      string(REGEX REPLACE "//.*$" "" l "${l}")
      string(APPEND words " ${l}")
    endforeach()
    snip_guess_unit("${words} ${marker}" unit)
  endif()
  set(tu ${unit})
  set(blocks ${blocks} "${rel}|${first}|${last}|${unit}" PARENT_SCOPE)
  if(unit STREQUAL "mpi")
    set(tu host)
    if(NOT MPI_INCLUDES)
      return()   # the MPI blocks join the host unit only with MPI's headers
    endif()
  elseif((unit STREQUAL "torch" AND NOT TORCH_INCLUDES) OR (unit STREQUAL "cuda" AND NOT NVCC))
    return()
  endif()
  set(text "\n// ---- ${rel}:${first}\nnamespace doc_snippet_${n} {\n${aliases}")
  if(NOT ns)
    string(APPEND text "void snippet(${params}) {\n")
  endif()
  math(EXPR ln "${first} + 1")
  string(APPEND text "#line ${ln} \"${rel}\"\n")
  set(incs "${inc_${tu}}")
  foreach(l IN LISTS body_lines)
    snip_unprotect(l)
    if(l MATCHES "^[ \t]*#[ \t]*include[ \t]*([<\"][^>\"]*[>\"])")
      list(APPEND incs "${CMAKE_MATCH_1}")
      string(APPEND text "\n")
    else()
      string(APPEND text "${l}\n")
    endif()
  endforeach()
  if(NOT ns)
    string(APPEND text "}\n")
  endif()
  string(APPEND text "}  // namespace doc_snippet_${n}\n")
  list(REMOVE_DUPLICATES incs)
  set(inc_${tu} "${incs}" PARENT_SCOPE)
  set(gen_${tu} "${gen_${tu}}${text}" PARENT_SCOPE)
endfunction()

# Reads one file's blocks. md: ```cpp / ```c++ fences; header: //! \code ... \endcode.
function(snip_scan file rel kind)
  file(READ "${file}" content)
  commpact_protect(content)
  string(REPLACE "\r" "" content "${content}")
  string(REPLACE "\n" ";" lines "${content}")
  list(LENGTH lines nlines)
  if(nlines EQUAL 0)
    return()
  endif()
  set(marker_re "^[ \t]*<!--[ \t]*snippet:(.*)-->[ \t]*$")
  set(inblock OFF)
  set(other_fence OFF)
  set(pending_marker "")
  set(pending_marker_line 0)
  set(i 0)
  foreach(l IN LISTS lines)
    math(EXPR i "${i} + 1")
    if(kind STREQUAL "md")
      set(code "${l}")
    else()
      if(NOT l MATCHES "^[ \t]*//!")
        set(code "")
        if(inblock)
          list(APPEND malformed "${rel}:${first}: \\code without \\endcode in the same //! comment")
          set(inblock OFF)
        endif()
        continue()
      endif()
      string(REGEX REPLACE "^[ \t]*//! ?" "" code "${l}")
    endif()
    if(inblock)
      if((kind STREQUAL "md" AND code MATCHES "^[ \t]*```") OR (kind STREQUAL "hdr" AND code MATCHES "<BS>endcode"))
        math(EXPR last "${i} - 1")
        snip_add("${rel}" ${first} ${last} "${marker}" "${body}")
        set(inblock OFF)
      elseif(code STREQUAL "")
        list(APPEND body " ")   # an empty element would be lost at the list's start
      else()
        list(APPEND body "${code}")
      endif()
      continue()
    endif()
    if(kind STREQUAL "md" AND other_fence)
      if(code MATCHES "^[ \t]*```")
        set(other_fence OFF)
      endif()
      continue()
    endif()
    set(opens OFF)
    if(kind STREQUAL "md" AND code MATCHES "^[ \t]*```[ \t]*(cpp|c\\+\\+)[ \t]*$")
      set(opens ON)
    elseif(kind STREQUAL "md" AND code MATCHES "^[ \t]*```")
      set(other_fence ON)
    elseif(kind STREQUAL "hdr" AND code MATCHES "^[ \t]*<BS>code({[^}]*})?[ \t]*$")
      set(opens ON)
    elseif(kind STREQUAL "hdr" AND code MATCHES "<BS>code")
      list(APPEND malformed "${rel}:${i}: a \\code line with more on it: put the code on the next lines")
    endif()
    if(pending_marker_line GREATER 0 AND NOT opens)
      list(APPEND malformed "${rel}:${pending_marker_line}: a snippet marker must be on the line right before a C++ block")
      set(pending_marker_line 0)
    endif()
    if(opens)
      set(inblock ON)
      set(first ${i})
      set(body "")
      set(marker "")
      if(pending_marker_line GREATER 0)
        set(marker "${pending_marker}")
        set(pending_marker_line 0)
      endif()
    elseif(code MATCHES "^[ \t]*<!--[ \t]*snippet")   # a marker is a line of its own
      if(code MATCHES "${marker_re}")
        set(pending_marker "${CMAKE_MATCH_1}")
        set(pending_marker_line ${i})
      else()
        list(APPEND malformed "${rel}:${i}: a malformed snippet marker (<!-- snippet: OPTION; ... -->)")
      endif()
    endif()
  endforeach()
  if(inblock)
    list(APPEND malformed "${rel}:${first}: a C++ block that is never closed")
  endif()
  if(pending_marker_line GREATER 0)
    list(APPEND malformed "${rel}:${pending_marker_line}: a snippet marker must be on the line right before a C++ block")
  endif()
  foreach(v malformed nblock blocks skipped gen_host gen_torch gen_cuda inc_host inc_torch inc_cuda)
    set(${v} "${${v}}" PARENT_SCOPE)
  endforeach()
endfunction()

# Writes and compiles one unit; sets failed_<unit> to the compiler's output on failure
# and time_<unit> to the seconds it took.
function(snip_compile unit ext)
  set(src ${WORK_DIR}/doc_snippets_${unit}.${ext})
  # The prelude first (commpact.hpp, then mpi_comm.hpp with MPI, README.md's order).
  set(text "// Generated by tests/package/check_doc_snippets.cmake from the docs' C++ blocks: do not edit.\n")
  string(APPEND text "#include \"${prelude}\"\n")
  foreach(i IN LISTS inc_${unit})
    string(APPEND text "#include ${i}\n")
  endforeach()
  string(APPEND text "${gen_${unit}}")
  file(WRITE ${src} "${text}")
  string(TIMESTAMP t0 "%s%f")
  execute_process(COMMAND ${ARGN} ${src} WORKING_DIRECTORY ${WORK_DIR}
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  string(TIMESTAMP t1 "%s%f")
  # %s%f: seconds then microseconds (CMake 3.23+); the difference in milliseconds
  if(t0 MATCHES "^[0-9]+$" AND t1 MATCHES "^[0-9]+$")
    string(SUBSTRING "${t0}" 0 13 t0)
    string(SUBSTRING "${t1}" 0 13 t1)
    math(EXPR ms "${t1} - ${t0}")
  else()
    string(REGEX REPLACE "[^0-9].*$" "" t0 "${t0}")
    string(REGEX REPLACE "[^0-9].*$" "" t1 "${t1}")
    math(EXPR ms "(${t1} - ${t0}) * 1000")
  endif()
  math(EXPR s "${ms} / 1000")
  math(EXPR frac "(${ms} % 1000) / 100")
  set(time_${unit} "${s}.${frac} s" PARENT_SCOPE)
  if(NOT rc EQUAL 0)
    set(failed_${unit} "${out}" PARENT_SCOPE)
  endif()
endfunction()

# The blocks (file:first) that the compiler's output points into.
function(snip_failing_blocks out result_var)
  string(REPLACE ";" "," out "${out}")
  string(REPLACE "\n" ";" olines "${out}")
  set(found "")
  foreach(o IN LISTS olines)
    if(NOT o MATCHES "(error|required from|detected during)")
      continue()
    endif()
    foreach(b IN LISTS blocks)
      string(REPLACE "|" ";" b "${b}")
      list(GET b 0 f)
      list(GET b 1 first)
      list(GET b 2 last)
      string(REPLACE "." "\\." fre "${f}")
      # g++/clang++: file:N:col; nvcc: file(N) and "at line N of file"
      string(REGEX MATCHALL "(^|[ \t(\"])${fre}[:(]([0-9]+)" hits "${o}")
      string(REGEX MATCHALL "line [0-9]+ of \"?${fre}" nv "${o}")
      foreach(h IN LISTS nv)
        string(REGEX REPLACE "^line ([0-9]+) of .*$" "x:\\1" h "${h}")
        list(APPEND hits "${h}")
      endforeach()
      foreach(h IN LISTS hits)
        string(REGEX REPLACE ".*[:(]([0-9]+)$" "\\1" n "${h}")
        # up to last + 2: the wrapper's closing braces (an unbalanced block) map there
        math(EXPR end "${last} + 2")
        if(n GREATER first AND NOT n GREATER end)
          list(APPEND found "${f}:${first}")
        endif()
      endforeach()
    endforeach()
  endforeach()
  list(REMOVE_DUPLICATES found)
  set(${result_var} "${found}" PARENT_SCOPE)
endfunction()

if(DEFINED SELF_TEST)
  foreach(v ROOT CXX)
    if(NOT ${v})
      message(FATAL_ERROR "check_doc_snippets: -D${v}= is required")
    endif()
  endforeach()
  set(t ${SELF_TEST}/tree)
  file(REMOVE_RECURSE ${SELF_TEST})
  # Planted errors are marked PLANTED on the line of their block's fence.
  file(WRITE ${t}/README.md [=[
# planted
```sh
echo this is not C++
```

```cpp
std::vector<float> v(4, 1.0f);
commpact::host::scale(std::span(v), 0.5f);
```

<!-- snippet: namespace -->
```c++ PLANTED
template <class T> void bad_body(T x) { x.no_such_member(); }   // only wrong when instantiated
inline void use() { bad_body(1); }   // -fsyntax-only still instantiates it
```
]=])
  file(WRITE ${t}/docs/planted.md [=[
# planted

<!-- snippet: skip (a listing) -->
```cpp
this is not C++ and is skipped
```

<!-- snippet: comm=commpact::ThreadComm -->
```cpp
commpact::Dense<commpact::ThreadComm> avg{comm};
avg.reduce(std::span(grads));
```

```cpp PLANTED
commpact::Dense<commpact::ThreadComm> avg{comm};
avg.reduce_everything(std::span(grads));
```
]=])
  file(WRITE ${t}/include/commpact/planted.hpp [=[
// SPDX-License-Identifier: Apache-2.0
//! \file planted.hpp
//! \code
//! commpact::TopK<commpact::ThreadComm> topk{comm, {.density = 0.01}};
//! topk.reduce(std::span(grads));
//! \endcode
//! <!-- snippet: namespace -->
//! \code PLANTED
//! struct S { int f() { return undeclared_name; } };
//! \endcode
]=])
  # The markers themselves are kept out of the files the check reads: fences and \code
  # lines must be plain. Record the PLANTED lines, then remove the word.
  set(want "")
  foreach(rel README.md docs/planted.md include/commpact/planted.hpp)
    file(STRINGS ${t}/${rel} ls)
    set(n 0)
    foreach(l IN LISTS ls)
      math(EXPR n "${n} + 1")
      if(l MATCHES "PLANTED")
        list(APPEND want "${rel}:${n}")
      endif()
    endforeach()
    file(READ ${t}/${rel} c)
    string(REPLACE " PLANTED" "" c "${c}")
    file(WRITE ${t}/${rel} "${c}")
  endforeach()
  set(args -DROOT=${t} -DCXX=${CXX} "-DINCLUDES=${ROOT}/include|${INCLUDES}")
  function(run_check tag min out_var rc_var)
    execute_process(COMMAND ${CMAKE_COMMAND} ${args} -DWORK_DIR=${SELF_TEST}/${tag} -DMIN_BLOCKS=${min}
      -P ${CMAKE_CURRENT_LIST_FILE} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
    set(${out_var} "${out}" PARENT_SCOPE)
    set(${rc_var} "${rc}" PARENT_SCOPE)
  endfunction()
  run_check(broken 7 out rc)
  if(rc EQUAL 0)
    message(FATAL_ERROR "self-test: the check passed on planted broken blocks:\n${out}")
  endif()
  string(REGEX MATCHALL "FAILED: [^ \n]+" got "${out}")
  string(REPLACE "FAILED: " "" got "${got}")
  list(SORT got)
  list(SORT want)
  if(NOT got STREQUAL want)
    message(FATAL_ERROR "self-test: the check named [${got}] but the planted broken blocks are [${want}]:\n${out}")
  endif()
  foreach(w IN LISTS want)
    # the compiler's own message points into the doc file (the #line mapping)
    string(REGEX REPLACE ":[0-9]+$" "" wf "${w}")
    if(NOT out MATCHES "${wf}:[0-9]+:[0-9]+: error")
      message(FATAL_ERROR "self-test: no compiler error located in ${wf}:\n${out}")
    endif()
  endforeach()
  if(NOT out MATCHES "docs/planted.md:4: skipped \\(a listing\\)")
    message(FATAL_ERROR "self-test: the skip was not reported:\n${out}")
  endif()
  # Too few blocks fails even when everything compiles: fix the planted errors first.
  foreach(rel README.md docs/planted.md include/commpact/planted.hpp)
    file(READ ${t}/${rel} c)
    string(REPLACE "x.no_such_member();" "(void)x;" c "${c}")
    string(REPLACE "reduce_everything" "reduce" c "${c}")
    string(REPLACE "undeclared_name" "0" c "${c}")
    file(WRITE ${t}/${rel} "${c}")
  endforeach()
  run_check(good 7 out rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "self-test: the check failed on the repaired blocks:\n${out}")
  endif()
  run_check(few 8 out rc)
  if(rc EQUAL 0 OR NOT out MATCHES "only 7 C\\+\\+ blocks")
    message(FATAL_ERROR "self-test: the check passed with fewer blocks than MIN_BLOCKS:\n${out}")
  endif()
  file(APPEND ${t}/docs/planted.md "\n<!-- snippet: namespce -->\n```cpp\nint x = 0;\n```\n")
  run_check(marker 7 out rc)
  if(rc EQUAL 0 OR NOT out MATCHES "docs/planted.md:[0-9]+: unknown snippet option 'namespce'")
    message(FATAL_ERROR "self-test: the check passed with a malformed marker:\n${out}")
  endif()
  file(APPEND ${t}/docs/planted.md "\n<!-- snippet: skip () -->\n\nsome text\n")
  run_check(marker2 7 out rc)
  if(rc EQUAL 0 OR NOT out MATCHES "right before a C\\+\\+ block")
    message(FATAL_ERROR "self-test: the check passed with a stray marker:\n${out}")
  endif()
  list(LENGTH want nw)
  message(STATUS "self-test: the ${nw} planted broken blocks were named (file:line), and nothing else; "
    "too few blocks, an unknown option and a stray marker fail")
  return()
endif()

foreach(v ROOT WORK_DIR CXX)
  if(NOT ${v})
    message(FATAL_ERROR "check_doc_snippets: -D${v}= is required")
  endif()
endforeach()
if(NOT DEFINED MIN_BLOCKS)
  set(MIN_BLOCKS 60)
endif()
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})

set(nblock 0)
set(blocks "")
set(skipped "")
set(malformed "")
foreach(u host torch cuda)
  set(gen_${u} "")
  set(inc_${u} "")
endforeach()
file(GLOB docs RELATIVE ${ROOT} ${ROOT}/README.md ${ROOT}/docs/*.md)
file(GLOB_RECURSE headers RELATIVE ${ROOT} ${ROOT}/include/*.hpp ${ROOT}/include/*.cuh)
list(SORT docs)
list(SORT headers)
foreach(f IN LISTS docs)
  snip_scan(${ROOT}/${f} ${f} md)
endforeach()
foreach(f IN LISTS headers)
  snip_scan(${ROOT}/${f} ${f} hdr)
endforeach()
if(malformed)
  string(REPLACE ";" "\n  " m "${malformed}")
  message(FATAL_ERROR "check_doc_snippets: malformed blocks or markers:\n  ${m}")
endif()
if(nblock LESS MIN_BLOCKS)
  message(FATAL_ERROR "check_doc_snippets: only ${nblock} C++ blocks found under ${ROOT} "
    "(README.md, docs/*.md, include/), fewer than MIN_BLOCKS=${MIN_BLOCKS}: is the extraction broken?")
endif()

# Counts per unit and per file.
set(files "")
foreach(b IN LISTS blocks)
  string(REPLACE "|" ";" b "${b}")
  list(GET b 0 f)
  list(GET b 3 u)
  if((u STREQUAL "mpi" AND NOT MPI_INCLUDES) OR (u STREQUAL "torch" AND NOT TORCH_INCLUDES)
     OR (u STREQUAL "cuda" AND NOT NVCC))
    set(u "${u}-not-compiled")
  endif()
  string(MAKE_C_IDENTIFIER "${f}" fid)
  if(NOT DEFINED n_${fid})
    list(APPEND files ${f})
    set(n_${fid} 0)
  endif()
  math(EXPR n_${fid} "${n_${fid}} + 1")
  if(NOT DEFINED n_${fid}_${u})
    set(n_${fid}_${u} 0)
  endif()
  math(EXPR n_${fid}_${u} "${n_${fid}_${u}} + 1")
  if(NOT DEFINED count_${u})
    set(count_${u} 0)
  endif()
  math(EXPR count_${u} "${count_${u}} + 1")
endforeach()
set(kinds host mpi torch cuda skip mpi-not-compiled torch-not-compiled cuda-not-compiled)
foreach(f IN LISTS files)
  string(MAKE_C_IDENTIFIER "${f}" fid)
  set(parts "")
  foreach(u IN LISTS kinds)
    if(DEFINED n_${fid}_${u})
      list(APPEND parts "${n_${fid}_${u}} ${u}")
    endif()
  endforeach()
  string(REPLACE ";" ", " parts "${parts}")
  message(STATUS "check_doc_snippets: ${f}: ${n_${fid}} (${parts})")
endforeach()
foreach(s IN LISTS skipped)
  message(STATUS "check_doc_snippets: ${s}")
endforeach()
set(parts "")
foreach(u IN LISTS kinds)
  if(DEFINED count_${u})
    list(APPEND parts "${count_${u}} ${u}")
  endif()
endforeach()
string(REPLACE ";" ", " parts "${parts}")
message(STATUS "check_doc_snippets: ${nblock} blocks: ${parts}")
if(count_mpi-not-compiled OR count_torch-not-compiled OR count_cuda-not-compiled)
  message(STATUS "check_doc_snippets: the *-not-compiled blocks need MPI_INCLUDES, TORCH_INCLUDES or NVCC")
endif()

split_dirs("${INCLUDES}" inc)
set(inc -I${ROOT}/include ${inc})
set(failures "")
set(report "")

if(MPI_INCLUDES)
  split_dirs("${MPI_INCLUDES}" mpi_inc)
  set(host_flags -DCOMMPACT_HAS_MPI=1 -DCOMMPACT_DOC_SNIPPETS_MPI=1 ${mpi_inc})
else()
  set(host_flags "")
endif()

macro(snip_report unit)
  if(DEFINED failed_${unit})
    snip_failing_blocks("${failed_${unit}}" fb)
    foreach(b IN LISTS fb)
      string(APPEND failures "FAILED: ${b} (in the ${unit} unit)\n")
    endforeach()
    if(NOT fb)
      string(APPEND failures "FAILED: the ${unit} unit (no block named by the compiler: the prelude or a hoisted #include?)\n")
    endif()
    string(APPEND report "---- ${unit} unit: ${WORK_DIR}/doc_snippets_${unit}.${ext_${unit}}\n${failed_${unit}}\n")
  endif()
  message(STATUS "check_doc_snippets: the ${unit} unit compiled in ${time_${unit}}")
endmacro()

set(ext_host cpp)
set(ext_torch cpp)
set(ext_cuda cu)
snip_compile(host cpp ${CXX} -std=c++20 -fsyntax-only ${host_flags} ${inc})
snip_report(host)
if(TORCH_INCLUDES AND gen_torch)
  split_dirs("${TORCH_INCLUDES}" torch_inc)
  string(REPLACE "|" ";" torch_defs "${TORCH_DEFINES}")
  list(TRANSFORM torch_defs PREPEND -D)
  snip_compile(torch cpp ${CXX} -std=c++20 -fsyntax-only -DCOMMPACT_DOC_SNIPPETS_TORCH=1 ${torch_defs}
    ${inc} ${torch_inc})
  snip_report(torch)
endif()
if(NVCC AND gen_cuda)
  split_dirs("${CUDA_INCLUDES}" cuda_inc)
  # -ptx: nvcc's front end checks (and instantiates) host and device code, cicc compiles
  # the device code; no ptxas and no host compiler pass (14 s here, against 35 s for -c).
  snip_compile(cuda cu ${NVCC} ${cuda_inc} -std=c++20 -arch=sm_90 --extended-lambda
    -diag-suppress=1675 -DCOMMPACT_HAS_CUDA=1 -DCOMMPACT_DOC_SNIPPETS_CUDA=1 ${inc}
    -ptx -o ${WORK_DIR}/doc_snippets_cuda.ptx)
  snip_report(cuda)
endif()
if(failures)
  # NOTICE prints the compiler's output as it is (FATAL_ERROR would rewrap it)
  message(NOTICE "${report}\ncheck_doc_snippets: C++ blocks of the docs do not compile:\n${failures}")
  message(FATAL_ERROR "check_doc_snippets: C++ blocks of the docs do not compile (above: the compiler's errors, then the blocks)")
endif()
message(STATUS "check_doc_snippets: ${nblock} blocks found, every compiled one compiles")
