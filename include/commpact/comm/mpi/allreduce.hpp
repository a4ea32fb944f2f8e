#pragma once
//! \file mpi/allreduce.hpp
//! MpiComm's latency path for small allreduces (the signature check and data up to
//! `mpi_small_allreduce_bytes`): recursive doubling over point-to-point messages,
//! progressed by the same deadline-bounded MPI_Test loop as everything else. OpenMPI's
//! nonblocking collectives (libnbc) take about twice the latency of its blocking ones
//! at 1 KiB; a point-to-point exchange costs what a blocking MPI_Allreduce costs.
//! Part of MpiComm (include commpact/comm/mpi_comm.hpp).
//!
//! Identical bits on every rank: both partners of an exchange combine
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
#include <vector>

#include "../../concepts.hpp"

namespace commpact::detail {

//! Data at most this large (bytes) takes the recursive-doubling path.
inline constexpr std::size_t mpi_small_allreduce_bytes = 64 * 1024;
inline constexpr int mpi_rd_tag = 19;

template <class T>
void combine_low_high(T* acc, const T* other, std::size_t n, reduce_op op, bool acc_is_low) {
  // result = op(low, high), identical on both partners
  switch (op) {
    case reduce_op::sum:
      for (std::size_t i = 0; i < n; ++i) acc[i] = acc_is_low ? acc[i] + other[i] : other[i] + acc[i];
      break;
    case reduce_op::min:
      for (std::size_t i = 0; i < n; ++i)
        acc[i] = acc_is_low ? std::min(acc[i], other[i]) : std::min(other[i], acc[i]);
      break;
    case reduce_op::max:
      for (std::size_t i = 0; i < n; ++i)
        acc[i] = acc_is_low ? std::max(acc[i], other[i]) : std::max(other[i], acc[i]);
      break;
  }
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
    try {
      s.poll(what, [&] {
        int flag = 0;
        s.check(MPI_Testall(2, q, &flag, MPI_STATUSES_IGNORE), "MPI_Testall", what);
        return flag != 0;
      });
    } catch (...) {
      s.abandon(q[0]);
      if (q[1] != MPI_REQUEST_NULL) MPI_Request_free(&q[1]);  // a send only reads
      throw;
    }
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

}  // namespace commpact::detail
