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
//! bit-identical results. Every wait has a deadline (`thread_options::timeout`). A rank
//! that throws, calls abort(), times out or returns while others wait in a collective
//! marks the world failed: every other rank raises commpact::peer_failure instead of
//! waiting. run_threads() joins every rank and rethrows the first root-cause error.

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <vector>

#include "../concepts.hpp"
#include "../error.hpp"

namespace commpact {

struct thread_options {
  //! Longest time one rank waits for the others in any operation.
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
};

namespace detail {

enum class coll_kind : int { none, barrier, allreduce, allgather, broadcast };

inline const char* coll_name(coll_kind k) {
  switch (k) {
    case coll_kind::barrier: return "barrier";
    case coll_kind::allreduce: return "allreduce";
    case coll_kind::allgather: return "allgather";
    case coll_kind::broadcast: return "broadcast";
    default: return "none";
  }
}

//! Shared state of the ranks of one ThreadComm world.
class thread_world {
 public:
  struct slot {
    coll_kind kind = coll_kind::none;
    const void* src = nullptr;  // the rank's input buffer
    std::size_t bytes = 0;
    int type_tag = 0;  // element type id, or the reduce op / root
    int extra = 0;
  };

  thread_world(int P, thread_options opt) : size_(P), opt_(opt), slots_(P), scratch_(P), left_(P, false),
                                            arrived_(P, false), boxes_(static_cast<std::size_t>(P) * P) {
    require(P >= 1, "commpact::ThreadComm: a world needs at least one rank, got P = ", P, ".");
  }

  int size() const { return size_; }
  const thread_options& options() const { return opt_; }

  //! Marks the world failed (first reason wins) and wakes every waiter.
  void fail(std::string why) {
    {
      std::lock_guard lk(m_);
      if (!failed_) {
        failed_ = true;
        failure_ = std::move(why);
      }
    }
    cv_.notify_all();
  }

  void leave(int rank) {
    {
      std::lock_guard lk(m_);
      left_[rank] = true;
    }
    cv_.notify_all();
  }

  //! Posts this rank's slot and waits until every rank has posted (barrier 1).
  void post_and_wait(int rank, const slot& s) {
    std::unique_lock lk(m_);
    slots_[rank] = s;
    arrive_locked(rank, lk, coll_name(s.kind));
  }

  //! A plain barrier among all ranks.
  void wait_all(int rank, const char* what) {
    std::unique_lock lk(m_);
    arrive_locked(rank, lk, what);
  }

  const slot& slot_of(int r) const { return slots_[r]; }
  std::vector<std::byte>& scratch(int r) { return scratch_[r]; }

  // ---- point to point -------------------------------------------------------
  void send(int src, int dst, std::span<const std::byte> msg) {
    {
      std::lock_guard lk(m_);
      throw_if_failed_locked(src, "send");
      auto& box = boxes_[idx(src, dst)];
      std::vector<std::byte> v;
      if (!box.spare.empty()) {
        v = std::move(box.spare.back());
        box.spare.pop_back();
      }
      v.assign(msg.begin(), msg.end());
      box.queue.push_back(std::move(v));
    }
    cv_.notify_all();
  }

  void recv(int src, int dst, std::vector<std::byte>& out) {
    std::unique_lock lk(m_);
    auto& box = boxes_[idx(src, dst)];
    const auto deadline = std::chrono::steady_clock::now() + opt_.timeout;
    while (box.queue.empty()) {
      throw_if_failed_locked(dst, "recv");
      if (left_[src]) {
        failed_ = true;
        failure_ = detail::cat("rank ", src, " returned while rank ", dst, " waited for a message from it");
        cv_.notify_all();
        throw peer_failure(detail::cat("commpact::ThreadComm: rank ", dst, ": ", failure_, "."));
      }
      if (cv_.wait_until(lk, deadline) == std::cv_status::timeout && box.queue.empty()) {
        timeout_locked(dst, detail::cat("recv from rank ", src));
      }
    }
    std::swap(out, box.queue.front());
    box.queue.pop_front();
  }

  //! Returns `old` storage to the pool of the (src, dst) mailbox for reuse by send.
  void recycle(int src, int dst, std::vector<std::byte>&& old) {
    std::lock_guard lk(m_);
    boxes_[idx(src, dst)].spare.push_back(std::move(old));
  }

  void throw_if_failed(int rank, const char* what) {
    std::lock_guard lk(m_);
    throw_if_failed_locked(rank, what);
  }

 private:
  struct mailbox {
    std::deque<std::vector<std::byte>> queue;
    std::vector<std::vector<std::byte>> spare;
  };

  std::size_t idx(int src, int dst) const { return static_cast<std::size_t>(src) * size_ + dst; }

  void throw_if_failed_locked(int rank, const char* what) const {
    if (failed_)
      throw peer_failure(detail::cat("commpact::ThreadComm: rank ", rank, " abandoned ", what, " because the world failed: ",
                                     failure_, "."));
  }

  [[noreturn]] void timeout_locked(int rank, const std::string& what) {
    const auto ms = opt_.timeout.count();
    if (!failed_) {
      failed_ = true;
      failure_ = detail::cat("rank ", rank, " waited more than ", ms, " ms in ", what);
    }
    cv_.notify_all();
    throw timeout_error(detail::cat("commpact::ThreadComm: rank ", rank, " waited more than ", ms, " ms in ", what,
                                    "; another rank is missing or much slower. Raise thread_options::timeout if the "
                                    "work is legitimately slow."));
  }

  void arrive_locked(int rank, std::unique_lock<std::mutex>& lk, const char* what) {
    throw_if_failed_locked(rank, what);
    const auto gen = generation_;
    arrived_[rank] = true;
    if (++count_ == size_) {
      count_ = 0;
      std::fill(arrived_.begin(), arrived_.end(), false);
      ++generation_;
      cv_.notify_all();
      return;
    }
    const auto deadline = std::chrono::steady_clock::now() + opt_.timeout;
    while (generation_ == gen) {
      throw_if_failed_locked(rank, what);
      for (int r = 0; r < size_; ++r) {
        if (left_[r] && !arrived_[r]) {
          failed_ = true;
          failure_ = detail::cat("rank ", r, " returned while rank ", rank, " waited for it in ", what);
          cv_.notify_all();
          throw peer_failure(detail::cat("commpact::ThreadComm: rank ", rank, ": ", failure_, "."));
        }
      }
      if (cv_.wait_until(lk, deadline) == std::cv_status::timeout && generation_ == gen) {
        timeout_locked(rank, what);
      }
    }
  }

  int size_;
  thread_options opt_;
  std::mutex m_;
  std::condition_variable cv_;
  std::uint64_t generation_ = 0;
  int count_ = 0;
  bool failed_ = false;
  std::string failure_;
  std::vector<slot> slots_;
  std::vector<std::vector<std::byte>> scratch_;
  std::vector<bool> left_;
  std::vector<bool> arrived_;
  std::vector<mailbox> boxes_;
};

template <class T>
constexpr int type_tag() {
  if constexpr (std::is_same_v<T, float>) return 1;
  else if constexpr (std::is_same_v<T, double>) return 2;
  else if constexpr (std::is_same_v<T, std::int32_t>) return 3;
  else if constexpr (std::is_same_v<T, std::int64_t>) return 4;
  else if constexpr (std::is_same_v<T, std::uint32_t>) return 5;
  else if constexpr (std::is_same_v<T, std::uint64_t>) return 6;
  else return 100 + static_cast<int>(sizeof(T));
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
  template <class T>
    requires std::is_arithmetic_v<T>
  void allreduce(std::span<T> data, reduce_op op = reduce_op::sum) {
    auto& w = *world_;
    const int P = w.size();
    w.post_and_wait(rank_, {detail::coll_kind::allreduce, data.data(), data.size_bytes(), detail::type_tag<T>(),
                            static_cast<int>(op)});
    check_agree(detail::coll_kind::allreduce, "allreduce");
    const std::size_t n = data.size();
    // This rank reduces chunk [lo, hi) into its own scratch.
    const std::size_t lo = n * rank_ / P, hi = n * (rank_ + 1) / P;
    auto& mine = w.scratch(rank_);
    if (mine.size() < (hi - lo) * sizeof(T)) mine.resize((hi - lo) * sizeof(T));
    T* acc = reinterpret_cast<T*>(mine.data());
    const T* first = static_cast<const T*>(w.slot_of(0).src);
    std::copy(first + lo, first + hi, acc);
    for (int r = 1; r < P; ++r) {
      const T* src = static_cast<const T*>(w.slot_of(r).src);
      for (std::size_t i = lo; i < hi; ++i) {
        T& a = acc[i - lo];
        const T b = src[i];
        switch (op) {
          case reduce_op::sum: a = static_cast<T>(a + b); break;
          case reduce_op::min: a = b < a ? b : a; break;
          case reduce_op::max: a = a < b ? b : a; break;
        }
      }
    }
    w.wait_all(rank_, "allreduce");
    for (int r = 0; r < P; ++r) {
      const std::size_t rlo = n * r / P, rhi = n * (r + 1) / P;
      if (rhi > rlo) std::memcpy(data.data() + rlo, w.scratch(r).data(), (rhi - rlo) * sizeof(T));
    }
  }

  //! Concatenates every rank's `in` (all the same size) into `out` in rank order.
  template <class T>
    requires std::is_trivially_copyable_v<T>
  void allgather(std::span<const T> in, std::span<T> out) {
    auto& w = *world_;
    const int P = w.size();
    require(out.size() == in.size() * static_cast<std::size_t>(P), "commpact::ThreadComm::allgather: rank ", rank_,
            " passed an output of ", out.size(), " elements; it must hold size() * in.size() = ", P, " * ", in.size(),
            ".");
    w.post_and_wait(rank_, {detail::coll_kind::allgather, in.data(), in.size_bytes(), detail::type_tag<T>(), 0});
    check_agree(detail::coll_kind::allgather, "allgather");
    for (int r = 0; r < P; ++r) {
      if (!in.empty()) std::memcpy(out.data() + r * in.size(), w.slot_of(r).src, in.size_bytes());
    }
    w.wait_all(rank_, "allgather");
  }

  //! Copies root's data to every rank.
  template <class T>
    requires std::is_trivially_copyable_v<T>
  void broadcast(std::span<T> data, int root) {
    auto& w = *world_;
    require(root >= 0 && root < w.size(), "commpact::ThreadComm::broadcast: root ", root, " is outside [0, ", w.size(),
            ").");
    w.post_and_wait(rank_, {detail::coll_kind::broadcast, data.data(), data.size_bytes(), detail::type_tag<T>(), root});
    check_agree(detail::coll_kind::broadcast, "broadcast");
    if (rank_ != root && !data.empty()) std::memcpy(data.data(), w.slot_of(root).src, data.size_bytes());
    w.wait_all(rank_, "broadcast");
  }

  void barrier() { world_->post_and_wait(rank_, {detail::coll_kind::barrier, nullptr, 0, 0, 0}); }

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

  //! Marks the world failed: every other rank's current or next operation raises.
  void abort(std::string_view why) {
    world_->fail(detail::cat("rank ", rank_, " aborted: ", why));
  }

  //! Called by run_threads when this rank's function returns.
  void leave() { world_->leave(rank_); }

  const thread_options& options() const { return world_->options(); }

 private:
  void check_peer(int peer, const char* what) const {
    require(peer >= 0 && peer < size() && peer != rank_, "commpact::ThreadComm::", what, ": rank ", rank_,
            " named peer ", peer, "; a peer must be another rank in [0, ", size(), ").");
  }

  //! After barrier 1 every rank sees the same slots, so every rank throws alike.
  void check_agree(detail::coll_kind kind, const char* what) {
    auto& w = *world_;
    const auto& s0 = w.slot_of(0);
    for (int r = 0; r < w.size(); ++r) {
      const auto& s = w.slot_of(r);
      if (s.kind != kind) {
        throw mismatch_error(detail::cat("commpact::ThreadComm: rank ", rank_, " called ", what, " while rank ", r,
                                         " called ", detail::coll_name(s.kind),
                                         "; every rank must call the same collectives in the same order."));
      }
      if (s.bytes != s0.bytes || s.type_tag != s0.type_tag || s.extra != s0.extra) {
        throw mismatch_error(detail::cat("commpact::ThreadComm::", what, ": ranks disagree: rank 0 passed ", s0.bytes,
                                         " bytes (type ", s0.type_tag, ", op/root ", s0.extra, "), rank ", r, " passed ",
                                         s.bytes, " bytes (type ", s.type_tag, ", op/root ", s.extra,
                                         "); every rank must pass the same size, type and op."));
      }
    }
    // A second barrier is not needed here: no rank writes a slot before the next barrier 1.
  }

  std::shared_ptr<detail::thread_world> world_;
  int rank_;
};

static_assert(PointToPoint<ThreadComm>);

//! Runs fn(ThreadComm&) on P threads, one per rank, and joins them. If any rank
//! throws, the world is marked failed (the others raise peer_failure rather than
//! hang) and the first root-cause exception is rethrown here after all ranks ended.
template <class F>
void run_threads(int P, F&& fn, thread_options opt = {}) {
  auto comms = ThreadComm::make_world(P, opt);
  std::vector<std::exception_ptr> errors(P);
  std::vector<int> root_cause(P, 0);
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
  threads.reserve(P > 0 ? P - 1 : 0);
  for (int r = 1; r < P; ++r) threads.emplace_back(body, r);
  body(0);
  for (auto& t : threads) t.join();
  for (int r = 0; r < P; ++r)
    if (errors[r] && root_cause[r]) std::rethrow_exception(errors[r]);
  for (int r = 0; r < P; ++r)
    if (errors[r]) std::rethrow_exception(errors[r]);
}

}  // namespace commpact
