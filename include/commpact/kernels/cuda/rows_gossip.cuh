// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file rows_gossip.cuh
//! ops<cuda_space> (kernels/cuda/ops.cuh) inherits these rows: GossipMixer's rows (gossip_check, gossip_pack, gossip_mix, choco_update).
//! Each row implements the specification of kernels/ops.hpp on the executor's stream.

#if !defined(__CUDACC__)
#error "commpact/kernels/cuda/rows_gossip.cuh needs nvcc: include it from a .cu file only."
#endif

#include <cuda_runtime.h>

#include "../../space/cuda.hpp"
#include "check.cuh"

namespace commpact::cuda_rows {

struct gossip {
  using exec = cuda_space::exec;
  template <class T>
  using span = cuda_span<T>;
};

}  // namespace commpact::cuda_rows
