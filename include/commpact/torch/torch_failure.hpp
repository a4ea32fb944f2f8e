// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file torch_failure.hpp
//! TorchComm's failure handling (include torch_comm.hpp, or commpact/torch.hpp): its
//! options, the failure notice in the c10d::Store (`<name>/failed`), and the wait on a
//! collective's c10d Work within the deadline, polling the store; see torch_comm.hpp's
//! file comment for the semantics. detail::torch_failure is the part of a TorchComm's
//! shared state (detail::torch_state, torch_p2p.hpp) that every operation goes through.

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "../error.hpp"

namespace commpact {

struct torch_options {
  //! Every wait raises timeout_error (and tells the other ranks) after this long.
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
  //! Check each collective's signature across ranks first (one small allreduce).
  bool verify_collectives = true;
  //! Key prefix of the failure notice in the store; unique per TorchComm on one store.
  std::string name = "commpact";
  //! How often a waiting rank looks for a failure notice in the store.
  std::chrono::milliseconds poll{20};
};

namespace detail {

template <class T>
constexpr bool torch_reducible = std::is_same_v<T, float> || std::is_same_v<T, double> ||
                                 std::is_same_v<T, std::int32_t> || std::is_same_v<T, std::int64_t>;

template <class T>
at::ScalarType torch_dtype() {
  if constexpr (std::is_same_v<T, float>) return at::kFloat;
  else if constexpr (std::is_same_v<T, double>) return at::kDouble;
  else if constexpr (std::is_same_v<T, std::int32_t>) return at::kInt;
  else return at::kLong;
}

//! The advice a timeout's message ends with (the hooks name their timeout= for the option).
inline constexpr std::string_view torch_timeout_advice = "; raise torch_options::timeout if the ranks are just slow";

inline at::Tensor torch_bytes(std::size_t n) {
  return at::empty({static_cast<std::int64_t>(n)}, at::TensorOptions().dtype(at::kByte));
}

inline std::string exception_text(const std::exception_ptr& e) {
  if (!e) return "an unknown error";
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    std::string s = x.what();
    if (const auto nl = s.find("\nException raised from"); nl != std::string::npos) s.resize(nl);
    return s;
  } catch (...) {
    return "a non-standard exception";
  }
}

//! The group, the store and the failure state of one TorchComm (the base of its shared
//! state): entry checks, the notice, and the deadline-bounded wait on a collective.
class torch_failure {
 public:
  torch_failure(c10::intrusive_ptr<c10d::ProcessGroup> pg, c10::intrusive_ptr<c10d::Store> store, torch_options opt)
      : pg_(std::move(pg)), store_(std::move(store)), opt_(std::move(opt)) {
    require(pg_.defined(), "commpact::TorchComm: the process group is null; pass the group the ranks share.");
    detail::require_timeout(opt_.timeout, "commpact::TorchComm: torch_options::timeout");
    require(opt_.poll.count() > 0, "commpact::TorchComm: torch_options::poll must be positive.");
    require(!opt_.name.empty(), "commpact::TorchComm: torch_options::name is empty; name the communicator.");
    rank_ = pg_->getRank();
    size_ = pg_->getSize();
    key_ = opt_.name + "/failed";
  }
  int rank() const { return rank_; }
  int size() const { return size_; }
  const torch_options& options() const { return opt_; }
  c10d::ProcessGroup& pg() { return *pg_; }
  const c10::intrusive_ptr<c10d::ProcessGroup>& group() const { return pg_; }
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  std::string failure() const {
    std::lock_guard<std::mutex> g(m_);
    return failure_;
  }

  //! Raises peer_failure when this communicator already failed (on entry of every call).
  //! Also looks for a notice when the last look is older than `poll`: a rank that comes
  //! back late must not join collectives the others abandoned.
  void enter(const char* what) {
    if (failed()) {
      const auto [why, own] = verdict();
      const auto msg = cat("commpact::TorchComm::", what, ": the communicator failed earlier (", why,
                           own ? torch_timeout_advice : std::string_view(),
                           "); no further operation runs on it. Build a new group.");
      if (own) throw timeout_error(msg);
      throw peer_failure(msg);
    }
    const auto now = std::chrono::steady_clock::now().time_since_epoch().count();
    const auto poll = std::chrono::duration_cast<std::chrono::steady_clock::duration>(opt_.poll).count();
    if (now - last_look_.load(std::memory_order_relaxed) >= poll) {
      last_look_.store(now, std::memory_order_relaxed);
      check_notice(what);
    }
  }

  //! Marks the communicator failed here and writes the notice for the other ranks.
  //! `own_timeout`: this rank's deadline passed (a wait, or a send no peer received).
  //! `closed`: a send's connection closed before its deadline, which this rank's own
  //! receive timing out also causes (Gloo closes the pairs): see timed_out_over_closed.
  void fail_and_tell(const std::string& why, bool own_timeout = false, bool closed = false) noexcept {
    {
      std::lock_guard<std::mutex> g(m_);
      if (failed_.load()) return;
      failure_ = why;
      own_timeout_ = own_timeout;
      closed_ = closed;
      failed_.store(true, std::memory_order_release);
    }
    if (!store_.defined()) return;
    try {
      const std::vector<std::uint8_t> v(why.begin(), why.end());
      store_->set(key_, v);
    } catch (...) {
    }
  }

  //! A wait of this rank reached its own deadline: when the failure recorded so far is a
  //! send's closed connection (which that timeout may have caused), `why` (this rank's
  //! timeout) replaces it, so that this rank's waits say that it timed out. The notice the
  //! peers read is not rewritten.
  void timed_out_over_closed(const std::string& why) noexcept {
    std::lock_guard<std::mutex> g(m_);
    if (!failed_.load() || !closed_) return;
    failure_ = why;
    own_timeout_ = true;
    closed_ = false;
  }

  //! Raises for a communicator that failed while `what` waited: timeout_error with the
  //! advice when this rank's own deadline passed first (another thread's wait, the send
  //! reaper), peer_failure otherwise. Every wait of a rank whose deadline passed says so,
  //! whichever of its waits noticed first.
  [[noreturn]] void raise_failed(std::string_view who, const char* what) const {
    const auto [why, own] = verdict();
    if (own) throw timeout_error(cat(who, what, ": ", why, torch_timeout_advice, "."));
    throw peer_failure(cat(who, what, ": rank ", rank_, " gave up waiting: ", why));
  }

  //! The failure recorded so far, and whether it is this rank's own deadline.
  std::pair<std::string, bool> verdict() const {
    std::lock_guard<std::mutex> g(m_);
    return {failure_, own_timeout_};
  }

  //! Raises peer_failure when another rank left a notice.
  void check_notice(const char* what) {
    if (!store_.defined()) return;
    bool there = false;
    try {
      there = store_->check({key_});
    } catch (...) {
      return;  // a store that cannot answer is not a notice; the deadline still holds
    }
    if (!there) return;
    std::string why;
    try {
      const auto v = store_->get(key_);
      why.assign(v.begin(), v.end());
    } catch (...) {
      why = "another rank failed";
    }
    {
      std::lock_guard<std::mutex> g(m_);
      if (!failed_.load()) {
        failure_ = why;
        failed_.store(true, std::memory_order_release);
      }
    }
    throw peer_failure(cat("commpact::TorchComm::", what, ": rank ", rank_, " gave up waiting: ", why));
  }

  //! Waits for `w` within the deadline; a failure here or elsewhere raises (see the file
  //! comment). `abortable`: a point-to-point Work, aborted when the wait gives up.
  void wait(const c10::intrusive_ptr<c10d::Work>& w, const char* what, bool abortable) {
    using clk = std::chrono::steady_clock;
    const auto t0 = clk::now();
    auto next_check = t0 + opt_.poll;
    long spins = 0;
    while (!w->isCompleted()) {
      if (failed()) {
        if (abortable) abort_work(w);
        raise_failed("commpact::TorchComm::", what);
      }
      if (++spins < 64) {
        std::this_thread::yield();
        continue;
      }
      const auto now = clk::now();
      if (now >= next_check) {
        try {
          check_notice(what);
        } catch (...) {
          if (abortable) abort_work(w);
          throw;
        }
        next_check = now + opt_.poll;
      }
      if (now - t0 > opt_.timeout) {
        if (abortable) abort_work(w);
        const auto why = cat("rank ", rank_, " timed out after ", opt_.timeout.count(), " ms in ", what,
                             " (a rank did not join, or ranks called different operations)");
        fail_and_tell(why, true);
        throw timeout_error(cat("commpact::TorchComm::", what, ": ", why, torch_timeout_advice, "."));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(spins < 2000 ? 20 : 200));
    }
    // exception(), not isSuccess(): ProcessGroupNCCL's WorkNCCL throws NotImplementedError from
    // isSuccess() (PyTorch 2.x); every Work has exception() (null when it succeeded).
    if (const std::exception_ptr failure = w->exception()) {
      check_notice(what);  // a peer that aborted and left: its reason, not the closed connection
      const auto why = cat("rank ", rank_, ": the process group failed in ", what, ": ", exception_text(failure));
      fail_and_tell(why);
      throw comm_error(cat("commpact::TorchComm::", what, ": ", why));
    }
  }

  //! Runs `start` (which returns a Work); an exception there fails the communicator.
  template <class F>
  c10::intrusive_ptr<c10d::Work> start(const char* what, F&& f) {
    try {
      return f();
    } catch (const commpact::error&) {
      throw;
    } catch (const std::exception& e) {
      const auto why = cat("rank ", rank_, ": the process group refused ", what, ": ",
                           exception_text(std::current_exception()));
      fail_and_tell(why);
      throw comm_error(cat("commpact::TorchComm::", what, ": ", why));
    }
  }

 protected:
  static void abort_work(const c10::intrusive_ptr<c10d::Work>& w) noexcept {
    try {
      w->abort();
    } catch (...) {
    }
  }

  c10::intrusive_ptr<c10d::ProcessGroup> pg_;
  c10::intrusive_ptr<c10d::Store> store_;
  torch_options opt_;
  std::string key_;
  int rank_ = 0, size_ = 1;
  mutable std::mutex m_;
  std::atomic<bool> failed_{false};
  std::atomic<std::int64_t> last_look_{0};
  std::string failure_;
  bool own_timeout_ = false;  // under m_: the failure is this rank's own deadline
  bool closed_ = false;       // under m_: a send's connection closed (see fail_and_tell)
};

}  // namespace detail

}  // namespace commpact
