// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file serial_worker.hpp
//! serial_worker: one background thread that runs submitted tasks one at a time, in the
//! order they were submitted, and work_handle, the handle of one task (`wait()`,
//! `test()`). It is the progress engine behind ThreadComm's nonblocking collectives and
//! behind the overlap of gradient buckets with backward (train/overlap.hpp), the way
//! Horovod's background thread and PyTorch DDP's reducer run communication beside the
//! training thread.
//!
//! - Tasks run in submission order, so collectives submitted in the same order on every
//!   rank also run in that order on every rank.
//! - The thread starts at the first submit and stops when the worker is destroyed, after
//!   the tasks still queued have run.
//! - An exception a task throws is kept in its handle and raised by wait()/test(); it does
//!   not stop the worker.

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

namespace commpact::detail {

//! Completion of one task, shared by the worker and the task's handle.
struct work_state {
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;

  void complete(std::exception_ptr e) {
    {
      std::lock_guard lk(m);
      error = std::move(e);
      done = true;
    }
    cv.notify_all();
  }
};

//! The handle of one task: `wait()` blocks until it ran and raises what it raised;
//! `test()` returns whether it ran (raising what it raised when it did). Move-only; an
//! empty handle (default-made, or after completion was reported) is complete. Destroying
//! a handle whose task has not run yet waits for it (errors are dropped there), so the
//! buffers the task uses may be freed right after.
class work_handle {
 public:
  work_handle() = default;
  explicit work_handle(std::shared_ptr<work_state> s) : s_(std::move(s)) {}
  work_handle(work_handle&&) noexcept = default;
  work_handle& operator=(work_handle&& o) noexcept {
    if (this != &o) {
      finish_noexcept();
      s_ = std::move(o.s_);
    }
    return *this;
  }
  work_handle(const work_handle&) = delete;
  work_handle& operator=(const work_handle&) = delete;
  ~work_handle() { finish_noexcept(); }

  void wait() {
    if (!s_) return;
    auto s = std::move(s_);
    std::unique_lock lk(s->m);
    s->cv.wait(lk, [&] { return s->done; });
    if (s->error) std::rethrow_exception(s->error);
  }

  bool test() {
    if (!s_) return true;
    {
      std::lock_guard lk(s_->m);
      if (!s_->done) return false;
    }
    wait();
    return true;
  }

  //! True while the task has not been reported complete through wait() or test().
  bool pending() const { return s_ != nullptr; }

 private:
  void finish_noexcept() noexcept {
    if (!s_) return;
    try {
      wait();
    } catch (...) {
    }
  }
  std::shared_ptr<work_state> s_;
};

//! A FIFO of tasks run by one lazily started thread.
class serial_worker {
 public:
  serial_worker() = default;
  serial_worker(const serial_worker&) = delete;
  serial_worker& operator=(const serial_worker&) = delete;
  ~serial_worker() {
    {
      std::lock_guard lk(m_);
      stop_ = true;
    }
    cv_.notify_all();
    if (t_.joinable()) t_.join();
  }

  //! Queues fn; it runs after every task submitted before it.
  work_handle submit(std::function<void()> fn) {
    auto st = std::make_shared<work_state>();
    {
      std::lock_guard lk(m_);
      q_.emplace_back(std::move(fn), st);
      if (!t_.joinable()) t_ = std::thread([this] { loop(); });
    }
    cv_.notify_all();
    return work_handle(std::move(st));
  }

  //! Returns when every task submitted so far has run. A no-op on the worker's own
  //! thread (a task that calls back into its owner must not wait for itself).
  void drain() {
    std::unique_lock lk(m_);
    if (q_.empty() && !busy_) return;
    if (std::this_thread::get_id() == t_.get_id()) return;
    idle_cv_.wait(lk, [&] { return q_.empty() && !busy_; });
  }

 private:
  void loop() {
    std::unique_lock lk(m_);
    for (;;) {
      cv_.wait(lk, [&] { return stop_ || !q_.empty(); });
      if (q_.empty()) return;  // stop_ and nothing left
      auto [fn, st] = std::move(q_.front());
      q_.pop_front();
      busy_ = true;
      lk.unlock();
      std::exception_ptr err;
      try {
        fn();
      } catch (...) {
        err = std::current_exception();
      }
      fn = nullptr;  // release what the task captured before it is reported done
      st->complete(std::move(err));
      lk.lock();
      busy_ = false;
      if (q_.empty()) idle_cv_.notify_all();
    }
  }

  std::mutex m_;
  std::condition_variable cv_, idle_cv_;
  std::deque<std::pair<std::function<void()>, std::shared_ptr<work_state>>> q_;
  bool busy_ = false;
  bool stop_ = false;
  std::thread t_;
};

}  // namespace commpact::detail
