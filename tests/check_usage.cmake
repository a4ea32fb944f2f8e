# Runs a program with arguments a user could get wrong and checks that it fails as a
# command-line program should: it exits by itself (no signal, no abort: status 1 to 127),
# within TIMEOUT seconds, and its output names the problem (matches EXPECT). With STATUS
# it requires that exact status instead, 0 included: -DSTATUS=0 checks a run that must
# succeed (--help, a short run) and print EXPECT, which ctest's PASS_REGULAR_EXPRESSION
# alone does not (it ignores the status).
#
#   cmake -DPROGRAM=<path> "-DARGS=--rounds|0" "-DEXPECT=<regex>" [-DSTATUS=<n>] [-DTIMEOUT=<s>]
#         [-DWORKDIR=<dir>] -P check_usage.cmake
#
# ARGS separates the arguments with '|' (a ';' would split the -D value in add_test).
# STATUS, when given, is the exact exit status required (0 to 127). Output is stdout and stderr
# together. Used by the examples' and benchmarks' usage tests (label "usage").
if(NOT DEFINED PROGRAM OR NOT DEFINED EXPECT)
  message(FATAL_ERROR "check_usage.cmake: pass -DPROGRAM=<path> and -DEXPECT=<regex>")
endif()
if(NOT DEFINED TIMEOUT)
  set(TIMEOUT 60)
endif()
if(NOT DEFINED WORKDIR)
  set(WORKDIR ${CMAKE_CURRENT_BINARY_DIR})
endif()
set(args "")
if(DEFINED ARGS AND NOT ARGS STREQUAL "")
  string(REPLACE "|" ";" args "${ARGS}")
endif()
execute_process(COMMAND ${PROGRAM} ${args} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
                TIMEOUT ${TIMEOUT} WORKING_DIRECTORY ${WORKDIR})
set(all "${out}${err}")
string(REPLACE "|" " " shown "${ARGS}")
if(NOT rc MATCHES "^[0-9]+$")
  message(FATAL_ERROR "'${PROGRAM} ${shown}' did not exit by itself (${rc}); it printed:\n${all}")
endif()
if(DEFINED STATUS)
  if(NOT STATUS MATCHES "^[0-9]+$" OR STATUS GREATER 127)
    message(FATAL_ERROR "check_usage.cmake: STATUS must be 0 to 127, not '${STATUS}'")
  endif()
  if(NOT rc EQUAL STATUS)
    message(FATAL_ERROR "'${PROGRAM} ${shown}' exited with status ${rc}, not ${STATUS}; it printed:\n${all}")
  endif()
elseif(rc EQUAL 0 OR rc GREATER 127)
  message(FATAL_ERROR "'${PROGRAM} ${shown}' exited with status ${rc}, not 1-127; it printed:\n${all}")
endif()
if(all MATCHES "terminate called|Segmentation fault|Aborted|core dumped")
  message(FATAL_ERROR "'${PROGRAM} ${shown}' crashed; it printed:\n${all}")
endif()
if(NOT all MATCHES "${EXPECT}")
  message(FATAL_ERROR "'${PROGRAM} ${shown}' exited with ${rc} but its output does not match '${EXPECT}':\n${all}")
endif()
message(STATUS "'${PROGRAM} ${shown}' exited with ${rc}: ${all}")
