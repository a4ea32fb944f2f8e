# Self-test of tests/check_usage.cmake: runs it on programs whose outcome is known and
# requires each verdict, so that the usage tests cannot pass a run they should refuse.
#   cmake -P check_usage_selftest.cmake
set(script ${CMAKE_CURRENT_LIST_DIR}/check_usage.cmake)
# expect_verdict(<pass|fail> <what> <-D options>...): runs check_usage.cmake with the options.
function(expect_verdict verdict what)
  execute_process(COMMAND ${CMAKE_COMMAND} ${ARGN} -P ${script} RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
  if((verdict STREQUAL "pass" AND NOT rc EQUAL 0) OR (verdict STREQUAL "fail" AND rc EQUAL 0))
    message(SEND_ERROR "check_usage.cmake should ${verdict} ${what} (it exited with ${rc})")
  endif()
endfunction()
set(echo -DPROGRAM=${CMAKE_COMMAND} "-DARGS=-E|echo|hello")
set(false -DPROGRAM=${CMAKE_COMMAND} "-DARGS=-E|false")
expect_verdict(fail "a success without STATUS" ${echo} -DEXPECT=hello)
expect_verdict(pass "a success with STATUS 0 and the expected output" ${echo} -DEXPECT=hello -DSTATUS=0)
expect_verdict(fail "a success with STATUS 0 and other output" ${echo} -DEXPECT=goodbye -DSTATUS=0)
expect_verdict(fail "a failure with STATUS 0" ${false} -DEXPECT=.* -DSTATUS=0)
expect_verdict(pass "a failure without STATUS" ${false} -DEXPECT=.*)
expect_verdict(fail "a failure with another STATUS" ${false} -DEXPECT=.* -DSTATUS=2)
expect_verdict(fail "a STATUS out of range" ${echo} -DEXPECT=hello -DSTATUS=300)
expect_verdict(fail "a run that does not end within TIMEOUT"
               -DPROGRAM=${CMAKE_COMMAND} "-DARGS=-E|sleep|5" -DEXPECT=.* -DTIMEOUT=1)
