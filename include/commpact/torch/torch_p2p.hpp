// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file torch_p2p.hpp
//! TorchComm's point to point (include torch_comm.hpp, or commpact/torch.hpp): the
//! length-header wire (torch_header_tag, torch_payload_tag), the receive queue per peer,
//! the reaper thread that waits for sends and the watchdog that aborts a blocked send or
//! receive when a failure notice arrives; see torch_comm.hpp's file comment.
//! detail::torch_state (a TorchComm's shared state) is torch_failure plus these.

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "../error.hpp"
#include "torch_failure.hpp"

namespace commpact {

inline constexpr int torch_header_tag = 0x63700;
inline constexpr int torch_payload_tag = 0x63701;

namespace detail {

//! What every copy of one TorchComm shares: the group, the store, the failure state and
//! the sends in flight.
class torch_state : public torch_failure {
 public:
  using torch_failure::torch_failure;

  // ---- point to point ---------------------------------------------------------------
  // Gloo's point-to-point Work completes only inside wait() (isCompleted() stays false),
  // so these waits block in Work::wait(timeout) while a watchdog thread looks for a
  // failure notice and aborts them when one arrives.

  //! Waits for a send or receive Work within the deadline (see the file comment).
  void wait_p2p(const c10::intrusive_ptr<c10d::Work>& w, const char* what) {
    using clk = std::chrono::steady_clock;
    const auto t0 = clk::now();
    watch(w);
    bool ok = false;
    std::exception_ptr ex;
    try {
      ok = w->wait(opt_.timeout);
    } catch (...) {
      ex = std::current_exception();
    }
    unwatch(w);
    if (ok && !ex) return;
    const bool late = clk::now() - t0 >= opt_.timeout;
    const auto timed_out = cat("rank ", rank_, " timed out after ", opt_.timeout.count(), " ms in ", what,
                               " (the peer did not send, or ranks called different operations)");
    // This wait's own deadline passed: it replaces a closed-connection verdict of the send
    // reaper, which the timeout itself may have caused (Gloo closes the pairs).
    if (late) timed_out_over_closed(timed_out);
    if (failed()) raise_failed("commpact::TorchComm::", what);
    check_notice(what);
    if (late) {
      fail_and_tell(timed_out, true);
      throw timeout_error(cat("commpact::TorchComm::", what, ": ", timed_out, torch_timeout_advice, "."));
    }
    if (settle_sends()) raise_failed("commpact::TorchComm::", what);
    const auto why = cat("rank ", rank_, ": the process group failed in ", what, ": ",
                         ex ? exception_text(ex) : std::string("the operation was aborted"));
    fail_and_tell(why);
    throw comm_error(cat("commpact::TorchComm::", what, ": ", why));
  }

  //! A send or receive failed with no verdict yet: when sends are in flight, waits (at most
  //! a second) for the reaper's verdict on them, since a send's deadline closes the pair
  //! under a receive before the reaper records it. True when a verdict arrived.
  bool settle_sends() {
    std::unique_lock<std::mutex> g(m_);
    if (sends_.empty() && sending_ == 0) return failed();
    cv_.wait_for(g, std::min<std::chrono::milliseconds>(opt_.timeout, std::chrono::seconds(1)),
                 [&] { return failed() || (sends_.empty() && sending_ == 0); });
    return failed();
  }

  //! A receive: its header Work, then (once the header arrived) its payload Work.
  struct pending_recv {
    int peer = -1;
    std::int64_t expected = -1;  // -1: any length (recv); else irecv's size
    at::Tensor header, payload;
    c10::intrusive_ptr<c10d::Work> header_work, payload_work;
    bool header_done = false;
    std::int64_t got = 0;
  };

  //! Posts the header receive of the next message from peer.
  std::shared_ptr<pending_recv> post_recv(int peer, std::int64_t expected, const char* what) {
    auto pr = std::make_shared<pending_recv>();
    pr->peer = peer;
    pr->expected = expected;
    pr->header = at::empty({1}, at::TensorOptions().dtype(at::kLong));
    std::vector<at::Tensor> t{pr->header};
    pr->header_work = start(what, [&] { return pg_->recv(t, peer, torch_header_tag); });
    if (inbox_.empty()) inbox_.resize(static_cast<std::size_t>(size_));
    inbox_[static_cast<std::size_t>(peer)].push_back(pr);
    return pr;
  }

  //! Completes pr: first the headers of the receives from the same peer posted before it
  //! (messages arrive in order, so each payload receive is posted with its message's own
  //! length, in message order), then pr's payload.
  void finish_recv(const std::shared_ptr<pending_recv>& pr, const char* what) {
    auto& q = inbox_[static_cast<std::size_t>(pr->peer)];
    while (!pr->header_done) {
      require<comm_error>(!q.empty(), "commpact::TorchComm::", what, ": internal error: lost receive.");
      auto front = q.front();
      wait_p2p(front->header_work, what);
      front->header_work.reset();
      front->got = front->header.data_ptr<std::int64_t>()[0];
      front->header_done = true;
      q.pop_front();
      if (front->got < 0 || front->got > (std::int64_t(1) << 40)) {
        const auto why = cat(what, ": rank ", rank_, " got a header of ", front->got, " bytes from rank ",
                             front->peer, "; the stream is corrupted");
        fail_and_tell(why);
        throw wire_error(cat("commpact::TorchComm::", why, "."));
      }
      if (front->got > 0) {
        front->payload = at::empty({front->got}, at::TensorOptions().dtype(at::kByte));
        std::vector<at::Tensor> t{front->payload};
        front->payload_work = start(what, [&] { return pg_->recv(t, front->peer, torch_payload_tag); });
      }
    }
    if (pr->expected >= 0 && pr->got != pr->expected) {
      const auto why = cat(what, ": rank ", rank_, " expected a ", pr->expected, "-byte message from rank ", pr->peer,
                           " and got ", pr->got, " bytes; ranks disagree on the message size");
      fail_and_tell(why);
      throw mismatch_error(cat("commpact::TorchComm::", why, ". Every rank must use the same options."));
    }
    if (pr->payload_work) {
      wait_p2p(pr->payload_work, what);
      pr->payload_work.reset();
    }
  }

  //! Keeps a send in flight: a reaper thread waits for it (in order) and frees it.
  void keep_send(c10::intrusive_ptr<c10d::Work> w) {
    std::lock_guard<std::mutex> g(m_);
    start_threads_locked();
    sends_.push_back(std::move(w));
    cv_.notify_all();
  }
  std::size_t pending_sends() const {
    std::lock_guard<std::mutex> g(m_);
    return sends_.size() + sending_;
  }
  //! Waits (within the deadline) until every send was received.
  void flush() {
    std::unique_lock<std::mutex> g(m_);
    const bool done = cv_.wait_for(g, opt_.timeout, [&] { return (sends_.empty() && sending_ == 0) || failed(); });
    g.unlock();
    enter("flush");
    if (!done) {
      const auto why = cat("rank ", rank_, " timed out after ", opt_.timeout.count(),
                           " ms in flush: a peer did not receive a message sent to it");
      fail_and_tell(why, true);
      throw timeout_error(cat("commpact::TorchComm::flush: ", why, torch_timeout_advice, "."));
    }
  }

  //! Delivers the sends still in flight first (the peer's last step waits for them: a
  //! state freed right after the last step, a script that ends), within the deadline; a
  //! failure (a peer's notice, a closed connection) ends the wait. Then aborts what is left.
  ~torch_state() {
    {
      std::unique_lock<std::mutex> g(m_);
      const auto end = std::chrono::steady_clock::now() + opt_.timeout;
      while (reaper_.joinable() && !(sends_.empty() && sending_ == 0) && !failed() &&
             std::chrono::steady_clock::now() < end)
        cv_.wait_for(g, opt_.poll);  // woken by each delivered send; a failure is seen within a poll
      stop_ = true;
      for (auto& w : watched_) abort_work(w);
      cv_.notify_all();
    }
    if (reaper_.joinable()) reaper_.join();
    if (watchdog_.joinable()) watchdog_.join();
  }

 private:
  void watch(const c10::intrusive_ptr<c10d::Work>& w) {
    std::lock_guard<std::mutex> g(m_);
    start_threads_locked();
    watched_.push_back(w);
    if (failed()) abort_work(w);
  }
  void unwatch(const c10::intrusive_ptr<c10d::Work>& w) {
    std::lock_guard<std::mutex> g(m_);
    for (auto it = watched_.begin(); it != watched_.end(); ++it)
      if (it->get() == w.get()) {
        watched_.erase(it);
        break;
      }
  }
  void start_threads_locked() {
    if (watchdog_.joinable()) return;
    watchdog_ = std::thread([this] { watchdog_loop(); });
    reaper_ = std::thread([this] { reaper_loop(); });
  }
  void watchdog_loop() {
    std::unique_lock<std::mutex> g(m_);
    while (!stop_) {
      cv_.wait_for(g, opt_.poll, [&] { return stop_; });
      if (stop_ || watched_.empty()) continue;
      if (!failed()) {
        g.unlock();
        try {
          check_notice("wait");
        } catch (...) {
        }
        g.lock();
      }
      if (failed())
        for (auto& w : watched_) abort_work(w);
    }
  }
  void reaper_loop() {
    std::unique_lock<std::mutex> g(m_);
    for (;;) {
      cv_.wait(g, [&] { return stop_ || !sends_.empty(); });
      if (stop_) return;
      auto w = std::move(sends_.front());
      sends_.erase(sends_.begin());
      ++sending_;
      watched_.push_back(w);
      if (failed()) abort_work(w);
      g.unlock();
      const auto t0 = std::chrono::steady_clock::now();
      bool ok = false;
      std::exception_ptr ex;
      try {
        ok = w->wait(opt_.timeout);
      } catch (...) {
        ex = std::current_exception();
      }
      const bool late = std::chrono::steady_clock::now() - t0 >= opt_.timeout;
      g.lock();
      const bool stopping = stop_;
      g.unlock();
      // The verdict before sending_ drops: a receive that saw the pair close waits for it
      // (wait_p2p). Gloo closes the pair when a wait times out, so a receive from the same
      // peer fails at once with "pair closure"; the cause is this deadline.
      if (!ok && !stopping && !failed()) {
        if (late)
          fail_and_tell(cat("rank ", rank_, " timed out after ", opt_.timeout.count(),
                            " ms: a message it sent was not received (the peer did not receive it)"),
                        true);
        else
          fail_and_tell(cat("rank ", rank_, ": the connection closed while a message it sent was in flight: ",
                            ex ? exception_text(ex) : std::string("the send was aborted")),
                        false, true);
      }
      g.lock();
      for (auto it = watched_.begin(); it != watched_.end(); ++it)
        if (it->get() == w.get()) {
          watched_.erase(it);
          break;
        }
      --sending_;
      cv_.notify_all();
    }
  }

  std::vector<c10::intrusive_ptr<c10d::Work>> sends_, watched_;
  std::vector<std::deque<std::shared_ptr<pending_recv>>> inbox_;
  std::size_t sending_ = 0;
  bool stop_ = false;
  std::condition_variable cv_;
  std::thread watchdog_, reaper_;
};

}  // namespace detail

}  // namespace commpact
