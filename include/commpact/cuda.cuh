// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file cuda.cuh
//! Everything commpact offers a CUDA program, in one include for a .cu file: the host and
//! deferred library (commpact.hpp), the CUDA space (space/cuda.hpp), the device rows of
//! every compressor, codec and mixer (kernels/cuda/ops.cuh, compress/device_codecs.cuh),
//! CudaStagedComm (any host communicator over pinned
//! staging) and, when nccl.h is on the include path, NcclComm. Define COMMPACT_NO_NCCL to
//! leave NcclComm out where nccl.h is present but not linked. Link commpact::cuda (and
//! commpact::nccl for NcclComm) from CMake.
//!
//! <!-- snippet: stream=cudaStream_t; id=ncclUniqueId; grad=commpact::cuda_span<float> -->
//! \code
//! #include <commpact/cuda.cuh>
//! auto e = commpact::cuda_space::make_exec(stream);       // on the framework's stream
//! auto comm = commpact::NcclComm::create(P, id, rank, e);  // id: NcclComm::unique_id() from rank 0
//! commpact::gTopK<commpact::TreeComm<commpact::NcclComm>> g{comm, {.density = 0.001}};
//! g.reduce(grad);                                          // grad: a cuda_span<float>
//! \endcode

#if !defined(__CUDACC__)
#error "commpact/cuda.cuh needs nvcc: include it from a .cu file (host code includes commpact/commpact.hpp)."
#endif

#include "commpact.hpp"
#include "comm/cuda_staged_comm.hpp"
#include "compress/device_codecs.cuh"
#include "kernels/cuda/ops.cuh"
#include "space/cuda.hpp"

#if !defined(COMMPACT_NO_NCCL) && __has_include(<nccl.h>)
#include "comm/nccl_comm.hpp"
#endif
