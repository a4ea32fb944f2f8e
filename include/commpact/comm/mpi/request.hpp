// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file mpi/request.hpp
//! mpi_request: the handle of one nonblocking MpiComm operation (iallreduce,
//! iallgather, ibroadcast, isend, irecv): an MPI request, or a ring allreduce or
//! large allgather that every wait of the communicator advances
//! (mpi/ring_allreduce.hpp). Part of MpiComm (include commpact/comm/mpi_comm.hpp).

#include <mpi.h>

#include <chrono>
#include <cstddef>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "state.hpp"

namespace commpact {

class MpiComm;

//! One nonblocking operation in flight. `test()` returns true once it completed (and
//! its result is in the caller's buffer); `wait()` blocks until then. Both raise like
//! the blocking form: peer_failure when another rank failed, timeout_error when the
//! operation is not done `mpi_options::timeout` after it started (test) or after
//! wait() was called (wait). Move-only; destroying a handle that is still in flight
//! waits for it (errors are swallowed there; the communicator is then failed). Keep
//! the buffers passed to the operation alive and untouched until it completed.
class mpi_request {
 public:
  mpi_request() = default;
  mpi_request(mpi_request&& o) noexcept { *this = std::move(o); }
  mpi_request& operator=(mpi_request&& o) noexcept {
    if (this != &o) {
      finish_noexcept();
      s_ = std::move(o.s_);
      req_ = std::exchange(o.req_, MPI_REQUEST_NULL);
      status_ = o.status_;
      what_ = o.what_;
      peer_ = o.peer_;
      collective_ = o.collective_;
      deadline_ = o.deadline_;
      stage_ = std::move(o.stage_);
      out_ = std::exchange(o.out_, nullptr);
      out_bytes_ = o.out_bytes_;
      expect_bytes_ = o.expect_bytes_;
      ring_ = std::move(o.ring_);
    }
    return *this;
  }
  mpi_request(const mpi_request&) = delete;
  mpi_request& operator=(const mpi_request&) = delete;
  ~mpi_request() { finish_noexcept(); }

  //! True when the operation completed (or the handle is empty).
  bool test() {
    if (!s_) return true;
    std::optional<detail::world_errors_return> guard;  // collectives report errors on MPI_COMM_WORLD
    if (collective_) guard.emplace();
    if (step()) return true;
    guarded([&] {
      s_->throw_if_told(what_);
      if (std::chrono::steady_clock::now() >= deadline_) timeout();
    });
    return false;
  }

  //! Blocks until the operation completed.
  void wait() {
    if (!s_) return;
    std::optional<detail::world_errors_return> guard;
    if (collective_) guard.emplace();
    guarded([&] { s_->poll(what_, [&] { return ring_ ? ring_->finished() : step_raw(); }, peer_); });  // poll advances rings
    complete();
  }

  //! True while the operation is in flight.
  bool pending() const { return s_ != nullptr; }

 private:
  friend class MpiComm;

  mpi_request(std::shared_ptr<detail::mpi_state> s, const char* what, bool collective)
      : s_(std::move(s)), what_(what), collective_(collective),
        deadline_(std::chrono::steady_clock::now() + s_->options().timeout) {}

  //! Call with the return code of the MPI call that started the operation: on an error
  //! the handle becomes empty (nothing was started) and the error is raised.
  void started(int rc, const char* call) {
    if (rc == MPI_SUCCESS) return;
    auto s = std::move(s_);
    s->check(rc, call, what_);
  }

  // One MPI_Test (a ring: one advance of every ring in flight); true when the request
  // completed (result not yet copied out).
  bool step_raw() {
    if (ring_) {
      s_->progress_rings();
      return ring_->finished();
    }
    int flag = 0;
    s_->check(MPI_Test(&req_, &flag, &status_), "MPI_Test", what_);
    return flag != 0;
  }
  bool step() {
    bool done = false;
    guarded([&] { done = step_raw(); });
    if (done) complete();
    return done;
  }

  void complete() {
    auto s = std::move(s_);
    if (ring_) {
      s->finish_ring(ring_);  // raises the ring's error, if a wait elsewhere met one
      return;
    }
    if (expect_bytes_ >= 0) {  // a receive of a known size: the message must have exactly that size
      int count = 0;
      MPI_Get_count(&status_, MPI_BYTE, &count);
      if (count != expect_bytes_) {
        const auto msg = detail::cat("commpact::MpiComm::irecv: rank ", s->rank(), " expected ", expect_bytes_,
                                     " bytes from rank ", status_.MPI_SOURCE, " and received ", count,
                                     "; sender and receiver must agree on every message's size.");
        s->fail_and_tell(msg);
        throw mismatch_error(msg);
      }
    }
    if (out_ != nullptr && out_bytes_ > 0) std::memcpy(out_, stage_.data(), out_bytes_);
    if (!stage_.empty() || stage_.capacity() > 0) s->recycle(std::move(stage_));
  }

  template <class F>
  void guarded(F&& f) {
    try {
      f();
    } catch (...) {
      s_->abandon(req_);
      s_->drop_ring(ring_);
      if (!stage_.empty()) new std::vector<std::byte>(std::move(stage_));  // MPI may still write there
      s_.reset();
      throw;
    }
  }

  [[noreturn]] void timeout() {
    const auto ms = s_->options().timeout.count();
    // A point-to-point wait names its peer (isend to, irecv from), as ThreadComm does.
    const std::string where = detail::mpi_state::waiting_in(what_, peer_);
    s_->fail_and_tell(detail::cat("rank ", s_->rank(), " waited more than ", ms, " ms in ", where));
    throw timeout_error(detail::cat("commpact::MpiComm: rank ", s_->rank(), " waited more than ", ms, " ms in ",
                                    where, peer_ < 0 ? "; another rank is missing" : "; that rank is missing",
                                    ", stuck or much slower. Raise mpi_options::timeout if the work is legitimately "
                                    "slow."));
  }

  void finish_noexcept() noexcept {
    if (!s_) return;
    try {
      wait();
    } catch (...) {
    }
  }

  std::shared_ptr<detail::mpi_state> s_;
  MPI_Request req_ = MPI_REQUEST_NULL;
  MPI_Status status_{};
  const char* what_ = "";
  int peer_ = -1;  // isend / irecv: the other rank
  bool collective_ = true;
  std::chrono::steady_clock::time_point deadline_{};
  std::vector<std::byte> stage_;  // pooled staging (isolate_buffers), copied to out_ on completion
  void* out_ = nullptr;
  std::size_t out_bytes_ = 0;
  long long expect_bytes_ = -1;  // >= 0: a receive of exactly this many bytes
  std::unique_ptr<detail::mpi_ring_op> ring_;  // a ring or large allgather (then req_ is unused)
};

}  // namespace commpact
