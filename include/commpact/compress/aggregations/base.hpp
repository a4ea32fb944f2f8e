// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file base.hpp
//! What every aggregation over one communicator holds: the communicator, its space and
//! span type, sources() (one block per rank) and comm(). Allgather<C> and Allreduce<C>
//! derive from it; the concept is concepts/aggregation.hpp.

#include <utility>

#include "../../concepts.hpp"

namespace commpact::detail {

//! The span and buffer types of C's space.
template <class C, class T>
using comm_span = typename comm_space_t<C>::template span<T>;
template <class C, class T>
using comm_buffer = typename comm_space_t<C>::template buffer<T>;

template <class C>
class comm_aggregation {
  static_assert(diagnose_communicator<C>());

 public:
  using comm_type = C;
  using space_type = comm_space_t<C>;
  template <class T>
  using span = typename space_type::template span<T>;

  explicit comm_aggregation(C comm) : comm_(std::move(comm)) {}

  int sources() const { return comm_.size(); }
  C& comm() { return comm_; }
  const C& comm() const { return comm_; }

 protected:
  C comm_;
};

}  // namespace commpact::detail
