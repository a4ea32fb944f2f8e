// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file rows_power.cuh
//! ops<cuda_space> (kernels/cuda/ops.cuh) inherits these rows: PowerCompressor's rows (check_finite, copy_if_clear, lowrank_project, lowrank_back_project, lowrank_approx_residual, orthonormalize, gaussian, redraw_zero_columns) and PowerGossip's (power_gossip_orthonormalize, power_gossip_update, power_gossip_vectors).
//! Each row implements the specification of kernels/ops.hpp on the executor's stream.

#if !defined(__CUDACC__)
#error "commpact/kernels/cuda/rows_power.cuh needs nvcc: include it from a .cu file only."
#endif

#include <cuda_runtime.h>

#include "../../space/cuda.hpp"
#include "check.cuh"

namespace commpact::cuda_rows {

struct power {
  using exec = cuda_space::exec;
  template <class T>
  using span = cuda_span<T>;
};

}  // namespace commpact::cuda_rows
