#pragma once
//! \file hierarchical_comm.hpp
//! HierarchicalComm<C>: a Communicator whose allreduce is two-level, for clusters whose
//! links inside a node are much faster than the links between nodes.
//!
//! allreduce(data, op):
//! 1. allreduce inside the node (node communicator, fast links): every rank of the node
//!    holds the node's reduction, the same bits on each;
//! 2. the node leaders (rank 0 of each node communicator) run a ring allreduce among
//!    themselves over point-to-point messages (leaders communicator, slow links):
//!    reduce-scatter, then allgather of the reduced chunks. Each chunk is reduced on one
//!    leader, in ring order, and copied to the others, so every leader holds the same
//!    bits. Per leader 2 (N-1)/N of the buffer crosses the slow links, instead of the
//!    2 (P-1)/P per rank of a flat ring whose P ranks share each node's uplink;
//! 3. the leader broadcasts the result inside its node.
//! Every rank of every node ends with the same bits. Everything else (allgather,
//! broadcast, barrier, point-to-point) goes through the world communicator, so that
//! compressors built over HierarchicalComm (Dense<HierarchicalComm<MpiComm>>) run as
//! before and only their allreduces take the two-level path.
//!
//! \code
//! #include <commpact/comm/mpi_comm.hpp>
//! #include <commpact/comm/hierarchical_comm.hpp>
//! auto h = commpact::hierarchical_mpi(MPI_COMM_WORLD, node_id);   // MPI_Comm_split twice
//! commpact::Dense<commpact::HierarchicalComm<commpact::MpiComm>> dense{h};
//! dense.reduce(std::span(grad));
//! \endcode
//!
//! Failures: an exception on one rank inside allreduce aborts all three communicators
//! before it is rethrown, so that the node's ranks waiting in the broadcast and the other
//! leaders waiting in the ring raise peer_failure instead of waiting for their deadline.

#include <cstddef>
#include <cstring>
#include <exception>
#include <optional>
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
  //! `world`: every rank. `node`: the ranks of this rank's node; its rank 0 is the node's
  //! leader. `leaders`: on a leader, the communicator of all leaders; std::nullopt on
  //! every other rank.
  HierarchicalComm(C world, C node, std::optional<C> leaders)
      : world_(std::move(world)), node_(std::move(node)), leaders_(std::move(leaders)) {
    const bool leader = node_.rank() == 0;
    require(leader == leaders_.has_value(), "commpact::HierarchicalComm: world rank ", world_.rank(),
            " is rank ", node_.rank(), " of its node but was ", leaders_ ? "given" : "not given",
            " a leaders communicator; pass one exactly on the node's rank 0 (std::nullopt on the others).");
    require(node_.size() <= world_.size(), "commpact::HierarchicalComm: the node communicator has ", node_.size(),
            " ranks, more than the world's ", world_.size(), "; pass this rank's node.");
  }

  int rank() const { return world_.rank(); }
  int size() const { return world_.size(); }
  bool is_leader() const { return leaders_.has_value(); }
  C& world() { return world_; }
  C& node() { return node_; }

  template <class T>
  void allreduce(std::span<T> data, reduce_op op = reduce_op::sum) {
    try {
      node_.allreduce(data, op);
      if (leaders_ && leaders_->size() > 1) ring_allreduce(*leaders_, data, op);
      node_.broadcast(data, 0);
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
    if (leaders_) quietly(*leaders_);
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

  //! Ring allreduce over point-to-point messages: chunk c is reduced along the ring
  //! starting at rank c, (((x_c op x_c+1) op ...) op x_c-1), on rank c-1, then copied.
  template <class T>
  void ring_allreduce(C& ring, std::span<T> data, reduce_op op) {
    const int N = ring.size(), r = ring.rank();
    const auto n = static_cast<std::uint64_t>(data.size());
    std::vector<std::size_t> off(static_cast<std::size_t>(N) + 1, 0);
    for (int i = 0; i < N; ++i) off[i + 1] = off[i] + wire::ring_chunk(n, N, i);
    auto chunk = [&](int i) {
      i = ((i % N) + N) % N;
      return data.subspan(off[i], off[i + 1] - off[i]);
    };
    const int next = (r + 1) % N, prev = (r + N - 1) % N;
    auto receive = [&](std::span<T> into, int step) {
      ring.recv(prev, buf_);
      require<wire_error>(buf_.size() == into.size_bytes(), "commpact::HierarchicalComm: leader ", r,
                          " expected ", into.size_bytes(), " bytes from leader ", prev, " in ring step ", step,
                          " but received ", buf_.size(), "; every leader must pass the same length.");
    };
    for (int s = 0; s < N - 1; ++s) {  // reduce-scatter
      ring.send(next, std::as_bytes(chunk(r - s)));
      auto mine = chunk(r - 1 - s);
      receive(mine, s);
      const T* in = reinterpret_cast<const T*>(buf_.data());
      for (std::size_t i = 0; i < mine.size(); ++i) {
        T v;
        std::memcpy(&v, in + i, sizeof(T));
        mine[i] = apply(v, mine[i], op);
      }
    }
    for (int s = 0; s < N - 1; ++s) {  // allgather of the reduced chunks
      ring.send(next, std::as_bytes(chunk(r + 1 - s)));
      auto into = chunk(r - s);
      receive(into, N - 1 + s);
      std::memcpy(into.data(), buf_.data(), into.size_bytes());
    }
  }

  C world_;
  C node_;
  std::optional<C> leaders_;
  std::vector<std::byte> buf_;
};

}  // namespace commpact

#if defined(MPI_VERSION)
#include "mpi_comm.hpp"

namespace commpact {

//! Splits `world` by `node` (MPI_Comm_split, ranks kept in world order inside a node),
//! and the nodes' rank-0 ranks into a leaders communicator ordered by node id. Collective
//! over `world`; every rank passes the id of its node (>= 0).
inline HierarchicalComm<MpiComm> hierarchical_mpi(MPI_Comm world, int node, mpi_options opt = {}) {
  require(node >= 0, "commpact::hierarchical_mpi: node id ", node, " is negative; pass each rank's node, from 0.");
  int wr = 0;
  MPI_Comm_rank(world, &wr);
  MPI_Comm node_c = MPI_COMM_NULL, lead_c = MPI_COMM_NULL;
  require<comm_error>(MPI_Comm_split(world, node, wr, &node_c) == MPI_SUCCESS,
                      "commpact::hierarchical_mpi: MPI_Comm_split by node failed on world rank ", wr, ".");
  int nr = 0;
  MPI_Comm_rank(node_c, &nr);
  require<comm_error>(MPI_Comm_split(world, nr == 0 ? 0 : MPI_UNDEFINED, node, &lead_c) == MPI_SUCCESS,
                      "commpact::hierarchical_mpi: MPI_Comm_split of the leaders failed on world rank ", wr, ".");
  std::optional<MpiComm> leaders;
  if (lead_c != MPI_COMM_NULL) leaders.emplace(lead_c, opt);
  HierarchicalComm<MpiComm> h{MpiComm{world, opt}, MpiComm{node_c, opt}, std::move(leaders)};
  MPI_Comm_free(&node_c);  // MpiComm keeps duplicates of its own
  if (lead_c != MPI_COMM_NULL) MPI_Comm_free(&lead_c);
  return h;
}

}  // namespace commpact
#endif
