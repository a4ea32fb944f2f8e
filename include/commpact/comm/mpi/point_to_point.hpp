// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file mpi/point_to_point.hpp
//! MpiComm's point to point: the pool of send buffers (send() copies the message and
//! returns without waiting for the receiver; completed sends are reclaimed lazily, so
//! the steady state allocates nothing), the receives and sendrecv. Part of MpiComm
//! (include commpact/comm/mpi_comm.hpp).

#include <mpi.h>

#include <cstddef>
#include <cstring>
#include <span>
#include <utility>
#include <vector>

namespace commpact::detail {

//! Sends in flight, each with the pooled buffer it reads from.
class mpi_send_queue {
 public:
  static constexpr int tag = 17;

  mpi_send_queue() {
    reqs_.reserve(16);
    bufs_.reserve(16);
    spare_.reserve(16);
  }

  //! A buffer holding a copy of msg: the best-fitting spare, so steady state never allocates.
  std::vector<std::byte> copy_of(std::span<const std::byte> msg) {
    std::vector<std::byte> buf;
    if (!spare_.empty()) {
      std::size_t pick = spare_.size() - 1;
      bool fits = false;
      for (std::size_t i = 0; i < spare_.size(); ++i) {
        const auto c = spare_[i].capacity();
        if (c >= msg.size() && (!fits || c < spare_[pick].capacity())) {
          pick = i;
          fits = true;
        }
      }
      buf = std::move(spare_[pick]);
      spare_[pick] = std::move(spare_.back());
      spare_.pop_back();
    }
    buf.assign(msg.begin(), msg.end());
    return buf;
  }

  void push(MPI_Request req, std::vector<std::byte>&& buf) {
    reqs_.push_back(req);
    bufs_.push_back(std::move(buf));
  }

  std::size_t size() const { return reqs_.size(); }
  bool empty() const { return reqs_.empty(); }

  //! Tests every send; completed buffers return to the pool. `check(rc, call)` handles an
  //! MPI error (it throws); returns how many completed.
  template <class Check>
  std::size_t reap(Check&& check) {
    return reap_while([&](int rc) {
      check(rc, "MPI_Test");
      return true;
    });
  }

  std::size_t reap_noexcept() noexcept {
    return reap_while([](int rc) noexcept { return rc == MPI_SUCCESS; });
  }

  //! Gives up on the sends in flight: frees the requests (when MPI is still alive) and
  //! leaks their buffers, which MPI may still read.
  void abandon(bool mpi_alive) noexcept {
    if (mpi_alive)
      for (auto& r : reqs_) MPI_Request_free(&r);
    reqs_.clear();
    new std::vector<std::vector<std::byte>>(std::move(bufs_));  // intentionally never freed
  }

 private:
  //! Tests every send while ok(rc) holds for MPI_Test's return code; completed buffers
  //! return to the pool. Returns how many completed.
  template <class Ok>
  std::size_t reap_while(Ok&& ok) {
    std::size_t done = 0;
    for (std::size_t i = 0; i < reqs_.size();) {
      int flag = 0;
      if (!ok(MPI_Test(&reqs_[i], &flag, MPI_STATUS_IGNORE))) return done;
      if (flag) {
        retire(i);
        ++done;
      } else {
        ++i;
      }
    }
    return done;
  }
  void retire(std::size_t i) {
    auto buf = std::move(bufs_[i]);
    reqs_[i] = reqs_.back();
    bufs_[i] = std::move(bufs_.back());
    reqs_.pop_back();
    bufs_.pop_back();
    buf.clear();
    if (spare_.size() < 64) spare_.push_back(std::move(buf));
  }

  std::vector<MPI_Request> reqs_;
  std::vector<std::vector<std::byte>> bufs_;
  std::vector<std::vector<std::byte>> spare_;
};

//! Receives the next message from `peer` into `out`, resized to its length: polls
//! MPI_Improbe under the state's deadline, then MPI_Imrecv. When the state isolates
//! buffers, the message lands in a pooled buffer that is swapped into `out` on success
//! (no copy; `out`'s old storage returns to the pool) and leaked if the wait is given
//! up, so an abandoned receive never writes into memory the caller still owns.
template <class State>
void mpi_recv_any(State& s, int peer, std::vector<std::byte>& out, const char* what = "recv") {
  MPI_Message msg = MPI_MESSAGE_NULL;
  MPI_Status st;
  s.poll(
      what,
      [&] {
        int flag = 0;
        s.check(MPI_Improbe(peer, mpi_send_queue::tag, s.native(), &flag, &msg, &st), "MPI_Improbe", what);
        return flag != 0;
      },
      peer);
  int count = 0;
  s.check(MPI_Get_count(&st, MPI_BYTE, &count), "MPI_Get_count", what);
  if (s.options().isolate_buffers && count > 0) {
    auto in = s.take_buffer(static_cast<std::size_t>(count));
    try {
      MPI_Request req = MPI_REQUEST_NULL;
      s.check(MPI_Imrecv(in.data(), count, MPI_BYTE, &msg, &req), "MPI_Imrecv", what);
      s.wait(req, what);
    } catch (...) {
      new std::vector<std::byte>(std::move(in));  // intentionally never freed: MPI may still write there
      throw;
    }
    std::swap(out, in);
    if (in.capacity() > 0) s.recycle(std::move(in));
  } else {
    out.resize(static_cast<std::size_t>(count));
    MPI_Request req = MPI_REQUEST_NULL;
    s.check(MPI_Imrecv(out.data(), count, MPI_BYTE, &msg, &req), "MPI_Imrecv", what);
    s.wait(req, what);
  }
}

//! Sends `msg` to `peer` in place and receives peer's next message into `out` (as
//! mpi_recv_any); returns once both completed, like MPI_Sendrecv.
template <class State>
void mpi_sendrecv(State& s, int peer, std::span<const std::byte> msg, std::vector<std::byte>& out) {
  MPI_Request sq = MPI_REQUEST_NULL;
  s.check(MPI_Isend(msg.data(), static_cast<int>(msg.size()), MPI_BYTE, peer, mpi_send_queue::tag, s.native(), &sq),
          "MPI_Isend", "sendrecv");
  try {
    mpi_recv_any(s, peer, out, "sendrecv");
  } catch (...) {
    s.abandon(sq);  // it only reads msg; kept, never freed, like every request given up on
    throw;
  }
  s.wait(sq, "sendrecv");
}

}  // namespace commpact::detail
