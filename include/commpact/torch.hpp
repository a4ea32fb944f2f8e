// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file torch.hpp
//! Everything commpact offers a LibTorch (C++) program, in one include: the host library
//! (commpact.hpp: compressors, TreeComm, sync policies, DataParallel, the decorators),
//! TorchComm over a c10d::ProcessGroup (torch/torch_comm.hpp) and torch_gloo_group
//! (torch/gloo.hpp, LibTorch 1 only, when Gloo's headers are on the include path; define
//! COMMPACT_NO_GLOO to leave it out). The CUDA side of a PyTorch program (TorchCudaComm,
//! torch/torch_cuda_comm.hpp, nvcc only, and the torch_group_link it runs over,
//! torch/torch_group_link.hpp, which needs LibTorch's CUDA headers) is included
//! separately; python/commpact_hooks_cuda.cu shows the pair. Link Torch's libraries (and
//! commpact::commpact) from CMake: docs/pytorch.md.
//!
//! \code
//! #include <commpact/torch.hpp>
//! auto pg = commpact::torch_gloo_group(store, rank, P);      // or the program's own group
//! commpact::TorchComm comm{pg, store, {.timeout = std::chrono::seconds(60)}};
//! commpact::gTopK<commpact::TreeComm<commpact::TorchComm>> g{comm, {.density = 0.01}};
//! commpact::torch_guard(comm, [&] { g.reduce(std::span(grad)); });
//! \endcode

#include "commpact.hpp"
#include "torch/torch_comm.hpp"

#if __has_include(<torch/version.h>)
#include <torch/version.h>
#endif
// torch_gloo_group is LibTorch 1's (torch/gloo.hpp): under LibTorch 2, ProcessGroupGloo is
// a Backend, not a group TorchComm can take.
#if !defined(COMMPACT_NO_GLOO) && __has_include(<gloo/algorithm.h>) && \
    !(defined(TORCH_VERSION_MAJOR) && TORCH_VERSION_MAJOR >= 2)
#include "torch/gloo.hpp"
#endif
