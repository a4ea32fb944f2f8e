// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file guard.hpp
//! comm_guard(comm, fn): a rank's work wrapped so that a failure reaches the other ranks.
//! `mpi_guard` (mpi_comm.hpp) and `torch_guard` (torch/torch_comm.hpp) are this function.

#include <exception>
#include <functional>
#include <type_traits>
#include <utility>

#include "../error.hpp"

namespace commpact {

//! Runs fn (as fn(comm) if that compiles, else fn()) and returns its result. If an
//! exception escapes, calls comm.abort(its message) so that every other rank raises
//! peer_failure instead of waiting, then rethrows. Works for any communicator with abort().
template <class C, class F>
decltype(auto) comm_guard(C& comm, F&& fn) {
  try {
    if constexpr (std::is_invocable_v<F&&, C&>) return std::invoke(std::forward<F>(fn), comm);
    else return std::invoke(std::forward<F>(fn));
  } catch (const std::exception& e) {
    comm.abort(detail::cat("threw: ", e.what()));
    throw;
  } catch (...) {
    comm.abort("threw a non-standard exception");
    throw;
  }
}

}  // namespace commpact
