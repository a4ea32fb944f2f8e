// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file blocking.hpp
//! The blocking collectives of a communicator that has nonblocking ones: allreduce,
//! allgather and broadcast run exactly what iallreduce / iallgather / ibroadcast followed
//! by wait() run, so ranks may mix the two forms for one collective. MpiComm and
//! TorchComm derive from blocking_collectives<Self> (CRTP).

#include <span>
#include <type_traits>

#include "../concepts/communicator.hpp"

namespace commpact::detail {

template <class Self>
class blocking_collectives {
 public:
  //! In-place element-wise reduction over all ranks: iallreduce(data, op).wait().
  template <class T>
    requires std::is_arithmetic_v<T>
  void allreduce(std::span<T> data, reduce_op op = reduce_op::sum) {
    self().iallreduce(data, op).wait();
  }
  //! Every rank's `in` (all the same size) into `out` in rank order: iallgather(in, out).wait().
  template <class T>
    requires std::is_trivially_copyable_v<T>
  void allgather(std::span<const T> in, std::span<T> out) {
    self().iallgather(in, out).wait();
  }
  //! Root's data to every rank: ibroadcast(data, root).wait().
  template <class T>
    requires std::is_trivially_copyable_v<T>
  void broadcast(std::span<T> data, int root) {
    self().ibroadcast(data, root).wait();
  }

 private:
  Self& self() { return static_cast<Self&>(*this); }
};

}  // namespace commpact::detail
