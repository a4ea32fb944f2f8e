#pragma once
// The MPI suites' communicator: CheckedComm over an MpiComm whose built-in
// verification is off (mpi_options::verify_collectives = false), so every collective is
// checked by the decorator, once, as in tests/common/checked_runs.hpp for ThreadComm.
#include <commpact/comm/checked_comm.hpp>
#include <commpact/comm/mpi_comm.hpp>

#include <chrono>

namespace commpact_test {

using checked_mpi_comm = commpact::CheckedComm<commpact::MpiComm>;

//! CheckedComm<MpiComm> on MPI_COMM_WORLD with the given deadline; the inner MpiComm is
//! unchecked (on its own, a mismatch there is undefined behaviour).
inline checked_mpi_comm checked_mpi_world(std::chrono::milliseconds timeout) {
  return checked_mpi_comm{commpact::MpiComm{MPI_COMM_WORLD, {.timeout = timeout, .verify_collectives = false}}};
}

}  // namespace commpact_test
