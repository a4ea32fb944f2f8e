# Proves scripts/device-check's reading of a compute-sanitizer log without a GPU: writes small
# logs modelled on an H200 run's sanitizer.log and checks the row that
# `device-check --classify-sanitizer-log RC LOG` prints for each. NCCL's handled probe at init
# (cudaErrorNoKernelImageForDevice on cudaFuncGetAttributes / cudaGetLastError, first host
# frame ncclInitKernelsForDevice in libnccl.so.2) is ignored; any other error counts, and so
# does an unprinted one; a program whose own checks failed is FAILED even when
# --error-exitcode 86 hid its exit code.
#   cmake -DROOT=<source dir> -DWORK_DIR=<dir> -DBASH=<bash> -P check_device_check_sanitizer_log.cmake
foreach(v ROOT WORK_DIR BASH)
  if(NOT ${v})
    message(FATAL_ERROR "check_device_check_sanitizer_log: -D${v}= is required")
  endif()
endforeach()
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})

set(S "=========")
set(nccl_probe "${S} Program hit cudaErrorNoKernelImageForDevice (error 209) due to \"no kernel image is available for execution on the device\" on CUDA API call to cudaFuncGetAttributes.
${S}     Saved host backtrace up to driver entry point at error
${S}         Host Frame: ncclInitKernelsForDevice(int, int, unsigned long*) in enqueue.cc:52 [0x6d9d3] in libnccl.so.2
${S}         Host Frame: ncclCommInitRankFunc(ncclAsyncJob*) in init.cc:1534 [0x85765] in libnccl.so.2
${S}         Host Frame: ncclAsyncJobMain(void*) in group.cc:74 [0x77f66] in libnccl.so.2
${S}         Host Frame:  [0x9cb83] in libc.so.6
${S} 
${S} Program hit cudaErrorNoKernelImageForDevice (error 209) due to \"no kernel image is available for execution on the device\" on CUDA API call to cudaGetLastError.
${S}     Saved host backtrace up to driver entry point at error
${S}         Host Frame: ncclInitKernelsForDevice(int, int, unsigned long*) in enqueue.cc:54 [0x6db34] in libnccl.so.2
${S}         Host Frame: ncclCommInitRankFunc(ncclAsyncJob*) in init.cc:1534 [0x85765] in libnccl.so.2
${S}         Host Frame:  [0x129ecb] in libc.so.6
${S} 
")
set(our_read "${S} Invalid __global__ read of size 4 bytes
${S}     at commpact::cuda_kernels::detail::scale_kernel(float*, const float*, unsigned long)+0x70 in ops.cuh:120
${S}     by thread (31,0,0) in block (3,0,0)
${S}     Address 0x7f3a1e000400 is out of bounds
${S}     Saved host backtrace up to driver entry point at kernel launch time
${S}         Host Frame: cudaLaunchKernel [0x4a2b1] in test_gtopk_device
${S}         Host Frame: main in test_gtopk_device.cu:200 [0x1234] in test_gtopk_device
${S} 
")
set(failed_checks "FAILED tests/cuda/test_cuda_codecs.cu:44: diff(out, hout[s]) == 0: TopK step 2: the reduced gradient differs from the host in 30011 places
${S} Target application returned an error
")

# name, rc, log text, the row expected
set(cases
  nccl_only 86 "${S} COMPUTE-SANITIZER\n${nccl_probe}${nccl_probe}ok: 0 failures\n${S} ERROR SUMMARY: 4 errors\n"
    "clean (4 NCCL-internal API errors ignored)"
  nccl_and_ours 86 "${S} COMPUTE-SANITIZER\n${nccl_probe}${our_read}${S} ERROR SUMMARY: 3 errors\n"
    "ERRORS (1)"
  nccl_and_failed_checks 86 "${S} COMPUTE-SANITIZER\n${nccl_probe}${failed_checks}${S} ERROR SUMMARY: 2 errors\n"
    "FAILED"
  failed_checks_no_errors 1 "${S} COMPUTE-SANITIZER\n${failed_checks}${S} ERROR SUMMARY: 0 errors\n"
    "FAILED (1)"
  unprinted 86 "${S} COMPUTE-SANITIZER\n${nccl_probe}${S} ERROR SUMMARY: 5 errors\n${S} ERROR SUMMARY: 3 errors were not printed. Use --print-limit option to adjust the number of printed errors\n"
    "ERRORS (3)"
  no_errors 0 "${S} COMPUTE-SANITIZER\nseed 1283104949935506580\nall ops<cuda_space> checks passed\n${S} ERROR SUMMARY: 0 errors\n"
    "clean"
  racecheck_clean 0 "${S} COMPUTE-SANITIZER\nok: 0 failures\n${S} RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)\n"
    "clean"
  racecheck_hazard 86 "${S} COMPUTE-SANITIZER\n${S} Error: Race reported between Write access at select_kernel+0x1a0 in select.cuh:88\n${S}     and Read access at select_kernel+0x2c0 in select.cuh:95 [4 hazards]\n${S} \n${S} RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)\n"
    "ERRORS (1)"
  timed_out 124 "${S} COMPUTE-SANITIZER\n${nccl_probe}seed 15541551278139841382\n"
    "TIMED OUT")

set(bad "")
list(LENGTH cases n)
math(EXPR last "${n} - 1")
foreach(i RANGE 0 ${last} 4)
  math(EXPR i1 "${i} + 1")
  math(EXPR i2 "${i} + 2")
  math(EXPR i3 "${i} + 3")
  list(GET cases ${i} name)
  list(GET cases ${i1} rc)
  list(GET cases ${i2} text)
  list(GET cases ${i3} want)
  string(REPLACE "\\n" "\n" text "${text}")
  file(WRITE ${WORK_DIR}/${name}.log "${text}")
  execute_process(COMMAND ${BASH} ${ROOT}/scripts/device-check --classify-sanitizer-log ${rc} ${WORK_DIR}/${name}.log
    RESULT_VARIABLE code OUTPUT_VARIABLE got ERROR_VARIABLE err OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT code EQUAL 0 OR NOT got STREQUAL want)
    string(APPEND bad "  ${name} (rc ${rc}): got '${got}' (exit ${code}) ${err}, want '${want}'\n")
  else()
    message(STATUS "${name} (rc ${rc}): ${got}")
  endif()
endforeach()
if(bad)
  message(FATAL_ERROR "device-check --classify-sanitizer-log:\n${bad}")
endif()
