// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file rows_oktopk.cuh
//! ops<cuda_space> (kernels/cuda/ops.cuh) inherits these rows: OkTopK's rows (oktopk_local, oktopk_frames, oktopk_region_sum, oktopk_mags, oktopk_theta, oktopk_select, oktopk_output, oktopk_clear_selected).
//! Each row implements the specification of kernels/ops.hpp on the executor's stream.

#if !defined(__CUDACC__)
#error "commpact/kernels/cuda/rows_oktopk.cuh needs nvcc: include it from a .cu file only."
#endif

#include <cuda_runtime.h>

#include "../../space/cuda.hpp"
#include "check.cuh"

namespace commpact::cuda_rows {

struct oktopk {
  using exec = cuda_space::exec;
  template <class T>
  using span = cuda_span<T>;
};

}  // namespace commpact::cuda_rows
