// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file mpi/datatype.hpp
//! Element types MpiComm reduces, their MPI datatypes, and MPI error text. Part of
//! MpiComm (include commpact/comm/mpi_comm.hpp).

#include <mpi.h>

#include <cstddef>
#include <string>
#include <type_traits>

#include "../../error.hpp"

namespace commpact::detail {

//! True for the element types MPI reduces natively: float, double, and 32- or 64-bit
//! integers, signed or not.
template <class T>
inline constexpr bool mpi_reducible =
    std::is_same_v<T, float> || std::is_same_v<T, double> ||
    (std::is_integral_v<T> && !std::is_same_v<T, bool> && (sizeof(T) == 4 || sizeof(T) == 8));

//! The MPI datatype for an element type allreduce supports; MPI_DATATYPE_NULL otherwise.
template <class T>
MPI_Datatype mpi_reduce_type() {
  if constexpr (std::is_same_v<T, float>) return MPI_FLOAT;
  else if constexpr (std::is_same_v<T, double>) return MPI_DOUBLE;
  else if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool> && sizeof(T) == 4)
    return std::is_signed_v<T> ? MPI_INT32_T : MPI_UINT32_T;
  else if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool> && sizeof(T) == 8)
    return std::is_signed_v<T> ? MPI_INT64_T : MPI_UINT64_T;
  else return MPI_DATATYPE_NULL;
}

//! MPI_Error_string of an MPI return code.
inline std::string mpi_error_text(int rc) {
  char s[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(rc, s, &len) != MPI_SUCCESS) return detail::cat("MPI error code ", rc);
  return std::string(s, static_cast<std::size_t>(len));
}

inline bool mpi_finalized() {
  int f = 0;
  MPI_Finalized(&f);
  return f != 0;
}

//! Makes MPI_COMM_WORLD return error codes for the lifetime of the object, then
//! restores whatever handler it had. (OpenMPI 4.1 reports errors of a nonblocking
//! collective's MPI_Test on MPI_COMM_WORLD, not on the request's communicator.)
class world_errors_return {
 public:
  world_errors_return() noexcept {
    swapped_ = MPI_Comm_get_errhandler(MPI_COMM_WORLD, &old_) == MPI_SUCCESS;
    if (swapped_ && MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN) != MPI_SUCCESS) {
      MPI_Errhandler_free(&old_);
      swapped_ = false;
    }
  }
  ~world_errors_return() {
    if (!swapped_) return;
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, old_);
    MPI_Errhandler_free(&old_);
  }
  world_errors_return(const world_errors_return&) = delete;
  world_errors_return& operator=(const world_errors_return&) = delete;

 private:
  MPI_Errhandler old_ = MPI_ERRHANDLER_NULL;
  bool swapped_ = false;
};

}  // namespace commpact::detail
