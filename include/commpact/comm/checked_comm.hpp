// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file checked_comm.hpp
//! CheckedComm<C>: verifies, before every collective, that all ranks make the same call
//! (operation, element type, size, reduce_op or root) — the idea of PyTorch c10d's
//! ProcessGroupWrapper, over any Communicator (ThreadComm, MpiComm, CountingComm ...).
//!
//! \code
//! commpact::MpiComm raw{MPI_COMM_WORLD, {.verify_collectives = false}};
//! commpact::CheckedComm<commpact::MpiComm> comm{raw};
//! comm.allreduce(std::span(g));   // ranks that disagree all raise mismatch_error
//! \endcode
//!
//! - The check is one allreduce of 7 int64 (56 bytes) through the wrapped communicator,
//!   before any data moves: each value v travels as (v, -v) under MAX, so every rank
//!   learns the range of every field and raises the same error class (mismatch_error, or
//!   invalid_argument when some rank passed a bad argument, naming that rank). Mismatched
//!   sizes therefore never reach the transport, where they are undefined behaviour (with
//!   OpenMPI: heap corruption), and the communicator stays usable after the error.
//! - Cost: one small-message latency per collective (barrier() is the check itself).
//!   A communicator that already runs the same check (MpiComm with verify_collectives,
//!   whose `checks_collectives()` is true) is passed through unchanged, so wrapping a
//!   default MpiComm costs nothing extra.
//! - Point-to-point calls and nonblocking forms are passed through (the nonblocking
//!   collectives are checked before they start).

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "../concepts.hpp"
#include "forward_group.hpp"
#include "../error.hpp"
#include "signature.hpp"

namespace commpact {

template <class C>
class CheckedComm : public detail::forwards_p2p_group<CheckedComm<C>, C> {
  static_assert(diagnose_communicator<C>());

 public:
  explicit CheckedComm(C inner) : inner_(std::move(inner)) {}

  int rank() const { return inner_.rank(); }
  int size() const { return inner_.size(); }
  //! Forwarded from the wrapped communicator when it has it (MpiComm).
  bool allows_calls_from_other_threads() const
    requires requires(const C& c) { c.allows_calls_from_other_threads(); }
  {
    return inner_.allows_calls_from_other_threads();
  }
  //! Always true: every collective through this handle is checked.
  bool checks_collectives() const { return true; }

  template <class T>
  void allreduce(std::span<T> data, reduce_op op = reduce_op::sum) {
    if (check_allreduce(data, op)) inner_.allreduce(data, op);
  }
  template <class T>
  void allgather(std::span<const T> in, std::span<T> out) {
    if (check_allgather(in, out)) inner_.allgather(in, out);
  }
  template <class T>
  void broadcast(std::span<T> data, int root) {
    if (check_broadcast(data, root)) inner_.broadcast(data, root);
  }
  //! The signature check is itself a barrier (an allreduce completes on no rank before
  //! every rank joined it).
  void barrier() {
    if (passes_through()) return inner_.barrier();
    check({detail::coll_kind_sig::barrier, 0, 0, 0}, {});
  }

  void abort(std::string_view why) { inner_.abort(why); }

  // ---- nonblocking collectives (when C has them): checked before they start ----------
  template <class T>
  auto iallreduce(std::span<T> data, reduce_op op = reduce_op::sum)
    requires requires(C& c) { c.iallreduce(data, op); }
  {
    using handle = decltype(inner_.iallreduce(data, op));
    return check_allreduce(data, op) ? inner_.iallreduce(data, op) : handle{};
  }
  template <class T>
  auto iallgather(std::span<const T> in, std::span<T> out)
    requires requires(C& c) { c.iallgather(in, out); }
  {
    using handle = decltype(inner_.iallgather(in, out));
    return check_allgather(in, out) ? inner_.iallgather(in, out) : handle{};
  }
  template <class T>
  auto ibroadcast(std::span<T> data, int root)
    requires requires(C& c) { c.ibroadcast(data, root); }
  {
    using handle = decltype(inner_.ibroadcast(data, root));
    return check_broadcast(data, root) ? inner_.ibroadcast(data, root) : handle{};
  }

  // ---- point to point: passed through ---------------------------------------------
  void send(int peer, std::span<const std::byte> msg)
    requires req::has_send_recv<C>
  {
    inner_.send(peer, msg);
  }
  void recv(int peer, std::vector<std::byte>& buf)
    requires req::has_send_recv<C>
  {
    inner_.recv(peer, buf);
  }
  void sendrecv(int peer, std::span<const std::byte> msg, std::vector<std::byte>& buf)
    requires req::has_send_recv<C>
  {
    inner_.sendrecv(peer, msg, buf);
  }
  auto isend(int peer, std::span<const std::byte> msg)
    requires requires(C& c) { c.isend(peer, msg); }
  {
    return inner_.isend(peer, msg);
  }
  auto irecv(int peer, std::span<std::byte> buf)
    requires requires(C& c) { c.irecv(peer, buf); }
  {
    return inner_.irecv(peer, buf);
  }

  // group_begin() / group_end(): forwards_p2p_group (comm/forward_group.hpp), when C has them.
  C& inner() { return inner_; }
  const C& inner() const { return inner_; }

 private:
  bool passes_through() const {
    if constexpr (requires(const C& c) { c.checks_collectives(); }) return inner_.checks_collectives();
    else return false;
  }

  // Each check_* returns false when there is nothing to move (all ranks agreed on 0 bytes).
  template <class T>
  bool check_allreduce(std::span<T> data, reduce_op op) {
    if (passes_through()) return true;
    std::string bad;
    if (op != reduce_op::sum && op != reduce_op::min && op != reduce_op::max)
      bad = detail::cat("commpact::CheckedComm::allreduce: rank ", rank(), " passed reduce_op ", static_cast<int>(op),
                        "; use reduce_op::sum, min or max.");
    return check({detail::coll_kind_sig::allreduce, detail::sig_type_code<std::remove_const_t<T>>(),
                  static_cast<std::int64_t>(data.size_bytes()), static_cast<std::int64_t>(op)},
                 bad);
  }
  template <class T>
  bool check_allgather(std::span<const T> in, std::span<T> out) {
    if (passes_through()) return true;
    std::string bad;
    if (out.size() != in.size() * static_cast<std::size_t>(size()))
      bad = detail::cat("commpact::CheckedComm::allgather: rank ", rank(), " passed an output of ", out.size(),
                        " elements; it must hold size() * in.size() = ", size(), " * ", in.size(), ".");
    return check({detail::coll_kind_sig::allgather, 0, static_cast<std::int64_t>(in.size_bytes()), 0}, bad);
  }
  template <class T>
  bool check_broadcast(std::span<T> data, int root) {
    if (passes_through()) return true;
    std::string bad;
    if (root < 0 || root >= size())
      bad = detail::cat("commpact::CheckedComm::broadcast: rank ", rank(), " passed root ", root, ", outside [0, ",
                        size(), "); pass the rank that holds the data.");
    return check({detail::coll_kind_sig::broadcast, 0, static_cast<std::int64_t>(data.size_bytes()), root}, bad);
  }

  bool check(const detail::collective_signature& sig, const std::string& bad) {
    std::int64_t w[detail::signature_words];
    detail::encode_signature(sig, rank(), !bad.empty(), w);
    inner_.allreduce(std::span<std::int64_t>(w, detail::signature_words), reduce_op::max);
    detail::judge_signature(sig, rank(), w, bad, "commpact::CheckedComm");
    return sig.bytes != 0;
  }

  C inner_;
};

}  // namespace commpact
