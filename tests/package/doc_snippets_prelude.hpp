// SPDX-License-Identifier: Apache-2.0
// The names the docs' C++ examples assume the reader has (their gradients, parameters,
// communicator, framework calls), for tests/package/check_doc_snippets.cmake. Declared
// only (extern variables, functions without bodies): the generated units are compiled,
// never linked or run. A block that needs another type for one of these names says so
// in its marker (<!-- snippet: comm=commpact::MpiComm -->).
#pragma once

#include <commpact/commpact.hpp>
#ifdef COMMPACT_DOC_SNIPPETS_MPI
// After commpact.hpp, as README.md's MPI example has it: hierarchical_mpi must be declared
// whatever the order (mpi_comm.hpp includes hierarchical_mpi.hpp).
#include <commpact/comm/mpi_comm.hpp>
#endif

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>
#ifdef COMMPACT_DOC_SNIPPETS_TORCH
#include <commpact/torch.hpp>
#endif
#ifdef COMMPACT_DOC_SNIPPETS_CUDA
#include <commpact/cuda.cuh>
#endif

// A learning rate that is both a value (sgd_update(params, grads, lr)) and a schedule
// (lr(t)).
struct doc_lr {
  operator double() const;
  double operator()(std::int64_t step) const;
};
struct doc_model {};

// The communicator of a rank: a ThreadComm unless the block's marker says otherwise.
extern commpact::ThreadComm comm;
#ifdef COMMPACT_DOC_SNIPPETS_MPI
extern commpact::MpiComm world;   // an MPI program's communicator
#endif
extern int argc;
extern char** argv;
extern int rank;
extern int P;                     // the number of ranks
extern std::vector<int> peers;

// Flat float buffers: gradients, parameters, and the kernels' operands.
extern std::vector<float> grads, grad, params, init, g, v, x, y, acc, residual, velocity, val, va, vb, vo;
extern std::vector<std::int32_t> idx, ia, ib, io;
extern std::size_t k, n, m;
extern int steps;
extern std::int64_t total_steps;
extern doc_lr lr;
extern std::uint64_t seed;
extern commpact::tensor_layout layout;
extern commpact::Sgd opt;
extern doc_model model;

// The user's framework and training loop.
void backward(doc_model& model, std::vector<float>& grads);
void backward(std::vector<float>& grads);
void forward_backward(std::vector<float>& params, std::vector<float>& grads);
void compute_gradients(std::vector<float>& params, std::vector<float>& grads);
void sgd_update(std::vector<float>& params, std::span<const float> grads, double lr);
template <class Grads>
void update(std::vector<float>& params, Grads&& grads);   // the user's optimiser step
template <class Comm>
void train(Comm& comm);
// Point-to-point buffers of peer j.
std::span<const std::byte> out(int j);
std::span<std::byte> in(int j);

#ifdef COMMPACT_DOC_SNIPPETS_TORCH
extern c10::intrusive_ptr<c10d::ProcessGroup> process_group;
extern c10::intrusive_ptr<c10d::Store> store;
#endif
