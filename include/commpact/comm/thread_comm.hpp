// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file thread_comm.hpp
//! ThreadComm: P ranks as threads of one process, the embedded default that needs no
//! launcher.
//!
//! \code
//! commpact::run_threads(4, [](commpact::ThreadComm& comm) {
//!   std::vector<float> g(100, float(comm.rank()));
//!   comm.allreduce(std::span(g), commpact::reduce_op::sum);   // every g[i] == 0+1+2+3
//! });
//! \endcode
//!
//! Reductions add the ranks' values in rank order 0, 1, ..., P-1, so every rank gets
//! bit-identical results. Every wait has a deadline (`thread_options::timeout`).
//! Ranks that disagree (operation, size, type, op, root) all raise mismatch_error, and an
//! invalid argument on any rank raises invalid_argument on all of them; either way the
//! collective has ended for every rank before any can start the next one, so the world
//! stays usable. A rank that throws, calls abort(), times out or returns while others
//! wait for it is failed: every rank that waits for it raises commpact::peer_failure
//! instead of waiting. run_threads() joins every rank and rethrows the lowest rank's
//! root-cause error. The protocol is described in thread_world.hpp.

#include <cstddef>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <type_traits>
#include <vector>

#include "../concepts.hpp"
#include "../error.hpp"
#include "thread_world.hpp"

namespace commpact {

namespace detail {

//! acc[i] = op(acc[i], src[i]) for i < n; one loop per op, so each vectorises.
template <class T>
void reduce_into(T* __restrict acc, const T* __restrict src, std::size_t n, reduce_op op) {
  switch (op) {
    case reduce_op::sum:
      for (std::size_t i = 0; i < n; ++i) acc[i] = static_cast<T>(acc[i] + src[i]);
      break;
    case reduce_op::min:
      for (std::size_t i = 0; i < n; ++i) acc[i] = src[i] < acc[i] ? src[i] : acc[i];
      break;
    case reduce_op::max:
      for (std::size_t i = 0; i < n; ++i) acc[i] = acc[i] < src[i] ? src[i] : acc[i];
      break;
  }
}

}  // namespace detail

//! One rank's handle on a world of threads. Cheap to copy; all copies of one rank
//! share the world. Use one handle per thread.
class ThreadComm {
 public:
  ThreadComm(std::shared_ptr<detail::thread_world> world, int rank) : world_(std::move(world)), rank_(rank) {
    require(world_ != nullptr, "commpact::ThreadComm: null world.");
    require(rank_ >= 0 && rank_ < world_->size(), "commpact::ThreadComm: rank ", rank_, " is outside [0, ",
            world_->size(), ").");
  }

  //! Makes P handles of one new world, one per rank, for callers that run their own threads.
  static std::vector<ThreadComm> make_world(int P, thread_options opt = {}) {
    auto w = std::make_shared<detail::thread_world>(P, opt);
    std::vector<ThreadComm> v;
    v.reserve(P);
    for (int r = 0; r < P; ++r) v.emplace_back(w, r);
    return v;
  }

  int rank() const { return rank_; }
  int size() const { return world_->size(); }

  //! In-place element-wise reduction; the sum adds ranks in order 0..P-1 on every rank.
  //! At P = 1 the data is left as it is (no copy).
  template <class T>
    requires std::is_arithmetic_v<T>
  void allreduce(std::span<T> data, reduce_op op = reduce_op::sum) {
    sync();
    allreduce_now(data, op);
  }

  //! Concatenates every rank's `in` (all the same size) into `out` in rank order.
  template <class T>
    requires std::is_trivially_copyable_v<T>
  void allgather(std::span<const T> in, std::span<T> out) {
    sync();
    allgather_now(in, out);
  }

  //! Copies root's data to every rank. At P = 1 nothing moves.
  template <class T>
    requires std::is_trivially_copyable_v<T>
  void broadcast(std::span<T> data, int root) {
    sync();
    broadcast_now(data, root);
  }

  //! Returns when every rank has called barrier(); a rank in another collective makes
  //! every rank raise mismatch_error.
  void barrier() {
    sync();
    world_->post_and_wait(rank_, {detail::coll_kind::barrier, nullptr, 0, 0, 0, {}});
  }

  // ---- nonblocking forms ------------------------------------------------------
  //! The handle of a nonblocking collective: `wait()`, `bool test()`; see
  //! detail::work_handle. Destroying it before completion waits.
  using request = detail::work_handle;

  //! Starts allreduce(data, op) and returns at once. The rank's nonblocking collectives
  //! run on its worker thread in the order started, and a blocking collective first
  //! waits for those started before it, so the order is the same on every rank. The
  //! result is in `data` once the handle completed; leave `data` alone until then.
  template <class T>
    requires std::is_arithmetic_v<T>
  request iallreduce(std::span<T> data, reduce_op op = reduce_op::sum) {
    return start([data, op](ThreadComm& c) { c.allreduce_now(data, op); });
  }
  //! Starts allgather(in, out); see iallreduce.
  template <class T>
    requires std::is_trivially_copyable_v<T>
  request iallgather(std::span<const T> in, std::span<T> out) {
    return start([in, out](ThreadComm& c) { c.allgather_now(in, out); });
  }
  //! Starts broadcast(data, root); see iallreduce.
  template <class T>
    requires std::is_trivially_copyable_v<T>
  request ibroadcast(std::span<T> data, int root) {
    return start([data, root](ThreadComm& c) { c.broadcast_now(data, root); });
  }

  //! Sends a copy of msg to peer. The copy is made before it returns, so the handle is
  //! complete at once (the same as send(); the form exists for AsyncPointToPoint).
  request isend(int peer, std::span<const std::byte> msg) {
    send(peer, msg);
    return {};
  }

  class recv_request;
  //! Starts receiving the next message from peer, which must be exactly buf.size()
  //! bytes (a message of another size raises mismatch_error and fails the world, as on
  //! MpiComm). Receives from one peer match its messages in the order they were started,
  //! blocking or not, whatever order they are waited in.
  recv_request irecv(int peer, std::span<std::byte> buf);

 private:
  template <class T>
  void allreduce_now(std::span<T> data, reduce_op op) {
    auto& w = *world_;
    const int P = w.size();
    std::string bad;
    if (op != reduce_op::sum && op != reduce_op::min && op != reduce_op::max)
      bad = detail::cat("commpact::ThreadComm::allreduce: rank ", rank_, " passed reduce_op ", static_cast<int>(op),
                        "; use reduce_op::sum, min or max.");
    w.post_and_wait(rank_, {detail::coll_kind::allreduce, data.data(), data.size_bytes(), detail::type_tag<T>(),
                            static_cast<int>(op), bad});
    if (P == 1) return;
    const std::size_t n = data.size();
    // This rank reduces chunk [lo, hi) of every rank's input into its own scratch (the
    // inputs must stay readable until every rank has read its chunk, so the result
    // cannot go in place before barrier 2); then every rank copies all chunks out.
    const std::size_t lo = n * rank_ / P, hi = n * (rank_ + 1) / P;
    auto& mine = w.scratch(rank_);
    if (mine.size() < (hi - lo) * sizeof(T)) mine.resize((hi - lo) * sizeof(T));
    T* acc = reinterpret_cast<T*>(mine.data());
    const T* first = static_cast<const T*>(w.slot_of(0).src);
    if (hi > lo) std::memcpy(acc, first + lo, (hi - lo) * sizeof(T));
    for (int r = 1; r < P; ++r) detail::reduce_into(acc, static_cast<const T*>(w.slot_of(r).src) + lo, hi - lo, op);
    w.wait_all(rank_, "allreduce");
    for (int r = 0; r < P; ++r) {
      const std::size_t rlo = n * r / P, rhi = n * (r + 1) / P;
      if (rhi > rlo) std::memcpy(data.data() + rlo, w.scratch(r).data(), (rhi - rlo) * sizeof(T));
    }
  }

  template <class T>
  void allgather_now(std::span<const T> in, std::span<T> out) {
    auto& w = *world_;
    const int P = w.size();
    std::string bad;
    if (out.size() != in.size() * static_cast<std::size_t>(P))
      bad = detail::cat("commpact::ThreadComm::allgather: rank ", rank_, " passed an output of ", out.size(),
                        " elements; it must hold size() * in.size() = ", P, " * ", in.size(), ".");
    w.post_and_wait(rank_, {detail::coll_kind::allgather, in.data(), in.size_bytes(), detail::type_tag<T>(), 0, bad});
    if (P == 1) {
      if (!in.empty() && in.data() != out.data()) std::memmove(out.data(), in.data(), in.size_bytes());
      return;
    }
    for (int r = 0; r < P; ++r) {
      if (!in.empty()) std::memcpy(out.data() + r * in.size(), w.slot_of(r).src, in.size_bytes());
    }
    w.wait_all(rank_, "allgather");
  }

  template <class T>
  void broadcast_now(std::span<T> data, int root) {
    auto& w = *world_;
    std::string bad;
    if (root < 0 || root >= w.size())
      bad = detail::cat("commpact::ThreadComm::broadcast: rank ", rank_, " passed root ", root, ", outside [0, ",
                        w.size(), "); pass the rank that holds the data.");
    w.post_and_wait(rank_, {detail::coll_kind::broadcast, data.data(), data.size_bytes(), detail::type_tag<T>(), root,
                            bad});
    if (w.size() == 1) return;
    if (rank_ != root && !data.empty()) std::memcpy(data.data(), w.slot_of(root).src, data.size_bytes());
    w.wait_all(rank_, "broadcast");
  }

  //! Waits for the nonblocking collectives this rank started (no-op on its worker).
  void sync() { world_->worker(rank_).drain(); }

  template <class F>
  request start(F f) {
    // The task holds a non-owning handle: the world outlives its workers (it joins them
    // first), and a task must not be the last owner of the world it runs on.
    return world_->worker(rank_).submit(
        [w = world_.get(), r = rank_, f = std::move(f)]() mutable {
          ThreadComm c(std::shared_ptr<detail::thread_world>(std::shared_ptr<detail::thread_world>(), w), r);
          f(c);
        });
  }

 public:
  //! Sends a copy of msg to peer; does not wait for the receiver.
  void send(int peer, std::span<const std::byte> msg) {
    check_peer(peer, "send");
    world_->send(rank_, peer, msg);
  }

  //! Receives the next message from peer into buf (resized to the message length).
  void recv(int peer, std::vector<std::byte>& buf) {
    check_peer(peer, "recv");
    std::vector<std::byte> old;
    std::swap(old, buf);
    world_->recv(peer, rank_, buf);
    old.clear();
    if (old.capacity()) world_->recycle(peer, rank_, std::move(old));
  }

  //! Pairwise exchange: sends msg to peer and receives peer's message into buf.
  void sendrecv(int peer, std::span<const std::byte> msg, std::vector<std::byte>& buf) {
    send(peer, msg);
    recv(peer, buf);
  }

  //! Marks this rank failed and the world with it: every collective, every recv from this
  //! rank that finds no message, and this rank's own later operations raise peer_failure.
  void abort(std::string_view why) {
    world_->fail(rank_, detail::cat("rank ", rank_, " aborted: ", why));
  }

  //! Called by run_threads when this rank's function returns (after the nonblocking
  //! collectives it started have run).
  void leave() {
    sync();
    world_->leave(rank_);
  }

  const thread_options& options() const { return world_->options(); }
  //! How long one wait may last (thread_options::timeout): the deadline of a fence on its work.
  std::chrono::milliseconds timeout() const { return std::chrono::duration_cast<std::chrono::milliseconds>(world_->options().timeout); }

 private:
  void check_peer(int peer, const char* what) const {
    require(peer >= 0 && peer < size() && peer != rank_, "commpact::ThreadComm::", what, ": rank ", rank_,
            " named peer ", peer, "; a peer must be another rank in [0, ", size(), ").");
  }

  std::shared_ptr<detail::thread_world> world_;
  int rank_;
};

//! The handle of ThreadComm::irecv: `test()` takes the message when it has arrived,
//! `wait()` blocks for it (at most thread_options::timeout from the call). Both raise
//! peer_failure when the sender failed or returned without sending it, and
//! mismatch_error when its size is not the buffer's. Destroying a pending handle waits.
class ThreadComm::recv_request {
 public:
  recv_request() = default;
  recv_request(recv_request&& o) noexcept { *this = std::move(o); }
  recv_request& operator=(recv_request&& o) noexcept {
    if (this != &o) {
      finish_noexcept();
      world_ = std::move(o.world_);
      src_ = o.src_, dst_ = o.dst_, ticket_ = o.ticket_, buf_ = o.buf_, started_ = o.started_;
    }
    return *this;
  }
  recv_request(const recv_request&) = delete;
  recv_request& operator=(const recv_request&) = delete;
  ~recv_request() { finish_noexcept(); }

  bool test() {
    if (!world_) return true;
    std::vector<std::byte> m;
    bool got = false;
    guarded([&] { got = world_->try_take(src_, dst_, ticket_, m, started_ + world_->options().timeout); });
    if (got) deliver(m);
    return got;
  }
  void wait() {
    if (!world_) return;
    std::vector<std::byte> m;
    guarded([&] { world_->take(src_, dst_, ticket_, m); });
    deliver(m);
  }
  bool pending() const { return world_ != nullptr; }

 private:
  friend class ThreadComm;
  template <class F>
  void guarded(F&& f) {
    try {
      f();
    } catch (...) {
      world_.reset();
      throw;
    }
  }
  void deliver(std::vector<std::byte>& m) {
    auto w = std::move(world_);
    if (m.size() != buf_.size()) {
      w->fail_with<mismatch_error>(
          dst_, detail::cat("commpact::ThreadComm::irecv: rank ", dst_, " expected ", buf_.size(),
                            " bytes from rank ", src_, " and received ", m.size(),
                            "; sender and receiver must agree on every message's size."));
    }
    if (!m.empty()) std::memcpy(buf_.data(), m.data(), m.size());
    m.clear();
    if (m.capacity()) w->recycle(src_, dst_, std::move(m));
  }
  void finish_noexcept() noexcept {
    if (!world_) return;
    try {
      wait();
    } catch (...) {
    }
  }

  std::shared_ptr<detail::thread_world> world_;
  int src_ = 0, dst_ = 0;
  std::uint64_t ticket_ = 0;
  std::span<std::byte> buf_;
  std::chrono::steady_clock::time_point started_{};
};

inline ThreadComm::recv_request ThreadComm::irecv(int peer, std::span<std::byte> buf) {
  check_peer(peer, "irecv");
  recv_request r;
  r.ticket_ = world_->post_recv(peer, rank_);
  r.world_ = world_;
  r.src_ = peer, r.dst_ = rank_, r.buf_ = buf, r.started_ = std::chrono::steady_clock::now();
  return r;
}

static_assert(PointToPoint<ThreadComm>);
static_assert(AsyncPointToPoint<ThreadComm>);

//! Runs fn(ThreadComm&) on P threads, one per rank, and joins them. If a rank throws,
//! it is marked failed: ranks that wait for it raise peer_failure rather than hang,
//! while operations that can complete still do. After all ranks ended, the error of
//! the lowest rank that failed for its own reason (not a peer_failure) is rethrown, so
//! when every rank fails for the same reason, that reason comes out, deterministically.
template <class F>
void run_threads(int P, F&& fn, thread_options opt = {}) {
  detail::checked_world_size(P);  // before anything is allocated
  auto comms = ThreadComm::make_world(P, opt);
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(P));
  std::vector<char> root_cause(static_cast<std::size_t>(P), 0);
  auto body = [&](int r) {
    try {
      fn(comms[r]);
    } catch (const peer_failure&) {
      errors[r] = std::current_exception();
    } catch (const std::exception& e) {
      errors[r] = std::current_exception();
      root_cause[r] = 1;
      comms[r].abort(detail::cat("threw: ", e.what()));
    } catch (...) {
      errors[r] = std::current_exception();
      root_cause[r] = 1;
      comms[r].abort("threw a non-standard exception");
    }
    comms[r].leave();
  };
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(P - 1));
  for (int r = 1; r < P; ++r) {
    try {
      threads.emplace_back(body, r);
    } catch (const std::system_error& e) {
      const std::string why = detail::cat("could not start the thread of rank ", r, ": ", e.what());
      for (int q = r; q < P; ++q) comms[q].abort(why);  // the started ranks raise instead of waiting
      for (auto& t : threads) t.join();
      throw comm_error(detail::cat("commpact::run_threads: ", why, "; run fewer ranks (P = ", P, ")."));
    }
  }
  body(0);
  for (auto& t : threads) t.join();
  for (int r = 0; r < P; ++r)
    if (errors[r] && root_cause[r]) std::rethrow_exception(errors[r]);
  for (int r = 0; r < P; ++r)
    if (errors[r]) std::rethrow_exception(errors[r]);
}

}  // namespace commpact
