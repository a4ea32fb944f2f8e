// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file frame_gate.cuh
//! ops<cuda_space>::frame_gate's kernel: one decision (grid.cuh's decision_launch) over
//! the P codec frame headers at the start of the received blocks, wire/codec_frame.hpp's
//! headers_clean as the host row evaluates it; unless they are clean, status |= wire and
//! sum[0] = NaN. Only nvcc compiles this file.

#if !defined(__CUDACC__)
#error "commpact/kernels/cuda/frame_gate.cuh needs nvcc: include it from a .cu file only."
#endif

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "../../wire/codec_frame.hpp"
#include "../status.hpp"
#include "grid.cuh"

namespace commpact::cuda_kernels {

__global__ void frame_gate_kernel(const std::uint32_t* blocks, std::size_t block_words, std::size_t P, float* sum,
                                  std::size_t n, std::uint32_t* status) {
  if (!decision_lane()) return;
  const auto word = [blocks](std::size_t i) { return blocks[i]; };
  if (frame::headers_clean(word, block_words, P)) return;
  status[0] |= status_wire;
  if (n) sum[0] = __uint_as_float(0x7FC00000u);
}

}  // namespace commpact::cuda_kernels
