// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file wire_model.hpp
//! Exact bytes and messages that the textbook collective algorithms make one rank
//! send. CountingComm charges collectives by these formulas; point-to-point traffic
//! is counted as it happens.
//!
//! - allreduce: ring (reduce-scatter then allgather). The n elements are cut into P
//!   chunks, chunk i holding floor(n/P) + (i < n mod P) elements; in step s = 0..P-2 of
//!   the reduce-scatter rank r sends chunk (r - s) mod P, in step s of the allgather
//!   chunk (r + 1 - s) mod P. 2(P-1) messages per rank, about 2 (P-1)/P * bytes.
//! - allgather: ring, P-1 messages of the block size.
//! - broadcast: binomial tree from the root.

#include <cstdint>

namespace commpact {

struct wire_cost {
  std::uint64_t bytes_sent = 0, bytes_received = 0, messages_sent = 0, messages_received = 0;
};

namespace wire {

inline std::uint64_t ring_chunk(std::uint64_t n, int P, int i) {
  return n / P + (static_cast<std::uint64_t>(i) < n % static_cast<std::uint64_t>(P) ? 1 : 0);
}

//! Ring allreduce of n elements of elem_bytes each, as seen by `rank`.
inline wire_cost ring_allreduce(int rank, int P, std::uint64_t n, std::uint64_t elem_bytes) {
  wire_cost c;
  if (P <= 1) return c;
  auto mod = [P](int x) { return ((x % P) + P) % P; };
  for (int s = 0; s < P - 1; ++s) {
    c.bytes_sent += ring_chunk(n, P, mod(rank - s)) * elem_bytes;      // reduce-scatter
    c.bytes_received += ring_chunk(n, P, mod(rank - 1 - s)) * elem_bytes;
    c.bytes_sent += ring_chunk(n, P, mod(rank + 1 - s)) * elem_bytes;  // allgather
    c.bytes_received += ring_chunk(n, P, mod(rank - s)) * elem_bytes;
  }
  c.messages_sent = c.messages_received = 2 * static_cast<std::uint64_t>(P - 1);
  return c;
}

//! Ring allgather of a block of `block_bytes` per rank.
inline wire_cost ring_allgather(int /*rank*/, int P, std::uint64_t block_bytes) {
  wire_cost c;
  if (P <= 1) return c;
  c.bytes_sent = c.bytes_received = static_cast<std::uint64_t>(P - 1) * block_bytes;
  c.messages_sent = c.messages_received = static_cast<std::uint64_t>(P - 1);
  return c;
}

//! Binomial-tree broadcast of `bytes` from root.
inline wire_cost binomial_broadcast(int rank, int P, int root, std::uint64_t bytes) {
  wire_cost c;
  if (P <= 1) return c;
  const int v = ((rank - root) % P + P) % P;  // rank relative to the root
  int mask = 1;
  while (mask <= v) mask <<= 1;  // the first child distance above v's highest bit
  if (v != 0) {
    c.messages_received = 1;
    c.bytes_received = bytes;
  }
  for (; v + mask < P; mask <<= 1) {
    ++c.messages_sent;
    c.bytes_sent += bytes;
  }
  return c;
}

}  // namespace wire
}  // namespace commpact
