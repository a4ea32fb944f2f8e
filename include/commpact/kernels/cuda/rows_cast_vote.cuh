// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file rows_cast_vote.cuh
//! ops<cuda_space> (kernels/cuda/ops.cuh) inherits these rows: CastAllreduce's rows (cast_encode, cast_add, cast_decode_mean), LinearCompressor's and Allreduce's (linear_encode, linear_decode, linear_feedback), MajorityVote's and Vote's (signum_update, sign_vote).
//! Each row implements the specification of kernels/ops.hpp on the executor's stream.

#if !defined(__CUDACC__)
#error "commpact/kernels/cuda/rows_cast_vote.cuh needs nvcc: include it from a .cu file only."
#endif

#include <cuda_runtime.h>

#include "../../space/cuda.hpp"
#include "check.cuh"

namespace commpact::cuda_rows {

struct cast_vote {
  using exec = cuda_space::exec;
  template <class T>
  using span = cuda_span<T>;
};

}  // namespace commpact::cuda_rows
