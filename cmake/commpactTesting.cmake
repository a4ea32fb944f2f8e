# Helpers for commpact's own tests, benchmarks and examples (not installed).
#
# Files are discovered by name, so each area adds files without editing CMake:
#   tests/test_*.cpp           host Catch2 tests, one executable each; a line
#                              `// commpact-long-test` marks one that runs long
#                              (COMMPACT_LONG_TEST_FLAGS)
#   tests/mpi/test_*.cpp       MPI Catch2 tests, run under mpiexec; a line
#                              `// commpact-mpi-ranks: 1 2 4` overrides the rank counts
#   tests/cuda/test_*.cu       CUDA tests; exit 77 (skipped) without a GPU
#   tests/compile_fail/*.cpp   must fail to compile with the message on the line
#                              `// expect: <regex>`
#   bench/bench_*.cpp          Google Benchmark programs
#   bench/cuda/bench_*.cu      CUDA benchmarks
#   examples/*.cpp             examples (also built by the tests, so docs compile)

add_library(commpact_test_flags INTERFACE)
target_compile_options(commpact_test_flags INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wno-unused-parameter>)
# Eigen is for commpact's own tests, examples and benchmarks only (spectra of mixing
# matrices, the demo's MLP); the library target commpact::commpact never links it. Every
# target here links commpact_test_flags, so each gets Eigen from this one line. (The
# consumer test checks that the installed headers build without it.)
target_link_libraries(commpact_test_flags INTERFACE Eigen3::Eigen)
if(COMMPACT_SANITIZE)
  target_compile_options(commpact_test_flags INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=${COMMPACT_SANITIZE} -fno-omit-frame-pointer -fno-sanitize-recover=all>)
  target_link_options(commpact_test_flags INTERFACE -fsanitize=${COMMPACT_SANITIZE})
endif()

set(COMMPACT_MPI_RANKS 1 2 3 4 5 8 CACHE STRING "Rank counts for MPI tests")
# A host test whose file has a line `// commpact-long-test` runs long. A build that sets
# COMMPACT_LONG_TEST_FLAGS compiles those tests with these flags after its own:
# scripts/test's sanitizer pass builds every other host test at -O0 (a third of -O1's
# compile time) and the long ones at -O2 (scripts/test says what each level costs).
set(COMMPACT_LONG_TEST_FLAGS "" CACHE STRING
    "Extra compile flags for the host tests marked '// commpact-long-test' (say -O2 in a -O0 sanitizer build)")
set(COMMPACT_TEST_TIMEOUT 600 CACHE STRING "Per-test timeout in seconds")
# ctest -j starts the tests in decreasing COST; a fresh build folder has no timings of its
# own (Testing/Temporary/CTestCostData.txt), so without a COST the longest tests start in
# declaration order and the run ends with them alone on the machine. The long ones carry a
# COST that only orders them: the package, pip and CUDA-object checks 40-70 (about their
# seconds in scripts/test's run on 2 cores, docs/notes/ci-time.md), the host tests marked
# commpact-long-test 30 (4 to 40 s there), every other test none.
set(COMMPACT_LONG_COST 30)

# COMMPACT_TEST_PCH: <catch2/catch.hpp> is precompiled once (commpact_catch_pch, and
# commpact_mpi_catch_pch for the MPI tests, whose MPI flags differ) and every test of the
# same flags reuses it (REUSE_FROM), instead of each parsing Catch2's 17,000 lines: about
# 1 s of g++'s compile of a test and 0.5-0.9 s of clang++'s (docs/notes/ci-time.md). A
# test built with COMMPACT_LONG_TEST_FLAGS has other flags (clang++ refuses a PCH built
# at another -O), so it parses the header itself.
option(COMMPACT_TEST_PCH "Precompile <catch2/catch.hpp> once for the Catch2 tests" ON)

# The target whose precompiled Catch2 header tests linking `libs` reuse (none: "").
function(commpact_catch_pch target)
  if(NOT COMMPACT_TEST_PCH)
    return()
  endif()
  add_library(${target} OBJECT ${PROJECT_SOURCE_DIR}/tests/common/catch_pch.cpp)
  target_link_libraries(${target} PRIVATE ${ARGN} Catch2::Catch2 commpact_test_flags)
  target_include_directories(${target} PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  target_precompile_headers(${target} PRIVATE <catch2/catch.hpp>)
endfunction()

# A host Catch2 test's program: its own (src is the test's file) or a unity group's. A
# test marked `// commpact-long-test` gets COMMPACT_LONG_TEST_FLAGS where they are set
# (and then parses Catch2 itself: clang++ refuses a PCH built at another -O).
function(commpact_catch_test_target target src)
  add_executable(${target} ${src})
  target_link_libraries(${target} PRIVATE commpact::commpact commpact_catch_main commpact_test_flags)
  target_include_directories(${target} PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  file(STRINGS ${src} long_line REGEX "^// commpact-long-test")
  if(long_line AND COMMPACT_LONG_TEST_FLAGS)
    separate_arguments(long_flags UNIX_COMMAND "${COMMPACT_LONG_TEST_FLAGS}")
    target_compile_options(${target} PRIVATE ${long_flags})
  elseif(TARGET commpact_catch_pch)
    target_precompile_headers(${target} REUSE_FROM commpact_catch_pch)
  endif()
endfunction()

# The ctest entry of the host test in src, running `program args...`.
function(commpact_catch_test_entries src program)
  get_filename_component(name ${src} NAME_WE)
  add_test(NAME ${name} COMMAND ${program} ${ARGN})
  set_tests_properties(${name} PROPERTIES LABELS host TIMEOUT ${COMMPACT_TEST_TIMEOUT})
  file(STRINGS ${src} long_line REGEX "^// commpact-long-test")
  if(long_line)  # started first (COMMPACT_LONG_COST), so that it does not end the run alone
    set_tests_properties(${name} PROPERTIES COST ${COMMPACT_LONG_COST})
  endif()
  commpact_test_locks(${src} ${name})
endfunction()

function(commpact_add_catch_test src)
  get_filename_component(name ${src} NAME_WE)
  commpact_catch_test_target(${name} ${src})
  commpact_catch_test_entries(${src} ${name})
endfunction()

# COMMPACT_TESTS_UNITY: the host and MPI Catch2 tests are compiled in groups of
# COMMPACT_TESTS_UNITY_SIZE files (in the order of their names, so that tests of one area
# share a group), one translation unit and one program per group, as the CUDA tests are
# below. Each test keeps its ctest entry, which runs its own test cases only: Catch2's
# filenames-as-tags gives every case the tag [#<file name>], and the entry runs
# `<group program> "[#test_x]~[.]" --filenames-as-tags --warn NoTests` (hidden cases stay hidden; a tag that
# matches nothing fails). Most of a test's compile is the headers and the library's
# templates, which a group parses and instantiates once: 8 compressor tests compiled in
# 115 s one by one and 69 s as one unit at g++ -O2, 85 s and 39 s at clang++ -O0 under
# ASan (docs/notes/ci-time.md). scripts/test turns it on for its g++ and clang++ builds;
# a test still builds alone by default, which is what a developer's build wants.
#
# A file that C++ cannot put inside a namespace (it replaces operator new or delete, or
# opens namespace commpact, std or Catch), that defines a macro or sets a pragma (which
# would reach the next file of its group), or that has compile flags of its own (source
# file properties) says so on a line `// commpact-standalone: <why>` and stays its own
# program; configure fails when such a file lacks the line. A test built with
# COMMPACT_LONG_TEST_FLAGS stays its own program too. Each grouped file keeps a program
# of its own as well, outside `all` (`cmake --build build --target test_x` builds it).
#
# The price: in a group a file sees its group-mates' includes, so a test that forgets an
# include of its own still builds there; the default build (one program per file) is
# where that shows.
option(COMMPACT_TESTS_UNITY "Compile the host and MPI Catch2 tests in groups, one translation unit each" OFF)
set(COMMPACT_TESTS_UNITY_SIZE 8 CACHE STRING "Test files per unity group (COMMPACT_TESTS_UNITY)")

# Whether src joins a unity group (out_var TRUE) or stays its own program.
function(commpact_unity_eligible src out_var)
  set(${out_var} FALSE PARENT_SCOPE)
  if(NOT COMMPACT_TESTS_UNITY)
    return()
  endif()
  file(STRINGS ${src} standalone REGEX "^// commpact-standalone")
  if(standalone)
    return()
  endif()
  file(STRINGS ${src} long_line REGEX "^// commpact-long-test")
  if(long_line AND COMMPACT_LONG_TEST_FLAGS)
    return()
  endif()
  # What C++ wants at global scope, and what would reach the next file of the group (a
  # macro, a pragma).
  file(STRINGS ${src} global_only
       REGEX "operator (new|delete)|^[ \t]*namespace[ \t]+(commpact|std|Catch)([ \t{:]|$)|^int main|^[ \t]*#[ \t]*(define|undef|pragma)|_Pragma")
  if(global_only)
    message(FATAL_ERROR "${src}: '${global_only}' cannot go inside a namespace or would reach the next file "
                        "(COMMPACT_TESTS_UNITY); add a line '// commpact-standalone: <why>' to build this test "
                        "as its own program")
  endif()
  # Flags of its own (set on the file before the tests are added) would be lost in a group.
  foreach(property COMPILE_OPTIONS COMPILE_DEFINITIONS COMPILE_FLAGS)
    get_source_file_property(value ${src} ${property})
    if(value)
      message(FATAL_ERROR "${src} has ${property} '${value}' of its own, which a group's unit would not get "
                          "(COMMPACT_TESTS_UNITY); add a line '// commpact-standalone: <why>' to build this test "
                          "as its own program")
    endif()
  endforeach()
  set(${out_var} TRUE PARENT_SCOPE)
endfunction()

# commpact_unity_text(<out_var> NAMES <name>... SOURCES <src>...): one translation unit of
# the sources. Every header they include comes first, at global scope (quoted ones by the
# path they name from the including file's folder, as the compiler looks there first),
# each under __has_include, as a file may include a header only where it exists; then
# each source inside a namespace of its own, commpact_unity_<name>, where its includes are
# then empty. So its helpers, anonymous namespaces included, keep apart from the others'.
function(commpact_unity_text out_var)
  cmake_parse_arguments(u "" "" "NAMES;SOURCES" ${ARGN})
  set(text "")
  set(seen "")
  foreach(src IN LISTS u_SOURCES)
    get_filename_component(dir ${src} DIRECTORY)
    file(STRINGS ${src} lines REGEX "^#include[ ]*[<\"]")
    foreach(line IN LISTS lines)
      string(REGEX REPLACE "^#include[ ]*([<\"][^>\"]*[>\"]).*" "\\1" inc "${line}")
      if(inc MATCHES "^\"(.*)\"$")  # (two ifs: CMAKE_MATCH_1 is set by the first)
        if(EXISTS "${dir}/${CMAKE_MATCH_1}")
          get_filename_component(path "${dir}/${CMAKE_MATCH_1}" ABSOLUTE)
          set(inc "\"${path}\"")
        endif()
      endif()
      if(NOT inc IN_LIST seen)
        list(APPEND seen "${inc}")
        string(APPEND text "#if __has_include(${inc})\n#include ${inc}\n#endif\n")
      endif()
    endforeach()
  endforeach()
  foreach(name src IN ZIP_LISTS u_NAMES u_SOURCES)
    string(APPEND text "\nnamespace commpact_unity_${name} {\n#include \"${src}\"\n}  // namespace commpact_unity_${name}\n")
  endforeach()
  set(${out_var} "${text}" PARENT_SCOPE)
endfunction()

# Splits `srcs` (sorted) into the fewest groups of at most COMMPACT_TESTS_UNITY_SIZE, of
# sizes that differ by one at most, and writes each group's unit, <prefix>_<i>.cpp in the
# current binary folder; sets <prefix>_GROUPS to the group count and <prefix>_<i>_SOURCES
# to each group's files, in the caller's scope.
function(commpact_unity_groups prefix)
  set(srcs ${ARGN})
  list(SORT srcs)
  list(LENGTH srcs n)
  math(EXPR count "(${n} + ${COMMPACT_TESTS_UNITY_SIZE} - 1) / ${COMMPACT_TESTS_UNITY_SIZE}")
  set(groups 0)
  set(i 0)
  while(i LESS n)
    math(EXPR end "(${groups} + 1) * ${n} / ${count}")
    set(group_srcs "")
    set(group_names "")
    while(i LESS end)
      list(GET srcs ${i} src)
      get_filename_component(name ${src} NAME_WE)
      list(APPEND group_srcs ${src})
      list(APPEND group_names ${name})
      math(EXPR i "${i} + 1")
    endwhile()
    commpact_unity_text(text NAMES ${group_names} SOURCES ${group_srcs})
    set(header "// Generated by cmake/commpactTesting.cmake (COMMPACT_TESTS_UNITY): ${group_names} as one\n")
    string(REPLACE ";" ", " header "${header}")
    # Rewritten only when it changes (no rebuild on a reconfigure).
    file(CONFIGURE OUTPUT ${CMAKE_CURRENT_BINARY_DIR}/${prefix}_${groups}.cpp
         CONTENT "${header}// translation unit (Catch2's -# gives each case the tag [#<its file>]).\n\n${text}" @ONLY)
    set(${prefix}_${groups}_SOURCES ${group_srcs} PARENT_SCOPE)
    math(EXPR groups "${groups} + 1")
  endwhile()
  set(${prefix}_GROUPS ${groups} PARENT_SCOPE)
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${srcs})
endfunction()

# The arguments that make a group's program run one file's test cases.
function(commpact_unity_filter src out_var)
  get_filename_component(name ${src} NAME_WE)
  set(${out_var} "[#${name}]~[.]" --filenames-as-tags --warn NoTests PARENT_SCOPE)
endfunction()

# commpact_add_test_files(<kind> <prefix> <src>...): every test file of one kind (catch:
# host Catch2 tests, mpi: MPI ones), each its own program (commpact_add_<kind>_test), or
# under COMMPACT_TESTS_UNITY in groups, programs <prefix>_<i>
# (commpact_<kind>_test_target, commpact_<kind>_test_entries).
function(commpact_add_test_files kind prefix)
  set(unity "")
  foreach(src IN LISTS ARGN)
    commpact_unity_eligible(${src} eligible)
    if(eligible)
      list(APPEND unity ${src})
    else()
      cmake_language(CALL commpact_add_${kind}_test ${src})
    endif()
  endforeach()
  if(NOT unity)
    return()
  endif()
  # Each grouped file's own program too, built only on request (`cmake --build build
  # --target test_x`, as the docs' measurement commands do), with no ctest entry.
  foreach(src IN LISTS unity)
    get_filename_component(name ${src} NAME_WE)
    if(kind STREQUAL "mpi")
      set(name mpi_${name})
    endif()
    cmake_language(CALL commpact_${kind}_test_target ${name} ${src})
    set_target_properties(${name} PROPERTIES EXCLUDE_FROM_ALL TRUE)
  endforeach()
  commpact_unity_groups(${prefix} ${unity})
  math(EXPR last "${${prefix}_GROUPS} - 1")
  foreach(g RANGE ${last})
    set(target ${prefix}_${g})
    cmake_language(CALL commpact_${kind}_test_target ${target} ${CMAKE_CURRENT_BINARY_DIR}/${target}.cpp)
    foreach(src IN LISTS ${prefix}_${g}_SOURCES)
      commpact_unity_filter(${src} filter)
      cmake_language(CALL commpact_${kind}_test_entries ${src} ${target} ${filter})
    endforeach()
  endforeach()
endfunction()

# A test whose file has a line `// commpact-lock: <name> ...` never runs at the same time
# as another test naming the same lock (ctest's RESOURCE_LOCK): dev-shm for the tests
# that look at what is in /dev/shm.
function(commpact_test_locks src test)
  file(STRINGS ${src} lock_line REGEX "^// commpact-lock:")
  if(lock_line)
    string(REGEX REPLACE "^// commpact-lock:[ ]*" "" locks "${lock_line}")
    separate_arguments(locks)
    set_tests_properties(${test} PROPERTIES RESOURCE_LOCK "${locks}")
  endif()
endfunction()

# COMMPACT_MPI_TESTS_SYNTAX_ONLY: the MPI tests are only compiled, with -fsyntax-only
# (an object library that writes no object), and not registered with ctest. scripts/test
# uses it in its clang++ pass, whose point for the MPI tests is that the second compiler
# accepts them: the front end, where every template is instantiated, is where g++ and
# clang++ differ, at about a sixth of a sanitized build's time.
option(COMMPACT_MPI_TESTS_SYNTAX_ONLY "Only check that the MPI tests compile (-fsyntax-only); do not build or run them" OFF)

# An MPI Catch2 test's program (src: the test's file or a unity group's); under
# COMMPACT_MPI_TESTS_SYNTAX_ONLY an object library compiled with -fsyntax-only.
function(commpact_mpi_test_target target src)
  if(COMMPACT_MPI_TESTS_SYNTAX_ONLY)
    add_library(${target} OBJECT ${src})
    target_link_libraries(${target} PRIVATE commpact::mpi Catch2::Catch2 commpact_test_flags)
    target_compile_options(${target} PRIVATE -fsyntax-only)
  else()
    add_executable(${target} ${src})
    target_link_libraries(${target} PRIVATE commpact::mpi commpact_mpi_catch_main commpact_test_flags)
  endif()
  target_include_directories(${target} PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  if(TARGET commpact_mpi_catch_pch)
    target_precompile_headers(${target} REUSE_FROM commpact_mpi_catch_pch)
  endif()
endfunction()

function(commpact_add_mpi_test src)
  get_filename_component(name ${src} NAME_WE)
  commpact_mpi_test_target(mpi_${name} ${src})
  commpact_mpi_test_entries(${src} mpi_${name})
endfunction()

# The ctest entries of the MPI test in src (mpi_<name>_np<P>, one per rank count), each
# running `mpiexec -n P <program> args...` (nothing under COMMPACT_MPI_TESTS_SYNTAX_ONLY).
function(commpact_mpi_test_entries src program)
  if(COMMPACT_MPI_TESTS_SYNTAX_ONLY)
    return()
  endif()
  get_filename_component(name ${src} NAME_WE)
  set(name mpi_${name})
  file(STRINGS ${src} ranks_line REGEX "commpact-mpi-ranks:")
  if(ranks_line)
    string(REGEX REPLACE ".*commpact-mpi-ranks:[ ]*" "" ranks "${ranks_line}")
    separate_arguments(ranks)
  else()
    set(ranks ${COMMPACT_MPI_RANKS})
  endif()
  foreach(np IN LISTS ranks)
    add_test(NAME ${name}_np${np}
      COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} --allow-run-as-root --oversubscribe
              ${MPIEXEC_PREFLAGS} $<TARGET_FILE:${program}> ${ARGN} ${MPIEXEC_POSTFLAGS})
    set_tests_properties(${name}_np${np} PROPERTIES LABELS mpi TIMEOUT ${COMMPACT_TEST_TIMEOUT} PROCESSORS 2
      ENVIRONMENT "OMPI_MCA_rmaps_base_oversubscribe=1;OMPI_MCA_btl=self,vader;OMPI_MCA_btl_vader_single_copy_mechanism=none")
    commpact_test_locks(${src} ${name}_np${np})
  endforeach()
endfunction()

# One CUDA program: its target, from src (one test's file, or the unity file below).
function(commpact_cuda_test_target name src uses_nccl)
  add_executable(${name} ${src})
  target_link_libraries(${name} PRIVATE commpact::cuda commpact_test_flags)
  if(uses_nccl)
    target_link_libraries(${name} PRIVATE commpact::nccl)
  endif()
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  # No --expt-relaxed-constexpr: the headers must compile as a user's project compiles
  # them (commpact::cuda carries no nvcc flag; the tests' device lambdas need
  # --extended-lambda). 1675: the host kernels' `#pragma GCC unroll`, which nvcc's front
  # end does not know.
  target_compile_options(${name} PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:--extended-lambda -diag-suppress=1675>)
endfunction()

# COMMPACT_CUDA_TESTS_UNITY: the CUDA tests are compiled as one translation unit, one
# program (cuda_tests_unity) that runs the test its argument names, still registered
# with ctest one test each (cuda_test_cuda_ops runs `cuda_tests_unity test_cuda_ops`).
# A CUDA test's own code is a small part of its compile: nvcc spends most of it on the
# headers (CUB, Thrust and the library's ~150 kernels, about 30 s of a test's 40-55 s at
# -O0), so one unit compiles the 16 tests in a fraction of their separate time
# (docs/notes/ci-time.md). scripts/test uses it where there is no GPU and the tests only
# skip; with a GPU, and in scripts/device-check, each test is its own program.
#
# The unit includes every header the tests include first, at global scope, then each
# test's file inside a namespace of its own (commpact_unity_<test>), where its includes
# are then empty and its main() is that namespace's. So a test's headers keep their names
# in namespaces of their own (no anonymous namespace at global scope), and what C++ wants
# at global scope (an explicit instantiation) goes in a header. A test whose file has the
# line `// commpact-cuda-standalone` stays its own program (test_space_names: it checks
# name lookup inside namespace commpact).
option(COMMPACT_CUDA_TESTS_UNITY "Compile the CUDA tests as one translation unit (a compile check where they cannot run)" OFF)

function(commpact_add_cuda_tests)
  set(unity_names "")
  set(unity_srcs "")
  set(unity_nccl FALSE)
  foreach(src IN LISTS ARGN)
    get_filename_component(name ${src} NAME_WE)
    # A test that includes NcclComm links NCCL (the nccl component), or is left out.
    file(STRINGS ${src} uses_nccl REGEX "nccl_comm.hpp")
    if(uses_nccl AND NOT TARGET commpact::nccl)
      message(STATUS "commpact: cuda_${name} is not built: ${commpact_nccl_REASON}")
      continue()
    endif()
    file(STRINGS ${src} standalone REGEX "^// commpact-cuda-standalone")
    if(COMMPACT_CUDA_TESTS_UNITY AND NOT standalone)
      list(APPEND unity_names ${name})
      list(APPEND unity_srcs ${src})
      if(uses_nccl)
        set(unity_nccl TRUE)
      endif()
      add_test(NAME cuda_${name} COMMAND cuda_tests_unity ${name})
    else()
      commpact_cuda_test_target(cuda_${name} ${src} "${uses_nccl}")
      add_test(NAME cuda_${name} COMMAND cuda_${name})
    endif()
    set_tests_properties(cuda_${name} PROPERTIES LABELS cuda SKIP_RETURN_CODE 77 TIMEOUT ${COMMPACT_TEST_TIMEOUT})
  endforeach()
  if(NOT unity_names)
    return()
  endif()
  # The unit (commpact_unity_text), then main().
  commpact_unity_text(tests NAMES ${unity_names} SOURCES ${unity_srcs})
  set(text "// Generated by cmake/commpactTesting.cmake (COMMPACT_CUDA_TESTS_UNITY): the CUDA tests as one\n")
  string(APPEND text "// translation unit. `cuda_tests_unity <test>` runs one of them.\n\n${tests}")
  set(table "")
  foreach(name IN LISTS unity_names)
    string(APPEND table "    {\"${name}\", &commpact_unity_${name}::main},\n")
  endforeach()
  string(APPEND text "
#include <cstdio>
#include <cstring>

int main(int argc, char** argv) {
  struct entry {
    const char* name;
    int (*run)();
  };
  static const entry tests[] = {
${table}  };
  if (argc == 2)
    for (const entry& t : tests)
      if (std::strcmp(t.name, argv[1]) == 0) return t.run();
  std::fprintf(stderr, \"usage: %s <test>, the test one of:\\n\", argv[0]);
  for (const entry& t : tests) std::fprintf(stderr, \"  %s\\n\", t.name);
  return 2;
}
")
  # Rewritten only when it changes (no rebuild on a reconfigure). An edited test's
  # includes come into the list at the next configure, which every edit of a test triggers.
  file(CONFIGURE OUTPUT ${CMAKE_CURRENT_BINARY_DIR}/cuda_tests_unity.cu CONTENT "${text}" @ONLY)
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${unity_srcs})
  commpact_cuda_test_target(cuda_tests_unity ${CMAKE_CURRENT_BINARY_DIR}/cuda_tests_unity.cu "${unity_nccl}")
endfunction()

function(commpact_add_compile_fail_test src)
  get_filename_component(name ${src} NAME_WE)
  file(STRINGS ${src} expect_line REGEX "// expect:")
  string(REGEX REPLACE ".*// expect:[ ]*" "" expect "${expect_line}")
  add_test(NAME compile_fail_${name}
    COMMAND ${CMAKE_CXX_COMPILER} -std=c++20 -fsyntax-only -I${PROJECT_SOURCE_DIR}/include ${src})
  set_tests_properties(compile_fail_${name} PROPERTIES LABELS compile_fail PASS_REGULAR_EXPRESSION "${expect}")
endfunction()

# commpact_usage_test(<test> <target> <expect-regex> [STATUS <n>] [TIMEOUT <s>] [LABELS <l>]
#                     <args>...): runs <target> with arguments a user could get wrong and
# requires a clean refusal, as tests/check_usage.cmake checks it: an exit status of 1 to
# 127 (exactly <n> with STATUS) within <s> seconds (30 by default; no signal, no abort, no
# hang, no run that trains first and fails after) and output matching <expect-regex>.
# Label "usage" unless LABELS names others (comma-separated). STATUS 0 checks a run that
# must succeed and print <expect-regex> (--help, a one-step run), which ctest's
# PASS_REGULAR_EXPRESSION alone does not: it ignores the status. The keywords come before
# the arguments; no argument may hold '|' or ';'.
function(commpact_usage_test name target expect)
  set(rest ${ARGN})
  set(status "")
  set(timeout 30)
  set(labels usage)
  while(TRUE)
    list(LENGTH rest n)
    if(n LESS 2)
      break()
    endif()
    list(GET rest 0 key)
    list(GET rest 1 value)
    if(key STREQUAL "STATUS")
      set(status -DSTATUS=${value})
    elseif(key STREQUAL "TIMEOUT")
      set(timeout ${value})
    elseif(key STREQUAL "LABELS")
      string(REPLACE "," ";" labels "${value}")
    else()
      break()
    endif()
    list(REMOVE_AT rest 0 1)
  endwhile()
  list(JOIN rest "|" args)
  add_test(NAME ${name}
    COMMAND ${CMAKE_COMMAND} -DPROGRAM=$<TARGET_FILE:${target}> "-DARGS=${args}" "-DEXPECT=${expect}" ${status}
            -DTIMEOUT=${timeout} -DWORKDIR=${CMAKE_CURRENT_BINARY_DIR} -P ${PROJECT_SOURCE_DIR}/tests/check_usage.cmake)
  math(EXPR ctest_timeout "${timeout} + 30")
  set_tests_properties(${name} PROPERTIES LABELS "${labels}" TIMEOUT ${ctest_timeout})
endfunction()
