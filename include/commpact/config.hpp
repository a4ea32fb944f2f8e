// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file config.hpp
//! Version, feature detection and the host/device annotation macro.

#define COMMPACT_VERSION_MAJOR 0
#define COMMPACT_VERSION_MINOR 1
#define COMMPACT_VERSION_PATCH 0

#if defined(__CUDACC__)
#define COMMPACT_HOST_DEVICE __host__ __device__
#define COMMPACT_HAS_CUDA_COMPILER 1
#else
//! Empty without nvcc, `__host__ __device__` under it.
#define COMMPACT_HOST_DEVICE
#define COMMPACT_HAS_CUDA_COMPILER 0
#endif

// COMMPACT_HAS_MPI and COMMPACT_HAS_NCCL are defined to 1 by the CMake components
// commpact::mpi and commpact::nccl; a project that does not ask for them gets 0.
#ifndef COMMPACT_HAS_MPI
#define COMMPACT_HAS_MPI 0
#endif
#ifndef COMMPACT_HAS_NCCL
#define COMMPACT_HAS_NCCL 0
#endif
