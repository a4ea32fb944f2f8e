// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file power_products.hpp
//! How PowerSGD's products run (power_options::products; the last argument of the rows
//! lowrank_prepare, lowrank_project, lowrank_back_project and lowrank_approx_residual of
//! kernels/ops.hpp).
//!
//! - `exact` (the default): kernels/host/lowrank.hpp's summation order in every space, so
//!   a space's results are the host's bits.
//! - `blas`: on cuda_space, P = M Q, Q = M^T P and A = P Q^T are cuBLAS SGEMMs
//!   (kernels/cuda/rows_power.cuh): faster, deterministic and bit-identical across ranks
//!   that run the same GPU model and cuBLAS version, but not the host's bits; within the
//!   bound of docs/cuda.md ("PowerSGD's products on cuBLAS"). host_space and
//!   deferred_space always run the exact order: there `blas` changes nothing.

#include <cstdint>

namespace commpact {

enum class power_products : std::uint8_t {
  exact = 0,  //!< the host's summation order everywhere (bit-identical to host_space)
  blas = 1,   //!< cuda_space: cuBLAS SGEMMs (FP32, no TF32); the host and deferred spaces: exact
};

}  // namespace commpact
