// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file ring.hpp
//! A ring allreduce of any trivially copyable element type with any combine function,
//! built on known-size point-to-point (comm/known_size.hpp), for element types the
//! Communicator concept does not reduce (the half types of cast_allreduce.hpp).
//!
//! The chunks are wire::ring_chunk's (the first n mod P chunks one element longer), and
//! the schedule is the classic one, so the bytes are exactly wire::ring_allreduce(rank,
//! P, n, sizeof(T)):
//! - reduce-scatter, steps s = 0 .. P-2: rank r sends chunk (r - s) mod P to r + 1 and
//!   receives chunk (r - s - 1) mod P from r - 1, which it replaces by
//!   combine(received, own). Chunk c is therefore combined in the ring order c, c + 1,
//!   ..., c - 1, left to right, and ends complete on rank c - 1;
//! - allgather, steps s = 0 .. P-2: rank r sends chunk (r + 1 - s) mod P and receives
//!   chunk (r - s) mod P, which it overwrites.
//! Every complete chunk is computed once and copied, so every rank ends with the same
//! bits. `scratch` must hold ring_chunk(n, P, 0) elements (the largest chunk).
//!
//! Sends and receives of a step run together (isend/irecv) when the communicator has
//! them; otherwise the send is issued first, as one group with the receive
//! (known_size.hpp's `grouped`: NcclComm posts them together), which elsewhere needs
//! buffered sends (ThreadComm, CountingComm over it and MpiComm's send() all buffer).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>

#include "../concepts.hpp"
#include "known_size.hpp"
#include "wire_model.hpp"

namespace commpact {

namespace detail {
template <class C>
void ring_step(C& c, int next, int prev, std::span<const std::byte> out, std::span<std::byte> in) {
  if constexpr (req::has_nonblocking_send_recv<C>) {
    auto r = c.irecv(prev, in);
    auto s = c.isend(next, out);
    s.wait();
    r.wait();
  } else {
    grouped(c, [&] {
      send_known(c, next, out);
      recv_known(c, prev, in);
    });
  }
}
}  // namespace detail

//! The ring of ring_allreduce over the spans of any space (host_space, deferred_space,
//! ...): the same chunks, schedule and bytes, with known-size point-to-point that a
//! queueing communicator (DeferredComm) queues, and `add(in, mine)` to combine a received
//! chunk into this rank's (mine = combine(in, mine) element-wise, in from the ring's
//! earlier ranks): a kernel of the space, queued or run. Over a communicator without
//! isend/irecv the send is issued before the receive, in one group (NcclComm), which
//! elsewhere needs buffered sends.
template <class C, class Span, class Add>
void ring_allreduce_spans(C& c, Span data, Span scratch, Add add) {
  using std::as_bytes;
  using std::as_writable_bytes;
  const int P = c.size(), r = c.rank();
  if (P <= 1) return;
  const std::uint64_t n = data.size();
  require(scratch.size() >= wire::ring_chunk(n, P, 0), "commpact::ring_allreduce: the scratch buffer holds ",
          scratch.size(), " elements; the largest chunk of ", n, " over ", P, " ranks needs ",
          wire::ring_chunk(n, P, 0), ".");
  auto mod = [P](int x) { return ((x % P) + P) % P; };
  auto offset = [&](int i) {
    const auto u = static_cast<std::uint64_t>(i);
    return u * (n / P) + std::min<std::uint64_t>(u, n % P);
  };
  auto chunk = [&](int i) { return data.subspan(offset(i), wire::ring_chunk(n, P, i)); };
  const int next = mod(r + 1), prev = mod(r - 1);
  auto step = [&](Span out, Span in) {
    if constexpr (req::has_nonblocking_send_recv<C>) {
      detail::ring_step(c, next, prev, as_bytes(out), as_writable_bytes(in));
    } else {
      grouped(c, [&] {
        send_known(c, next, as_bytes(out));
        recv_known(c, prev, as_writable_bytes(in));
      });
    }
  };
  for (int s = 0; s < P - 1; ++s) {
    const auto mine = chunk(mod(r - s - 1));
    const auto in = scratch.first(mine.size());
    step(chunk(mod(r - s)), in);
    add(in, mine);
  }
  for (int s = 0; s < P - 1; ++s) step(chunk(mod(r + 1 - s)), chunk(mod(r - s)));
}

//! Reduces `data` over the ranks of `c` in place with `combine(a, b)` (a from the ring's
//! earlier ranks); see the file comment for the order and the bytes.
template <class C, class T, class Combine>
  requires std::is_trivially_copyable_v<T>
void ring_allreduce(C& c, std::span<T> data, std::span<T> scratch, Combine combine) {
  ring_allreduce_spans(c, data, scratch, [&](std::span<T> in, std::span<T> mine) {
    for (std::size_t i = 0; i < mine.size(); ++i) mine[i] = combine(in[i], mine[i]);
  });
}

}  // namespace commpact
