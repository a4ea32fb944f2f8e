// SPDX-License-Identifier: Apache-2.0
#pragma once
// What every CUDA benchmark of bench/cuda/ starts with: a failed CUDA call prints
// "FAILED: ..." and exits 1; without a device the program prints a skip line and exits 77
// (scripts/device-check reads both). Only nvcc compiles this file.

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

namespace commpact_bench {

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::printf("FAILED: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

//! Exits 77 ("no CUDA device: skipped") without a device; else prints "device <name>".
inline void require_device() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("no CUDA device: skipped\n");
    std::exit(77);
  }
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "properties");
  std::printf("device %s\n", prop.name);
}

}  // namespace commpact_bench
