// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file thread_world.hpp
//! The shared state behind ThreadComm (thread_comm.hpp): slots, barriers, mailboxes,
//! the collective verdict and the failure bookkeeping. An implementation detail.
//!
//! Protocol of one collective: every rank posts its slot and waits (barrier 1). The
//! last rank to arrive checks all slots under the lock and records one verdict (ok,
//! invalid argument, or mismatch) before it releases the others, so every rank raises
//! the same error, and no rank can post its next slot before the verdict exists. Slots
//! are read outside the lock only between barrier 1 and barrier 2 of a successful
//! collective, when no rank can post.
//!
//! Failure: a rank is dead once it aborted, timed out or raised peer_failure; the world
//! is failed once any rank is dead. A collective on a failed world raises at once (it
//! needs every rank). A receive raises only when its sender is dead or has returned
//! and the message is not there, so operations that can still complete do complete,
//! and a rank that fails for its own reason raises that reason, whatever the timing.

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "../concepts.hpp"
#include "../detail/serial_worker.hpp"
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

inline std::string type_tag_name(int tag) {
  static constexpr const char* names[] = {"none", "float", "double", "int32", "int64", "uint32", "uint64"};
  if (tag >= 0 && tag <= 6) return names[tag];
  return cat("a ", tag - 100, "-byte type");
}

inline int checked_world_size(int P) {
  require(P >= 1, "commpact::ThreadComm: a world needs at least one rank, got P = ", P,
          "; pass the number of ranks (threads) to run, >= 1.");
  return P;
}

//! Shared state of the ranks of one ThreadComm world.
class thread_world {
 public:
  struct slot {
    coll_kind kind = coll_kind::none;
    const void* src = nullptr;  // the rank's input buffer
    std::size_t bytes = 0;
    int type_tag = 0;
    int extra = 0;              // reduce op or root
    std::string_view bad = {};  // this rank's invalid-argument message, empty when none
  };

  thread_world(int P, thread_options opt)
      : size_(checked_world_size(P)), opt_(opt), slots_(static_cast<std::size_t>(size_)),
        scratch_(static_cast<std::size_t>(size_)), left_(static_cast<std::size_t>(size_), false),
        dead_(static_cast<std::size_t>(size_), false), arrived_(static_cast<std::size_t>(size_), false),
        boxes_(static_cast<std::size_t>(size_) * static_cast<std::size_t>(size_)) {
    require_timeout(opt_.timeout, "commpact::ThreadComm: thread_options::timeout");
    workers_.reserve(static_cast<std::size_t>(size_));
    for (int r = 0; r < size_; ++r) workers_.push_back(std::make_unique<serial_worker>());
  }
  thread_world(const thread_world&) = delete;
  thread_world& operator=(const thread_world&) = delete;
  //! Runs what the ranks' workers still hold (each task ends, at the latest, at its
  //! deadline) before the state the tasks use goes away.
  ~thread_world() { workers_.clear(); }

  //! The worker that runs rank `rank`'s nonblocking operations, in the order started.
  serial_worker& worker(int rank) { return *workers_[static_cast<std::size_t>(rank)]; }

  int size() const { return size_; }
  const thread_options& options() const { return opt_; }

  //! Marks `rank` dead and the world failed (the first reason wins); wakes every waiter.
  void fail(int rank, std::string why) {
    {
      std::lock_guard lk(m_);
      mark_dead_locked(rank, std::move(why));
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

  //! Posts this rank's slot, waits until every rank has posted (barrier 1), then raises
  //! the verdict the last rank recorded: the same error class and text on every rank.
  void post_and_wait(int rank, const slot& s) {
    std::unique_lock lk(m_);
    throw_if_failed_locked(rank, coll_name(s.kind));
    slots_[rank] = s;
    arrive_locked(rank, lk, coll_name(s.kind), true);
    if (verdict_ == verdict::invalid) throw invalid_argument(verdict_text_);
    if (verdict_ == verdict::mismatch) throw mismatch_error(verdict_text_);
  }

  //! A plain barrier among all ranks (barrier 2 of a collective).
  void wait_all(int rank, const char* what) {
    std::unique_lock lk(m_);
    throw_if_failed_locked(rank, what);
    arrive_locked(rank, lk, what, false);
  }

  const slot& slot_of(int r) const { return slots_[r]; }
  std::vector<std::byte>& scratch(int r) { return scratch_[r]; }

  // ---- point to point -------------------------------------------------------
  //! Queues a copy of msg; raises only when this rank itself is dead (a send never
  //! waits, so it completes even when the receiver failed).
  void send(int src, int dst, std::span<const std::byte> msg) {
    {
      std::lock_guard lk(m_);
      if (dead_[src]) throw_abandoned_locked(src, "send");
      auto& box = boxes_[idx(src, dst)];
      std::vector<std::byte> v;
      if (!box.spare.empty()) {
        v = std::move(box.spare.back());
        box.spare.pop_back();
      }
      v.assign(msg.begin(), msg.end());
      box.queue.emplace_back(std::move(v));
    }
    cv_.notify_all();
  }

  //! Reserves the next message from src to dst: receives (blocking or not) match the
  //! sender's messages in the order they were posted.
  std::uint64_t post_recv(int src, int dst) {
    std::lock_guard lk(m_);
    if (dead_[dst]) throw_abandoned_locked(dst, "recv");
    return boxes_[idx(src, dst)].posted++;
  }

  //! Takes message `ticket` (from post_recv) when it is there: true and `out` holds it.
  //! Raises when it can no longer come (the sender failed or returned), or, with a
  //! deadline, when the deadline passed.
  bool try_take(int src, int dst, std::uint64_t ticket, std::vector<std::byte>& out,
                std::optional<std::chrono::steady_clock::time_point> deadline = {}) {
    std::unique_lock lk(m_);
    if (take_locked(src, dst, ticket, out)) return true;
    give_up_if_hopeless_locked(src, dst);
    if (deadline && std::chrono::steady_clock::now() >= *deadline) timeout_locked(dst, cat("recv from rank ", src));
    return false;
  }

  //! Blocks until message `ticket` is there, at most thread_options::timeout.
  void take(int src, int dst, std::uint64_t ticket, std::vector<std::byte>& out) {
    std::unique_lock lk(m_);
    const auto deadline = std::chrono::steady_clock::now() + opt_.timeout;
    while (!take_locked(src, dst, ticket, out)) {
      give_up_if_hopeless_locked(src, dst);
      if (cv_.wait_until(lk, deadline) == std::cv_status::timeout && !ready_locked(src, dst, ticket)) {
        timeout_locked(dst, cat("recv from rank ", src));
      }
    }
  }

  void recv(int src, int dst, std::vector<std::byte>& out) { take(src, dst, post_recv(src, dst), out); }

  //! Marks `rank` dead with a reason of its own (a receive that found a message of the
  //! wrong size) and raises it as E.
  template <class E>
  [[noreturn]] void fail_with(int rank, const std::string& why) {
    fail(rank, why);
    throw E(why);
  }

  //! Returns `old` storage to the pool of the (src, dst) mailbox for reuse by send.
  void recycle(int src, int dst, std::vector<std::byte>&& old) {
    std::lock_guard lk(m_);
    boxes_[idx(src, dst)].spare.push_back(std::move(old));
  }

 private:
  struct mailbox {
    std::deque<std::optional<std::vector<std::byte>>> queue;  // message head + i; taken ones are empty
    std::uint64_t head = 0;                                   // sequence number of queue.front()
    std::uint64_t posted = 0;                                 // receives posted so far
    std::vector<std::vector<std::byte>> spare;
  };

  bool ready_locked(int src, int dst, std::uint64_t ticket) const {
    const auto& box = boxes_[idx(src, dst)];
    return ticket >= box.head && ticket - box.head < box.queue.size() && box.queue[ticket - box.head].has_value();
  }

  bool take_locked(int src, int dst, std::uint64_t ticket, std::vector<std::byte>& out) {
    if (!ready_locked(src, dst, ticket)) return false;
    auto& box = boxes_[idx(src, dst)];
    auto& m = box.queue[ticket - box.head];
    std::swap(out, *m);
    m.reset();
    while (!box.queue.empty() && !box.queue.front().has_value()) {
      box.queue.pop_front();
      ++box.head;
    }
    return true;
  }

  //! The message has not come: raise when it never can.
  void give_up_if_hopeless_locked(int src, int dst) {
    if (dead_[dst]) throw_abandoned_locked(dst, "recv");
    if (dead_[src]) throw_abandoned_locked(dst, "recv");
    if (left_[src]) {
      mark_dead_locked(dst, cat("rank ", src, " returned while rank ", dst, " waited for a message from it"));
      throw peer_failure(cat("commpact::ThreadComm: rank ", dst, ": rank ", src, " returned while rank ", dst,
                             " waited for a message from it; every message a rank receives must be sent."));
    }
  }
  enum class verdict { ok, invalid, mismatch };

  std::size_t idx(int src, int dst) const { return static_cast<std::size_t>(src) * size_ + dst; }

  void mark_dead_locked(int rank, std::string why) {
    dead_[rank] = true;
    if (!failed_) {
      failed_ = true;
      failure_ = std::move(why);
    }
    cv_.notify_all();
  }

  //! This rank gives up: it becomes dead too, so ranks waiting for its messages wake.
  [[noreturn]] void throw_abandoned_locked(int rank, const char* what) {
    dead_[rank] = true;
    cv_.notify_all();
    throw peer_failure(cat("commpact::ThreadComm: rank ", rank, " abandoned ", what, " because the world failed: ",
                           without_stop(failure_), "."));
  }

  void throw_if_failed_locked(int rank, const char* what) {
    if (failed_) throw_abandoned_locked(rank, what);
  }

  [[noreturn]] void timeout_locked(int rank, const std::string& what) {
    const auto ms = opt_.timeout.count();
    mark_dead_locked(rank, cat("rank ", rank, " waited more than ", ms, " ms in ", what));
    throw timeout_error(cat("commpact::ThreadComm: rank ", rank, " waited more than ", ms, " ms in ", what,
                            "; another rank is missing or much slower. Raise thread_options::timeout if the "
                            "work is legitimately slow."));
  }

  //! Run by the last rank to post, under the lock: the one verdict every rank raises.
  void judge_locked() {
    verdict_ = verdict::ok;
    for (int r = 0; r < size_; ++r) {
      if (!slots_[r].bad.empty()) {
        verdict_ = verdict::invalid;
        verdict_text_ = cat(slots_[r].bad, " Every rank raises this error; no data moved and the communicator stays "
                                           "usable.");
        return;
      }
    }
    const auto& s0 = slots_[0];
    for (int r = 1; r < size_; ++r) {
      const auto& s = slots_[r];
      if (s.kind != s0.kind) {
        verdict_ = verdict::mismatch;
        verdict_text_ = cat("commpact::ThreadComm: ranks called different collectives: rank 0 called ",
                            coll_name(s0.kind), ", rank ", r, " called ", coll_name(s.kind),
                            "; every rank must call the same collectives in the same order. Every rank raises this "
                            "error and the communicator stays usable.");
        return;
      }
      if (s.bytes != s0.bytes || s.type_tag != s0.type_tag || s.extra != s0.extra) {
        const char* extra = s0.kind == coll_kind::broadcast ? "root" : "op";
        verdict_ = verdict::mismatch;
        verdict_text_ = cat("commpact::ThreadComm::", coll_name(s0.kind), ": ranks disagree: rank 0 passed ",
                            s0.bytes, " bytes of ", type_tag_name(s0.type_tag), " (", extra, " ", s0.extra, "), rank ",
                            r, " passed ", s.bytes, " bytes of ", type_tag_name(s.type_tag), " (", extra, " ", s.extra,
                            "); every rank must pass the same size, element type and ", extra,
                            ". Every rank raises this error and the communicator stays usable.");
        return;
      }
    }
  }

  void arrive_locked(int rank, std::unique_lock<std::mutex>& lk, const char* what, bool judge) {
    const auto gen = generation_;
    arrived_[rank] = true;
    if (++count_ == size_) {
      if (judge) judge_locked();
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
          mark_dead_locked(rank, cat("rank ", r, " returned while rank ", rank, " waited for it in ", what));
          throw peer_failure(cat("commpact::ThreadComm: rank ", rank, ": ", without_stop(failure_), "."));
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
  verdict verdict_ = verdict::ok;
  std::string verdict_text_;
  std::vector<slot> slots_;
  std::vector<std::vector<std::byte>> scratch_;
  std::vector<bool> left_;
  std::vector<bool> dead_;
  std::vector<bool> arrived_;
  std::vector<mailbox> boxes_;
  std::vector<std::unique_ptr<serial_worker>> workers_;  // last: destroyed (joined) first
};

}  // namespace detail
}  // namespace commpact
