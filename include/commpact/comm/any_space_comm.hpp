// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file any_space_comm.hpp
//! any_space_communicator<Space>: any_communicator (comm/any_comm.hpp) for a communicator
//! whose data plane runs in an execution space other than the host (DeferredComm<C>, the
//! CUDA space's communicator): the control plane (host spans: agreements, barrier) is
//! any_communicator's, and the data plane adds `allreduce(Space::span<float>, op)`,
//! queued on the wrapped communicator's executor `exec()`. Classes whose type names no
//! communicator but a space (`PowerCompressor<Rank, deferred_space>`) bind through it.
//!
//! <!-- snippet: buffer=commpact::deferred_space::buffer<float> -->
//! \code
//! commpact::any_space_communicator<commpact::deferred_space> any{commpact::DeferredComm{comm}};
//! any.allreduce(buffer.view(), commpact::reduce_op::sum);   // queued until the fence
//! commpact::deferred_space::fence(any.exec(), commpact::no_deadline());
//! \endcode

#include <memory>
#include <type_traits>
#include <utility>

#include "any_comm.hpp"
#include "known_size.hpp"

namespace commpact {

template <class Space>
class any_space_communicator : public any_communicator {
  template <class T>
  using dspan = typename Space::template span<T>;

  struct data_plane {
    virtual ~data_plane() = default;
    virtual void allreduce_f(dspan<float>, reduce_op) = 0;
  };
  template <class C>
  struct model final : data_plane {
    C c;
    explicit model(C comm) : c(std::move(comm)) {}
    void allreduce_f(dspan<float> v, reduce_op op) override { c.allreduce(v, op); }
  };

 public:
  using space_type = Space;
  using exec_type = typename Space::exec;

  //! Wraps copies of comm (copies of commpact's communicators share their group, their
  //! counters and, for DeferredComm, their executor's queue).
  template <class C>
    requires(!std::is_base_of_v<any_communicator, std::remove_cvref_t<C>>)
  any_space_communicator(C comm)  // NOLINT: converting, as any_communicator's
      : any_communicator(comm), exec_(comm_exec(comm)) {
    static_assert(std::is_same_v<comm_space_t<std::remove_cvref_t<C>>, Space>,
                  "commpact::any_space_communicator<Space>: this communicator's data plane runs in another space "
                  "(comm_space_t<C>); wrap a communicator of Space (DeferredComm<C> for deferred_space), or use "
                  "any_communicator for a host communicator.");
    data_ = std::make_shared<model<std::remove_cvref_t<C>>>(std::move(comm));
  }

  //! The executor the data plane queues on (the wrapped communicator's).
  const exec_type& exec() const { return exec_; }

  using any_communicator::allreduce;  // the control plane: host spans, at once
  //! The data plane: queued on exec() (run by the next fence).
  void allreduce(dspan<float> v, reduce_op op = reduce_op::sum) { data_->allreduce_f(v, op); }

 private:
  std::shared_ptr<data_plane> data_;
  exec_type exec_;
};

}  // namespace commpact
