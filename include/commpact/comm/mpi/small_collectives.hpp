// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file mpi/small_collectives.hpp
//! MpiComm's latency path for small collectives (the signature check, and data up to
//! the thresholds below): allreduce by recursive doubling, broadcast down a
//! binomial tree, allgather by direct exchange, all over point-to-point messages and
//! progressed by the same deadline-bounded MPI_Test loop as everything else. OpenMPI's
//! nonblocking collectives (libnbc) take about twice the latency of its blocking ones
//! at 1 KiB; point-to-point exchanges cost what the blocking collectives cost.
//! Part of MpiComm (include commpact/comm/mpi_comm.hpp).
//!
//! Allreduce gives identical bits on every rank: both partners of an exchange combine
//! op(lower rank's block, higher rank's block), in that order, so ties of min/max on
//! +0/-0 and NaN payloads resolve the same way everywhere. With P not a power of two,
//! the ranks above the largest power of two p first fold into rank r - p and receive
//! the final result from it. Only the scratch buffer is ever a receive target, so an
//! operation abandoned after a failure never writes into user memory.

#include <mpi.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <span>
#include <type_traits>
#include <vector>

#include "../../concepts.hpp"
#include "combine.hpp"

namespace commpact::detail {

//! Broadcasts and allgathers moving at most this many bytes (broadcast: the data;
//! allgather: the whole output) take the point-to-point path.
inline constexpr std::size_t mpi_small_collective_bytes = 64 * 1024;
//! Allreduces of at most this many bytes take recursive doubling (the latency of a
//! blocking MPI_Allreduce; MPI only ever receives into scratch); larger ones take the
//! ring (mpi/ring_allreduce.hpp), which moves 2 (P-1)/P of the data instead of
//! log2(P) times all of it: at 256 KiB - 4 MiB recursive doubling costs 2-3.8x a
//! blocking MPI_Allreduce on shared memory, the ring 1-2x.
inline constexpr std::size_t mpi_rd_allreduce_bytes = 64 * 1024;
inline constexpr int mpi_rd_tag = 19;
//! The signature check (mpi_state::verify) is a direct exchange, one round of P - 1
//! messages per rank, up to this many ranks, and a recursive doubling (log2(P) rounds of
//! one message) above. At P = 4 on shared memory the direct exchange saves a round, and
//! it lets an allgather's blocks travel with the signatures (a held gather).
inline constexpr int mpi_direct_check_ranks = 8;

//! Waits for `reqs` under the state's deadline and failure notices. On an error the
//! receives are abandoned (kept, never freed: MPI may still write into their internal
//! buffers) and the sends freed (they only read).
template <class State>
void mpi_wait_all(State& s, std::span<MPI_Request> reqs, std::size_t first_send, const char* what) {
  try {
    s.poll(what, [&] {
      int flag = 0;
      s.check(MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &flag, MPI_STATUSES_IGNORE), "MPI_Testall",
              what);
      return flag != 0;
    });
  } catch (...) {
    for (std::size_t i = 0; i < reqs.size(); ++i) {
      if (i < first_send) s.abandon(reqs[i]);
      else if (reqs[i] != MPI_REQUEST_NULL) MPI_Request_free(&reqs[i]);
    }
    throw;
  }
}

//! acc = op(low, high), identical on both partners (the same call with the same
//! operand order); vectorised at every optimisation level (mpi/combine.hpp).
template <class T>
void combine_low_high(T* acc, const T* other, std::size_t n, reduce_op op, bool acc_is_low) {
  if (acc_is_low) mpi_combine(acc, acc, other, n, op);
  else mpi_combine(acc, other, acc, n, op);
}

//! In-place allreduce of `data` by recursive doubling; `scratch` is an internal buffer
//! (grown to data.size_bytes()). State provides native(), rank(), size(), check(),
//! poll() and abandon() (see mpi_state).
template <class T, class State>
void mpi_rd_allreduce(State& s, std::span<T> data, reduce_op op, std::vector<std::byte>& scratch, const char* what) {
  const int P = s.size(), r = s.rank();
  if (P == 1 || data.empty()) return;
  const int bytes = static_cast<int>(data.size_bytes());
  if (scratch.size() < data.size_bytes()) scratch.resize(data.size_bytes());
  T* in = reinterpret_cast<T*>(scratch.data());
  MPI_Comm comm = s.native();

  // Exchange with `peer` (send data, receive into scratch) and wait for both.
  auto exchange = [&](int peer, bool send, bool recv) {
    MPI_Request q[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    if (recv) s.check(MPI_Irecv(scratch.data(), bytes, MPI_BYTE, peer, mpi_rd_tag, comm, &q[0]), "MPI_Irecv", what);
    if (send) s.check(MPI_Isend(data.data(), bytes, MPI_BYTE, peer, mpi_rd_tag, comm, &q[1]), "MPI_Isend", what);
    mpi_wait_all(s, std::span<MPI_Request>(q, 2), 1, what);
  };

  int p2 = 1;
  while (p2 * 2 <= P) p2 *= 2;
  const int extra = P - p2;
  if (r >= p2) {  // fold into r - p2 and receive the result from it (its only message to us)
    exchange(r - p2, true, true);
    std::memcpy(data.data(), in, data.size_bytes());
    return;
  }
  if (r < extra) {
    exchange(r + p2, false, true);
    combine_low_high(data.data(), in, data.size(), op, true);
  }
  for (int bit = 1; bit < p2; bit <<= 1) {
    const int peer = r ^ bit;
    exchange(peer, true, true);
    combine_low_high(data.data(), in, data.size(), op, r < peer);
  }
  if (r < extra) exchange(r + p2, true, false);
}

//! Broadcast from `root` down a binomial tree. With `isolate`, the message is received
//! into `scratch` and copied out, so an abandoned receive never writes into `data`.
template <class State>
void mpi_tree_broadcast(State& s, std::span<std::byte> data, int root, bool isolate, std::vector<std::byte>& scratch,
                        const char* what) {
  const int P = s.size(), r = s.rank();
  if (P == 1 || data.empty()) return;
  const int bytes = static_cast<int>(data.size());
  const int v = (r - root + P) % P;  // rank relative to the root
  std::byte* buf = data.data();
  if (isolate && v != 0) {
    if (scratch.size() < data.size()) scratch.resize(data.size());
    buf = scratch.data();
  }
  int mask = 1;
  for (; mask < P; mask <<= 1) {
    if (v & mask) {  // receive from the parent
      MPI_Request q = MPI_REQUEST_NULL;
      s.check(MPI_Irecv(buf, bytes, MPI_BYTE, (v - mask + root) % P, mpi_rd_tag, s.native(), &q), "MPI_Irecv", what);
      mpi_wait_all(s, std::span<MPI_Request>(&q, 1), 1, what);
      break;
    }
  }
  MPI_Request kids[32];
  int n = 0;
  for (mask >>= 1; mask > 0; mask >>= 1)
    if (v + mask < P)
      s.check(MPI_Isend(buf, bytes, MPI_BYTE, (v + mask + root) % P, mpi_rd_tag, s.native(), &kids[n++]), "MPI_Isend",
              what);
  mpi_wait_all(s, std::span<MPI_Request>(kids, static_cast<std::size_t>(n)), 0, what);
  if (buf != data.data()) std::memcpy(data.data(), buf, data.size());
}

//! Allgather by direct exchange: every rank sends its block to every other rank in one
//! round. With `isolate`, blocks are received into `scratch` and copied out.
template <class State>
void mpi_direct_allgather(State& s, std::span<const std::byte> in, std::span<std::byte> out, bool isolate,
                          std::vector<std::byte>& scratch, std::vector<MPI_Request>& reqs, const char* what) {
  const int P = s.size(), r = s.rank();
  const std::size_t b = in.size();
  if (b == 0) return;
  std::byte* dst = out.data();
  if (isolate) {
    if (scratch.size() < out.size()) scratch.resize(out.size());
    dst = scratch.data();
  }
  reqs.assign(2 * static_cast<std::size_t>(P - 1), MPI_REQUEST_NULL);
  std::size_t k = 0;
  for (int q = 0; q < P; ++q)
    if (q != r)
      s.check(MPI_Irecv(dst + b * static_cast<std::size_t>(q), static_cast<int>(b), MPI_BYTE, q, mpi_rd_tag, s.native(),
                        &reqs[k++]),
              "MPI_Irecv", what);
  for (int q = 0; q < P; ++q)
    if (q != r)
      s.check(MPI_Isend(in.data(), static_cast<int>(b), MPI_BYTE, q, mpi_rd_tag, s.native(), &reqs[k++]), "MPI_Isend",
              what);
  std::memcpy(out.data() + b * static_cast<std::size_t>(r), in.data(), b);
  mpi_wait_all(s, std::span<MPI_Request>(reqs), static_cast<std::size_t>(P - 1), what);
  if (dst != out.data())
    for (int q = 0; q < P; ++q)
      if (q != r) std::memcpy(out.data() + b * static_cast<std::size_t>(q), dst + b * static_cast<std::size_t>(q), b);
}

}  // namespace commpact::detail
