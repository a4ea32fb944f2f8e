// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file any_comm.hpp
//! any_communicator: a Communicator of any type behind one type, so that classes whose
//! type names no communicator (the design card's `PowerCompressor<Rank>`) can be bound
//! to ThreadComm, MpiComm, CountingComm<...> or a user's communicator at construction.
//!
//! \code
//! commpact::CountingComm<commpact::ThreadComm> counted{comm};
//! commpact::any_communicator any{counted};            // shares the counter (copies of C share state)
//! any.allreduce(std::span(v), commpact::reduce_op::sum);
//! any.target<commpact::CountingComm<commpact::ThreadComm>>()->stats();
//! \endcode
//!
//! Each collective costs one virtual call on top of the wrapped one. Element types:
//! allreduce of float, double, int64 and int32; allgather and broadcast of float, double,
//! int64 and bytes where the wrapped communicator offers them (a type it lacks raises
//! commpact::invalid_argument naming it).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <type_traits>
#include <typeinfo>
#include <utility>

#include "../concepts.hpp"
#include "../error.hpp"

namespace commpact {

class any_communicator {
  struct base {
    virtual ~base() = default;
    virtual int rank() const = 0;
    virtual int size() const = 0;
    virtual void allreduce_f(std::span<float>, reduce_op) = 0;
    virtual void allreduce_d(std::span<double>, reduce_op) = 0;
    virtual void allreduce_l(std::span<std::int64_t>, reduce_op) = 0;
    virtual void allreduce_i(std::span<std::int32_t>, reduce_op) = 0;
    virtual void allgather_f(std::span<const float>, std::span<float>) = 0;
    virtual void allgather_d(std::span<const double>, std::span<double>) = 0;
    virtual void allgather_l(std::span<const std::int64_t>, std::span<std::int64_t>) = 0;
    virtual void allgather_b(std::span<const std::byte>, std::span<std::byte>) = 0;
    virtual void broadcast_f(std::span<float>, int) = 0;
    virtual void broadcast_d(std::span<double>, int) = 0;
    virtual void broadcast_l(std::span<std::int64_t>, int) = 0;
    virtual void broadcast_b(std::span<std::byte>, int) = 0;
    virtual void barrier() = 0;
    virtual void abort(std::string_view) = 0;
    virtual void* target(const std::type_info&) = 0;
  };

  template <class C>
  struct model final : base {
    C c;
    explicit model(C comm) : c(std::move(comm)) {}
    int rank() const override { return c.rank(); }
    int size() const override { return c.size(); }
    template <class T>
    void ar(std::span<T> v, reduce_op op) {
      if constexpr (requires { c.allreduce(v, op); }) c.allreduce(v, op);
      else unsupported("allreduce", typeid(T).name());
    }
    template <class T>
    void ag(std::span<const T> in, std::span<T> out) {
      if constexpr (requires { c.allgather(in, out); }) c.allgather(in, out);
      else unsupported("allgather", typeid(T).name());
    }
    template <class T>
    void bc(std::span<T> v, int root) {
      if constexpr (requires { c.broadcast(v, root); }) c.broadcast(v, root);
      else unsupported("broadcast", typeid(T).name());
    }
    void allreduce_f(std::span<float> v, reduce_op op) override { ar(v, op); }
    void allreduce_d(std::span<double> v, reduce_op op) override { ar(v, op); }
    void allreduce_l(std::span<std::int64_t> v, reduce_op op) override { ar(v, op); }
    void allreduce_i(std::span<std::int32_t> v, reduce_op op) override { ar(v, op); }
    void allgather_f(std::span<const float> i, std::span<float> o) override { ag(i, o); }
    void allgather_d(std::span<const double> i, std::span<double> o) override { ag(i, o); }
    void allgather_l(std::span<const std::int64_t> i, std::span<std::int64_t> o) override { ag(i, o); }
    void allgather_b(std::span<const std::byte> i, std::span<std::byte> o) override { ag(i, o); }
    void broadcast_f(std::span<float> v, int r) override { bc(v, r); }
    void broadcast_d(std::span<double> v, int r) override { bc(v, r); }
    void broadcast_l(std::span<std::int64_t> v, int r) override { bc(v, r); }
    void broadcast_b(std::span<std::byte> v, int r) override { bc(v, r); }
    void barrier() override { c.barrier(); }
    void abort(std::string_view why) override { c.abort(why); }
    void* target(const std::type_info& t) override { return t == typeid(C) ? &c : nullptr; }
    [[noreturn]] static void unsupported(const char* what, const char* type) {
      throw invalid_argument(detail::cat("commpact::any_communicator: the wrapped communicator has no ", what,
                                         " for element type ", type, "; use float, double or std::int64_t."));
    }
  };

 public:
  //! Wraps a copy of comm (copies of commpact's communicators share their world and
  //! counters, so the wrapped copy sends through the same group).
  template <class C>
    requires(!std::is_same_v<std::remove_cvref_t<C>, any_communicator>)
  any_communicator(C comm) : impl_(std::make_shared<model<std::remove_cvref_t<C>>>(std::move(comm))) {  // NOLINT
    static_assert(diagnose_communicator<std::remove_cvref_t<C>>());
  }

  int rank() const { return impl_->rank(); }
  int size() const { return impl_->size(); }

  template <class T>
  void allreduce(std::span<T> v, reduce_op op = reduce_op::sum) {
    if constexpr (std::is_same_v<T, float>) impl_->allreduce_f(v, op);
    else if constexpr (std::is_same_v<T, double>) impl_->allreduce_d(v, op);
    else if constexpr (std::is_same_v<T, std::int64_t>) impl_->allreduce_l(v, op);
    else if constexpr (std::is_same_v<T, std::int32_t>) impl_->allreduce_i(v, op);
    else static_assert(sizeof(T) == 0, "commpact::any_communicator::allreduce: use float, double, int64 or int32.");
  }
  template <class T>
  void allgather(std::span<const T> in, std::span<T> out) {
    if constexpr (std::is_same_v<T, float>) impl_->allgather_f(in, out);
    else if constexpr (std::is_same_v<T, double>) impl_->allgather_d(in, out);
    else if constexpr (std::is_same_v<T, std::int64_t>) impl_->allgather_l(in, out);
    else if constexpr (std::is_same_v<T, std::byte>) impl_->allgather_b(in, out);
    else static_assert(sizeof(T) == 0, "commpact::any_communicator::allgather: use float, double, int64 or std::byte.");
  }
  template <class T>
  void broadcast(std::span<T> v, int root) {
    if constexpr (std::is_same_v<T, float>) impl_->broadcast_f(v, root);
    else if constexpr (std::is_same_v<T, double>) impl_->broadcast_d(v, root);
    else if constexpr (std::is_same_v<T, std::int64_t>) impl_->broadcast_l(v, root);
    else if constexpr (std::is_same_v<T, std::byte>) impl_->broadcast_b(v, root);
    else static_assert(sizeof(T) == 0, "commpact::any_communicator::broadcast: use float, double, int64 or std::byte.");
  }
  void barrier() { impl_->barrier(); }
  void abort(std::string_view why) { impl_->abort(why); }

  //! The wrapped communicator when it is a C, else nullptr (like std::function::target).
  template <class C>
  C* target() {
    return static_cast<C*>(impl_->target(typeid(C)));
  }

 private:
  std::shared_ptr<base> impl_;
};

}  // namespace commpact
