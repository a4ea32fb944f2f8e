// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file codecs_threshold.cuh
//! Device kernels of threshold_codec (device_codec<threshold_codec>,
//! compress/device_codecs_threshold.cuh). The host sends every entry with
//! |v_i| >= lambda, at most cap of them (the cap's largest, host::topk_abs's order). On
//! the device, without the count on the host: w = v where it passes (else +0), the top
//! cap of w by topk_abs (every candidate outranks a zero: lambda > 0), then the entries
//! that pass, compacted in index order into the payload (indices, then values behind
//! them), their count c left on the device for the frame header and clear_delivered.
//!
//! Checked against its host twin by tests/cuda/test_cuda_codec_leaves.cu,
//! tests/cuda/test_cuda_codecs.cu (docs/cuda.md, "Status", says where it has run).

#if !defined(__CUDACC__)
#error "commpact/kernels/cuda/codecs_threshold.cuh needs nvcc: include it from a .cu file only."
#endif

#include <cuda_runtime.h>

#include <cub/device/device_scan.cuh>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "../formulas/thresholds.hpp"
#include "codecs.cuh"
#include "grid.cuh"

namespace commpact::cuda_kernels::codec {

//! w[i] = v[i] when detail::passes_threshold(v[i], t, false), else +0.
__global__ void threshold_mask(const float* v, std::size_t n, float t, float* w) {
  for (const std::size_t i : cuda_kernels::grid_stride(n))
    w[i] = commpact::detail::passes_threshold(v[i], t, false) ? v[i] : 0.0f;
}

//! flag[j] = 1 when the selected value val[j] passes, else 0.
__global__ void threshold_flags(const float* val, std::size_t cap, float t, std::uint32_t* flag) {
  for (const std::size_t j : cuda_kernels::grid_stride(cap))
    flag[j] = commpact::detail::passes_threshold(val[j], t, false) ? 1u : 0u;
}

//! With pos the exclusive prefix sum of flag: c = pos[cap - 1] + flag[cap - 1]; the
//! passing entries go to payload indices [pos[j]] and values [c + pos[j]]; *count = c.
__global__ void threshold_compact(const std::int32_t* idx, const float* val, const std::uint32_t* flag,
                                  const std::uint32_t* pos, std::size_t cap, std::uint32_t* payload,
                                  std::uint32_t* count) {
  const std::uint32_t c = pos[cap - 1] + flag[cap - 1];
  auto* out_idx = reinterpret_cast<std::int32_t*>(payload);
  auto* out_val = reinterpret_cast<float*>(payload) + c;
  for (const std::size_t j : cuda_kernels::grid_stride(cap)) {
    if (j == 0) *count = c;
    if (!flag[j]) continue;
    out_idx[pos[j]] = idx[j];
    out_val[pos[j]] = val[j];
  }
}

//! residual[idx[j]] = 0 (and velocity) for j < *count (the delivered entries).
__global__ void threshold_clear(float* residual, float* velocity, std::size_t n, const std::int32_t* idx,
                                const std::uint32_t* count, std::size_t cap) {
  const std::size_t c = *count;
  for (const std::size_t j : cuda_kernels::grid_stride(c < cap ? c : cap)) {
    const auto i = static_cast<std::size_t>(idx[j]);
    if (i >= n) continue;
    residual[i] = 0.0f;
    if (velocity) velocity[i] = 0.0f;
  }
}

//! CUB's temporary storage for the exclusive sum of cap flags.
inline cudaError_t threshold_scan_bytes(std::size_t cap, std::size_t& bytes) {
  return cub::DeviceScan::ExclusiveSum(nullptr, bytes, static_cast<const std::uint32_t*>(nullptr),
                                       static_cast<std::uint32_t*>(nullptr), static_cast<int>(cap));
}

}  // namespace commpact::cuda_kernels::codec
