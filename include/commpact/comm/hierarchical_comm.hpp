// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file hierarchical_comm.hpp
//! HierarchicalComm<C>: a Communicator whose allreduce is two-level, for clusters whose
//! links inside a node are much faster than the links between nodes.
//!
//! allreduce(data, op), nodes of equal size M (N nodes):
//! 1. reduce-scatter inside the node (a ring over point-to-point messages, fast links):
//!    node rank i ends with shard (i + 1) mod M of the node's reduction;
//! 2. the ranks of equal node rank, one per node ("cross" communicator), allreduce their
//!    shard (slow links). The M shards cross each node's uplink at the same time, together
//!    2 (N-1)/N of the buffer, against 2 (P-1)/P of it for a flat ring of P = N M ranks
//!    whose ring edges between nodes carry every chunk;
//! 3. allgather of the shards inside the node (ring, fast links).
//! Nodes of unequal size: allreduce inside the node, allreduce among the node leaders
//! (node rank 0, whose cross communicator is then the leaders'), broadcast in the node.
//! Each element is reduced on one rank in a fixed order and copied from there, so every
//! rank of every node ends with the same bits. Everything else (allgather, broadcast,
//! barrier, point-to-point) goes through the world communicator, so that compressors
//! built over HierarchicalComm (Dense<HierarchicalComm<MpiComm>>) run as before and only
//! their allreduces take the two-level path.
//!
//! <!-- snippet: node_id=int -->
//! \code
//! #include <commpact/comm/mpi_comm.hpp>
//! #include <commpact/comm/hierarchical_comm.hpp>
//! auto h = commpact::hierarchical_mpi(MPI_COMM_WORLD, node_id);   // MPI_Comm_split twice
//! commpact::Dense<commpact::HierarchicalComm<commpact::MpiComm>> dense{h};
//! dense.reduce(std::span(grad));
//! \endcode
//!
//! Failures: an exception on one rank inside allreduce aborts all three communicators
//! before it is rethrown, so that the ranks of its node and its cross communicator raise
//! peer_failure instead of waiting for their deadline.

#include <cstddef>
#include <cstring>
#include <exception>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../concepts.hpp"
#include "../error.hpp"
#include "wire_model.hpp"

namespace commpact {

template <class C>
class HierarchicalComm {
  static_assert(diagnose_point_to_point<C>());

 public:
  //! `world`: every rank. `node`: the ranks of this rank's node (node rank 0 is the
  //! node's leader). `cross`: the ranks of every node whose node rank equals this rank's.
  //! Collective over world: one small allreduce checks whether all nodes have one size.
  HierarchicalComm(C world, C node, C cross)
      : world_(std::move(world)), node_(std::move(node)), cross_(std::move(cross)) {
    std::int64_t m[2] = {node_.size(), -static_cast<std::int64_t>(node_.size())};
    world_.allreduce(std::span<std::int64_t>(m, 2), reduce_op::max);
    uniform_ = m[0] == -m[1];
    require(!uniform_ || static_cast<std::int64_t>(node_.size()) * cross_.size() == world_.size(),
            "commpact::HierarchicalComm: world rank ", world_.rank(), " has a node of ", node_.size(),
            " ranks and a cross communicator of ", cross_.size(), " ranks, but the world has ", world_.size(),
            "; pass the ranks of equal node rank, one per node, as the cross communicator.");
  }

  int rank() const { return world_.rank(); }
  int size() const { return world_.size(); }
  //! True when every node has the same size (the sharded algorithm runs).
  bool uniform() const { return uniform_; }
  C& world() { return world_; }
  C& node() { return node_; }
  C& cross() { return cross_; }

  template <class T>
  void allreduce(std::span<T> data, reduce_op op = reduce_op::sum) {
    try {
      if (uniform_) {
        const int M = node_.size();
        std::span<T> shard = data;
        if (M > 1) shard = ring_reduce_scatter(node_, data, op);
        if (cross_.size() > 1) cross_.allreduce(shard, op);
        if (M > 1) ring_allgather(node_, data);
      } else {
        node_.allreduce(data, op);
        if (node_.rank() == 0 && cross_.size() > 1) cross_.allreduce(data, op);
        node_.broadcast(data, 0);
      }
    } catch (const std::exception& e) {
      abort_all(detail::cat("HierarchicalComm::allreduce failed on world rank ", world_.rank(), ": ", e.what()));
      throw;
    }
  }

  template <class T>
  void allgather(std::span<const T> in, std::span<T> out) {
    world_.allgather(in, out);
  }
  template <class T>
  void broadcast(std::span<T> data, int root) {
    world_.broadcast(data, root);
  }
  void barrier() { world_.barrier(); }
  void abort(std::string_view why) { abort_all(std::string(why)); }
  void send(int peer, std::span<const std::byte> msg) { world_.send(peer, msg); }
  void recv(int peer, std::vector<std::byte>& buf) { world_.recv(peer, buf); }
  void sendrecv(int peer, std::span<const std::byte> msg, std::vector<std::byte>& buf) {
    world_.sendrecv(peer, msg, buf);
  }

 private:
  void abort_all(const std::string& why) noexcept {
    auto quietly = [&](C& c) {
      try {
        c.abort(why);
      } catch (...) {
      }
    };
    quietly(cross_);
    quietly(node_);
    quietly(world_);
  }

  template <class T>
  static T apply(T a, T b, reduce_op op) {
    switch (op) {
      case reduce_op::sum: return a + b;
      case reduce_op::min: return b < a ? b : a;
      case reduce_op::max: return a < b ? b : a;
    }
    return a;
  }

  //! Chunk i (mod N) of data, cut as wire_model's ring cuts it.
  template <class T>
  static std::span<T> chunk(std::span<T> data, int N, int i) {
    i = ((i % N) + N) % N;
    const auto n = static_cast<std::uint64_t>(data.size());
    std::size_t off = 0;
    for (int j = 0; j < i; ++j) off += wire::ring_chunk(n, N, j);
    return data.subspan(off, wire::ring_chunk(n, N, i));
  }

  template <class T>
  void receive(C& ring, int prev, std::span<T> into, int step) {
    ring.recv(prev, buf_);
    require<wire_error>(buf_.size() == into.size_bytes(), "commpact::HierarchicalComm: node rank ", ring.rank(),
                        " expected ", into.size_bytes(), " bytes from node rank ", prev, " in ring step ", step,
                        " but received ", buf_.size(), "; every rank must pass the same length.");
  }

  //! Ring reduce-scatter over point-to-point messages: chunk c is reduced along the ring
  //! from rank c, (((x_c op x_c+1) op ...) op x_c-1), and ends on rank c-1; returns the
  //! chunk this rank holds, (rank + 1) mod N.
  template <class T>
  std::span<T> ring_reduce_scatter(C& ring, std::span<T> data, reduce_op op) {
    const int N = ring.size(), r = ring.rank(), next = (r + 1) % N, prev = (r + N - 1) % N;
    for (int s = 0; s < N - 1; ++s) {
      ring.send(next, std::as_bytes(chunk(data, N, r - s)));
      auto mine = chunk(data, N, r - 1 - s);
      receive(ring, prev, mine, s);
      const auto* in = buf_.data();
      for (std::size_t i = 0; i < mine.size(); ++i) {
        T v;
        std::memcpy(&v, in + i * sizeof(T), sizeof(T));
        mine[i] = apply(v, mine[i], op);
      }
    }
    return chunk(data, N, r + 1);
  }

  //! Ring allgather of the chunks held after ring_reduce_scatter.
  template <class T>
  void ring_allgather(C& ring, std::span<T> data) {
    const int N = ring.size(), r = ring.rank(), next = (r + 1) % N, prev = (r + N - 1) % N;
    for (int s = 0; s < N - 1; ++s) {
      ring.send(next, std::as_bytes(chunk(data, N, r + 1 - s)));
      auto into = chunk(data, N, r - s);
      receive(ring, prev, into, N - 1 + s);
      std::memcpy(into.data(), buf_.data(), into.size_bytes());
    }
  }

  C world_;
  C node_;
  C cross_;
  bool uniform_ = true;
  std::vector<std::byte> buf_;
};

}  // namespace commpact

// With <mpi.h> already included, hierarchical_mpi() too (mpi_comm.hpp also includes it,
// so that it is declared whatever the order of the includes).
#if defined(MPI_VERSION)
#include "hierarchical_mpi.hpp"
#endif
