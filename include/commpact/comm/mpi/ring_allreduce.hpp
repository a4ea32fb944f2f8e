// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file mpi/ring_allreduce.hpp
//! MpiComm's bandwidth path for large blocking allreduces: a ring reduce-scatter then a
//! ring allgather over point-to-point messages, progressed by the same deadline-bounded
//! MPI_Testall loop as everything else (mpi_wait_all). Each rank moves 2 (P-1)/P of the
//! data instead of recursive doubling's log2(P) times all of it, and it avoids OpenMPI's
//! nonblocking allreduce (libnbc), which is 2-2.7x slower than the blocking one from
//! 1 MiB up on shared memory.
//!
//! Identical results: the data is cut into P chunks; chunk c is combined along the ring
//! in one fixed order, its final value is computed on exactly one rank, and the other
//! ranks receive those bytes, so every rank holds the same bits.
//! Isolation: as in the recursive doubling, MPI receives only into internal scratch
//! when buffers are isolated; this rank folds and copies each arrived chunk into `data`
//! itself (so after a failure `data` may hold partly reduced values, but nothing
//! writes into it later). Part of MpiComm (include commpact/comm/mpi_comm.hpp).

#include <mpi.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <span>
#include <type_traits>
#include <vector>

#include "small_collectives.hpp"

namespace commpact::detail {

//! out[i] = op(recv[i], mine[i]) (out may alias mine), vectorised (mpi/combine.hpp).
template <class T>
void combine_ring(T* out, const T* recv, const T* mine, std::size_t n, reduce_op op) {
  mpi_combine(out, recv, mine, n, op);
}

//! Ring allreduce of `data`, in place. With `isolate`, MPI only ever receives into
//! `scratch` (one chunk, grown as needed) and this rank copies each chunk into `data`
//! after it arrived; otherwise the allgather half receives straight into `data`. State
//! provides native(), rank(), size(), check(), poll() and abandon() (see mpi_state).
template <class T, class State>
void mpi_ring_allreduce(State& s, std::span<T> data, reduce_op op, bool isolate, std::vector<std::byte>& scratch,
                        const char* what) {
  const int P = s.size(), r = s.rank();
  const std::size_t n = data.size();
  if (P == 1 || n == 0) return;
  const auto lo = [&](int c) { return n * static_cast<std::size_t>(c) / static_cast<std::size_t>(P); };
  const auto len = [&](int c) { return lo(c + 1) - lo(c); };
  const std::size_t most = (n + static_cast<std::size_t>(P) - 1) / static_cast<std::size_t>(P);
  if (scratch.size() < most * sizeof(T)) scratch.resize(most * sizeof(T));
  T* in = reinterpret_cast<T*>(scratch.data());
  T* d = data.data();
  const int right = (r + 1) % P, left = (r + P - 1) % P;
  MPI_Comm comm = s.native();

  auto step = [&](int sc, int rc, T* recv) {
    MPI_Request q[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    s.check(MPI_Irecv(recv, static_cast<int>(len(rc) * sizeof(T)), MPI_BYTE, left, mpi_rd_tag, comm, &q[0]),
            "MPI_Irecv", what);
    s.check(MPI_Isend(d + lo(sc), static_cast<int>(len(sc) * sizeof(T)), MPI_BYTE, right, mpi_rd_tag, comm, &q[1]),
            "MPI_Isend", what);
    mpi_wait_all(s, std::span<MPI_Request>(q, 2), 1, what);
  };

  // Reduce-scatter: in step k rank r passes chunk r - k on (its own data in step 0, the
  // chunk it folded in step k - 1 later) and folds chunk r - k - 1 in. Afterwards rank
  // r holds the final value of chunk r + 1.
  for (int k = 0; k < P - 1; ++k) {
    const int sc = (r - k + P) % P, rc = (r - k - 1 + 2 * P) % P;
    step(sc, rc, in);
    combine_ring(d + lo(rc), in, d + lo(rc), len(rc), op);
  }
  // Allgather: pass the final chunks around the ring.
  for (int k = 0; k < P - 1; ++k) {
    const int sc = (r + 1 - k + P) % P, rc = (r - k + P) % P;
    step(sc, rc, isolate ? in : d + lo(rc));
    if (isolate) std::memcpy(d + lo(rc), in, len(rc) * sizeof(T));
  }
}

}  // namespace commpact::detail
