#pragma once
// Shared by the CUDA tests (tests/cuda/*.cu): the failure count with its EXPECT macro, and
// the device-presence check. Without a GPU a test exits 77, which CTest reports as skipped
// (SKIP_RETURN_CODE in cmake/commpactTesting.cmake).

#include <cuda_runtime.h>

#include <cstdio>

namespace commpact_test {

//! The exit code CTest counts as "skipped" for the CUDA tests.
inline constexpr int exit_skipped = 77;

//! True when a CUDA device is present; otherwise prints "no CUDA device: skipped".
inline bool have_cuda_device() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("no CUDA device: skipped\n");
    return false;
  }
  return true;
}

//! How many EXPECTs have failed so far.
inline int failures = 0;

}  // namespace commpact_test

//! Counts and prints a failure (printf-style message) when cond is false; carries on.
#define EXPECT(cond, ...)                                           \
  do {                                                              \
    if (!(cond)) {                                                  \
      ++commpact_test::failures;                                    \
      std::printf("FAILED %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      std::printf(__VA_ARGS__);                                     \
      std::printf("\n");                                            \
    }                                                               \
  } while (0)
