// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file hierarchical_mpi.hpp
//! hierarchical_mpi(world, node): a HierarchicalComm<MpiComm> from one MPI communicator
//! and each rank's node id. Included by mpi_comm.hpp and (after <mpi.h>) by
//! hierarchical_comm.hpp, so that it is declared whichever of the two comes first.

#include <mpi.h>

#include <utility>

#include "../error.hpp"
#include "hierarchical_comm.hpp"
#include "mpi_comm.hpp"

namespace commpact {

//! Splits `world` by `node` (MPI_Comm_split, world order inside a node) and by node rank
//! (the cross communicators, ordered by node id). Collective over `world`; every rank
//! passes the id of its node (>= 0).
inline HierarchicalComm<MpiComm> hierarchical_mpi(MPI_Comm world, int node, mpi_options opt = {}) {
  require(node >= 0, "commpact::hierarchical_mpi: node id ", node, " is negative; pass each rank's node, from 0.");
  int wr = 0;
  MPI_Comm_rank(world, &wr);
  MPI_Comm node_c = MPI_COMM_NULL, cross_c = MPI_COMM_NULL;
  require<comm_error>(MPI_Comm_split(world, node, wr, &node_c) == MPI_SUCCESS,
                      "commpact::hierarchical_mpi: MPI_Comm_split by node failed on world rank ", wr, ".");
  int nr = 0;
  MPI_Comm_rank(node_c, &nr);
  require<comm_error>(MPI_Comm_split(world, nr, node, &cross_c) == MPI_SUCCESS,
                      "commpact::hierarchical_mpi: MPI_Comm_split by node rank failed on world rank ", wr, ".");
  MpiComm w{world, opt}, n{node_c, opt}, x{cross_c, opt};  // each keeps duplicates of its own
  MPI_Comm_free(&node_c);
  MPI_Comm_free(&cross_c);
  return HierarchicalComm<MpiComm>{std::move(w), std::move(n), std::move(x)};
}

}  // namespace commpact
