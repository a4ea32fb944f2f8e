# Fails naming file:line for every call in the public headers (include/**/*.hpp, *.cuh)
# that breaks the device discipline (docs: DESIGN.md, "Device discipline"):
#   - cudaDeviceSynchronize;
#   - the synchronous allocation and copy calls: cudaMalloc( and cudaFree( (the stream-
#     ordered cudaMallocAsync/cudaFreeAsync and the pinned cudaMallocHost/cudaFreeHost/
#     cudaHostAlloc are fine), cudaMemcpy( and cudaMemset( (and their 2D/3D/Peer/Symbol
#     forms; the *Async forms are fine);
#   - cudaStreamSynchronize, except on a line carrying the allow marker
#     "// commpact-discipline: allow <reason>" (a documented set-up-time fallback);
#   - an asynchronous call (cuda*Async) whose stream is the legacy default stream: a last
#     argument of 0, nullptr, NULL, cudaStreamLegacy or {} , or one of the common calls
#     given too few arguments (C++'s default stream argument is 0);
#   - a kernel launch <<<...>>> without a stream, or with one of the values above;
#   - isSuccess( (c10d::Work's: ProcessGroupNCCL's WorkNCCL throws NotImplementedError
#     from it since PyTorch 2.x, which PyTorch 1.13's Gloo tests cannot show; found on a
#     GPU on 2026-12-05): read exception(), null when the work succeeded.
# Lines that start with // are comments and are not checked; a trailing // comment is
# stripped before the checks. The allow marker works on any rule, needs a reason, and
# the tree may hold at most `max_allowed` of them (raise it in review, not in passing).
#
#   cmake -DROOT=<source dir> -P check_device_discipline.cmake
#   cmake -DSELF_TEST=<scratch dir> -P check_device_discipline.cmake
# SELF_TEST writes headers with planted violations (and lawful look-alikes) under the
# scratch folder and fails unless exactly the planted lines are reported.

cmake_minimum_required(VERSION 3.20)
include(${CMAKE_CURRENT_LIST_DIR}/header_lines.cmake)

set(max_allowed 4)
set(allow_marker "// commpact-discipline: allow")
set(legacy_stream_re "^(0|0u|0U|0l|0L|nullptr|NULL|cudaStreamLegacy|\\{\\}|cudaStream_t\\{\\}|cudaStream_t\\(0\\)|cudaStream_t\\(\\)|\\(cudaStream_t\\)0|\\(cudaStream_t\\)nullptr)$")

# Fewest arguments of the common asynchronous calls (the stream included).
set(min_args_cudaMemcpyAsync 5)
set(min_args_cudaMemsetAsync 4)
set(min_args_cudaMallocAsync 3)
set(min_args_cudaFreeAsync 2)
set(min_args_cudaMemcpy2DAsync 8)
set(min_args_cudaMemset2DAsync 6)
set(min_args_cudaMemset3DAsync 4)
set(min_args_cudaMemcpy3DAsync 2)
set(min_args_cudaMemcpyPeerAsync 6)
set(min_args_cudaMemcpyToSymbolAsync 6)
set(min_args_cudaMemcpyFromSymbolAsync 6)
set(min_args_cudaMallocFromPoolAsync 4)

# Splits the text between a call's parentheses (or a launch's <<< >>>) at its top-level
# commas into `out_var` (a list of trimmed arguments; placeholders kept).
function(split_args text out_var)
  string(LENGTH "${text}" len)
  set(depth 0)
  set(cur "")
  set(args "")
  math(EXPR last "${len} - 1")
  if(len GREATER 0)
    foreach(i RANGE 0 ${last})
      string(SUBSTRING "${text}" ${i} 1 c)
      if(c STREQUAL "(" OR c STREQUAL "{")
        math(EXPR depth "${depth} + 1")
      elseif(c STREQUAL ")" OR c STREQUAL "}")
        math(EXPR depth "${depth} - 1")
      endif()
      if(c STREQUAL "," AND depth EQUAL 0)
        string(STRIP "${cur}" cur)
        list(APPEND args "${cur}")
        set(cur "")
      else()
        string(APPEND cur "${c}")
      endif()
    endforeach()
  endif()
  string(STRIP "${cur}" cur)
  if(NOT cur STREQUAL "" OR args)
    list(APPEND args "${cur}")
  endif()
  set(${out_var} "${args}" PARENT_SCOPE)
endfunction()

# The text from `text`'s start up to the parenthesis that closes the one just before it
# (depth 1 at the start), or the whole text when it does not close; `out_var` gets what is
# inside, `closed_var` TRUE when it closed.
function(take_parenthesised text out_var closed_var)
  string(LENGTH "${text}" len)
  set(depth 1)
  set(inner "")
  set(closed FALSE)
  math(EXPR last "${len} - 1")
  if(len GREATER 0)
    foreach(i RANGE 0 ${last})
      string(SUBSTRING "${text}" ${i} 1 c)
      if(c STREQUAL "(")
        math(EXPR depth "${depth} + 1")
      elseif(c STREQUAL ")")
        math(EXPR depth "${depth} - 1")
        if(depth EQUAL 0)
          set(closed TRUE)
          break()
        endif()
      endif()
      string(APPEND inner "${c}")
    endforeach()
  endif()
  set(${out_var} "${inner}" PARENT_SCOPE)
  set(${closed_var} ${closed} PARENT_SCOPE)
endfunction()

# Appends "rel:line: message" to the list `found_var` for every violation in `file`, and
# the number of allow markers to `allowed_var`.
function(scan_file file rel found_var allowed_var)
  set(found ${${found_var}})
  set(allowed ${${allowed_var}})
  commpact_header_lines("${file}" lines code)
  list(LENGTH lines nlines)
  if(nlines EQUAL 0)
    return()
  endif()
  math(EXPR lastline "${nlines} - 1")
  foreach(i RANGE 0 ${lastline})
    list(GET lines ${i} line)
    list(GET code ${i} c)
    math(EXPR ln "${i} + 1")
    set(where "${rel}:${ln}")
    string(FIND "${line}" "${allow_marker}" at)
    if(at GREATER -1 AND NOT line MATCHES "^[ \t]*//")
      string(SUBSTRING "${line}" ${at} -1 marker)
      string(REGEX REPLACE "^// commpact-discipline: allow[ \t]*" "" reason "${marker}")
      if(reason STREQUAL "")
        list(APPEND found "${where}: the allow marker gives no reason")
      else()
        math(EXPR allowed "${allowed} + 1")
        continue()
      endif()
    endif()
    if(c MATCHES "isSuccess[ \t]*\\(")
      list(APPEND found "${where}: isSuccess( of a c10d::Work (ProcessGroupNCCL's WorkNCCL throws NotImplementedError there since PyTorch 2.x: read exception(), null when it succeeded)")
    endif()
    if(c MATCHES "cudaDeviceSynchronize")
      list(APPEND found "${where}: cudaDeviceSynchronize (waits for every stream on the device: fence the executor)")
    endif()
    if(c MATCHES "cuda(Malloc|Free)[ \t]*\\(")
      list(APPEND found "${where}: cuda${CMAKE_MATCH_1}( (synchronous: use the executor's stream-ordered allocator hook)")
    endif()
    if(c MATCHES "cudaMem(cpy|set)(2D|3D|Peer|ToSymbol|FromSymbol)?[ \t]*\\(")
      list(APPEND found "${where}: cudaMem${CMAKE_MATCH_1}${CMAKE_MATCH_2}( (synchronous: use the Async form on the executor's stream)")
    endif()
    if(c MATCHES "cudaStreamSynchronize")
      list(APPEND found "${where}: cudaStreamSynchronize (a host wait with no deadline: fence the executor, or mark a set-up-time fallback '${allow_marker} <reason>')")
    endif()
    # Asynchronous calls: the stream argument (the call may run over the next lines).
    set(rest "${c}")
    while(rest MATCHES "(cuda[A-Za-z0-9_]*Async)[ \t]*\\((.*)$")
      set(fn "${CMAKE_MATCH_1}")
      set(tail "${CMAKE_MATCH_2}")
      set(j ${i})
      set(text "${tail}")
      take_parenthesised("${text}" inner closed)
      while(NOT closed AND j LESS lastline)
        math(EXPR j "${j} + 1")
        math(EXPR span "${j} - ${i}")
        if(span GREATER 8)
          break()
        endif()
        list(GET code ${j} more)
        string(APPEND text " ${more}")
        take_parenthesised("${text}" inner closed)
      endwhile()
      split_args("${inner}" args)
      list(LENGTH args nargs)
      set(bad "")
      if(nargs GREATER 0)
        list(GET args -1 lastarg)
        if(lastarg MATCHES "${legacy_stream_re}")
          set(bad "its stream is the legacy default stream (${lastarg})")
        endif()
      endif()
      if(DEFINED min_args_${fn} AND nargs LESS ${min_args_${fn}})
        set(bad "it passes no stream (${nargs} arguments: C++'s default stream is the legacy one)")
      endif()
      if(bad)
        list(APPEND found "${where}: ${fn}: ${bad}, pass the executor's stream")
      endif()
      set(rest "${tail}")
    endwhile()
    # Kernel launches: <<<grid, block, shared, stream>>>.
    set(rest "${c}")
    while(rest MATCHES "<<<(.*)$")
      set(tail "${CMAKE_MATCH_1}")
      set(j ${i})
      set(text "${tail}")
      while(NOT text MATCHES ">>>" AND j LESS lastline)
        math(EXPR j "${j} + 1")
        math(EXPR span "${j} - ${i}")
        if(span GREATER 4)
          break()
        endif()
        list(GET code ${j} more)
        string(APPEND text " ${more}")
      endwhile()
      string(FIND "${text}" ">>>" close)
      if(close GREATER -1)
        string(SUBSTRING "${text}" 0 ${close} cfg)
        split_args("${cfg}" args)
        list(LENGTH args nargs)
        if(nargs LESS 4)
          list(APPEND found "${where}: a kernel launch without a stream (<<<${cfg}>>> runs on the legacy default stream), pass the executor's stream")
        else()
          list(GET args 3 s)
          if(s MATCHES "${legacy_stream_re}")
            list(APPEND found "${where}: a kernel launch on the legacy default stream (${s}), pass the executor's stream")
          endif()
        endif()
      endif()
      set(rest "${tail}")
    endwhile()
  endforeach()
  set(${found_var} "${found}" PARENT_SCOPE)
  set(${allowed_var} "${allowed}" PARENT_SCOPE)
endfunction()

if(DEFINED SELF_TEST)
  # Planted violations (marked PLANT in a trailing comment) and lawful look-alikes.
  set(dir "${SELF_TEST}/include")
  file(MAKE_DIRECTORY "${dir}")
  file(WRITE "${dir}/planted.cuh" [=[
// cudaDeviceSynchronize(); in a comment line is fine
//! cudaMalloc(&p, n) in a doc comment is fine
inline void bad(void* p, const void* q, std::size_t n, cudaStream_t s) {
  cudaDeviceSynchronize();  // PLANT
  cudaMalloc(&p, n);  // PLANT
  cudaFree(p);  // PLANT
  cudaMemcpy(p, q, n, cudaMemcpyDeviceToDevice);  // PLANT
  cudaMemset(p, 0, n);  // PLANT
  cudaStreamSynchronize(s);  // PLANT
  cudaMemcpyAsync(p, q, n, cudaMemcpyDeviceToDevice, 0);  // PLANT
  cudaMemsetAsync(p, 0, n, nullptr);  // PLANT
  cudaMemsetAsync(p, 0, n);  // PLANT
  cudaFreeAsync(p, cudaStreamLegacy);  // PLANT
  cudaMemcpyAsync(p, q, n,  // PLANT
                  cudaMemcpyDeviceToDevice, 0);
  check(cudaMallocAsync(&p, n, 0), "cudaMallocAsync (p)");  // PLANT
  kernel<<<grid, block>>>(p);  // PLANT
  kernel<<<1, 32, 0, 0>>>(p);  // PLANT
  if (!work->isSuccess()) fail();  // PLANT
  cudaStreamSynchronize(s);  // commpact-discipline: allow
}
inline void good(void* p, const void* q, std::size_t n, cudaStream_t s, int* h) {
  cudaMallocAsync(&p, n, s);
  cudaFreeAsync(p, s);
  cudaMallocHost(&p, n);
  cudaFreeHost(p);
  cudaHostAlloc(&p, n, cudaHostAllocPortable);
  cudaMemcpyAsync(p, q, n, cudaMemcpyDeviceToDevice, s);
  cudaMemsetAsync(static_cast<char*>(p) + (n - 1), 0, std::min<std::size_t>(n, 1), s);
  cudaMemcpyAsync(p, q, n, cudaMemcpyDeviceToDevice,
                  e.stream());
  check(cudaMemsetAsync(p, 0xFF, n * sizeof(float), s), "cudaMemsetAsync (poison)");
  kernel<<<grid, block, 0, s>>>(p, h[0]);
  kernel<<<cuda_kernels::detail::vec_grid(n), cuda_kernels::detail::vec_block, 0,
           e.stream()>>>(p);
  cudaStreamSynchronize(s);  // commpact-discipline: allow a set-up-time fallback, in the self-test
  foo();  // cudaDeviceSynchronize in a trailing comment is fine
  if (work->exception()) fail();
}
]=])
  set(found "")
  set(allowed 0)
  scan_file("${dir}/planted.cuh" "planted.cuh" found allowed)
  file(READ "${dir}/planted.cuh" ptext)
  commpact_protect(ptext)
  string(REPLACE "\n" ";" plines "${ptext}")
  set(want "")
  set(ln 0)
  foreach(l IN LISTS plines)
    math(EXPR ln "${ln} + 1")
    if(l MATCHES "// PLANT$" OR l MATCHES "commpact-discipline: allow$")
      list(APPEND want "planted.cuh:${ln}")
    endif()
  endforeach()
  set(got "")
  foreach(f IN LISTS found)
    string(REGEX MATCH "^[^:]+:[0-9]+" w "${f}")
    list(APPEND got "${w}")
  endforeach()
  list(REMOVE_DUPLICATES got)
  if(NOT got STREQUAL want OR NOT allowed EQUAL 1)
    string(REPLACE ";" "\n  " f "${found}")
    message(FATAL_ERROR "the discipline check's self-test failed:\n want  ${want}\n got   ${got}\n"
      " allowed ${allowed} (want 1)\n reports:\n  ${f}")
  endif()
  list(LENGTH want n)
  message(STATUS "the discipline check reports all ${n} planted violations and nothing else")
  return()
endif()

if(NOT DEFINED ROOT)
  message(FATAL_ERROR "pass -DROOT=<source dir> (or -DSELF_TEST=<scratch dir>)")
endif()
file(GLOB_RECURSE headers RELATIVE ${ROOT} ${ROOT}/include/*.hpp ${ROOT}/include/*.cuh)
list(SORT headers)
list(LENGTH headers n)
if(n EQUAL 0)
  message(FATAL_ERROR "no headers under ${ROOT}/include: is ROOT the source folder?")
endif()
set(found "")
set(allowed 0)
foreach(h IN LISTS headers)
  scan_file("${ROOT}/${h}" "${h}" found allowed)
endforeach()
if(found)
  string(REPLACE ";" "\n  " f "${found}")
  commpact_unprotect(f)
  message(FATAL_ERROR "the device discipline is broken in the public headers (DESIGN.md, \"Device discipline\"):\n  ${f}")
endif()
if(allowed GREATER max_allowed)
  message(FATAL_ERROR "${allowed} lines carry '${allow_marker}', more than the ${max_allowed} this check allows; "
    "remove a fallback, or raise max_allowed in tests/package/check_device_discipline.cmake in review.")
endif()
message(STATUS "the device discipline holds in all ${n} public headers (${allowed} allowed set-up-time fallbacks)")
