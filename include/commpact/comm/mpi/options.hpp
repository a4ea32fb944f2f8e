// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file mpi/options.hpp
//! mpi_options: what an MpiComm is built with (the deadline, the signature check,
//! staging, the shared-memory ceiling). Part of MpiComm (include
//! commpact/comm/mpi_comm.hpp).

#include <chrono>
#include <cstddef>

namespace commpact {

struct mpi_options {
  //! Longest time one rank waits for the others in any operation.
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
  //! Longest time construction waits for the other ranks (its two MPI_Comm_idup and one
  //! small allreduce): the larger of this and `timeout` applies. Ranks reach their
  //! constructors at different times (one still reading its data, a busy node), which a
  //! short operation deadline (a test's 300 ms) should not count.
  std::chrono::milliseconds setup_timeout{std::chrono::seconds(60)};
  //! Start every collective with an exchange of its signature, so that ranks that
  //! disagree (sizes, operation, type, root) all raise mismatch_error before any data
  //! reaches user memory. Costs one small-message round per collective (up to 8 ranks;
  //! log2(P) rounds above), which an allgather of blocks up to 32 KiB overlaps with its
  //! data (the block travels inside the signature message). `false` is the unchecked
  //! mode: as in MPI and NCCL, ranks that disagree are then UNDEFINED BEHAVIOUR (OpenMPI
  //! may corrupt the heap or hang until the deadline); use it only where every call site
  //! is known to agree, or wrap the communicator in CheckedComm.
  bool verify_collectives = true;
  //! Collectives and receives write into internal staging memory (reused; one copy out
  //! on success), so that an operation abandoned after a failure never writes into user
  //! memory later. Turn off to save that copy when the process ends after any
  //! communication failure anyway. Checked, ranks may differ in it (the check tells
  //! every rank whether any isolates, and an allgather of blocks above 128 KiB then goes
  //! by pieces on every rank); unchecked (verify_collectives = false), give every rank
  //! the same value: such an allgather sends pieces when it isolates and one message
  //! when it does not (docs/notes/communicators-history.md, "The check first, then one message per peer").
  bool isolate_buffers = true;
  //! Checked allreduces and allgathers whose data (allreduce) or block per rank
  //! (allgather) is at most this many bytes move through shared memory when every
  //! rank runs on one node (mpi/shared_memory.hpp): each rank copies its data into a
  //! segment of its own and reads its peers' segments directly, so MPI never writes into
  //! user memory (what isolate_buffers promises, without staging) and each byte is
  //! copied twice instead of vader's two plus staging's one. Each rank maps two halves of
  //! the largest such size rounded up to a power of two (at least 1 MiB), reserved in
  //! /dev/shm; where that fails on any rank, or the ranks span nodes, every rank takes
  //! the point-to-point path for that size and above (MpiComm::shared_memory_note says
  //! why). 0: never. Give every rank the same value: the path is part of the signature
  //! check, so ranks that would take different paths for a call raise mismatch_error
  //! alike (naming this option) and the communicator stays usable. Unchecked collectives
  //! (verify_collectives = false) never take this path: it needs the check's barrier.
  std::size_t shared_memory_max = std::size_t{64} << 20;
};

}  // namespace commpact
