// SPDX-License-Identifier: Apache-2.0
#pragma once
// Explicit instantiations that the CUDA tests compile, so that every member of a class
// template compiles, not only the members a test calls. They live in a header because C++
// allows them only in a namespace enclosing the template's, and CI's unity build of the
// CUDA tests (COMMPACT_CUDA_TESTS_UNITY, cmake/commpactTesting.cmake) wraps each test's
// body in a namespace of its own, but includes the tests' headers at global scope.

#include "commpact/comm/nccl_comm.hpp"
#include "commpact/gossip/power_gossip.hpp"
#include "commpact/kernels/cuda/ops.cuh"

// PowerGossip over the CUDA space (test_cuda_rows_power.cu): every member of the algorithm
// compiles (GossipMixer itself also needs rows_gossip.cuh's gossip_check).
template class commpact::detail::power_gossip_algorithm<2, commpact::NcclComm>;
