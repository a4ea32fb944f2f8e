// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file mpi/failure.hpp
//! The failure-notice channel of MpiComm: a duplicate communicator that carries only
//! "this group failed, because ..." messages. Each rank keeps one receive from any
//! source pre-posted on it; waits test that receive now and then, so a notice ends a
//! wait within microseconds while a healthy operation costs no message at all (a
//! notice is sent only when a rank fails). Part of MpiComm (include
//! commpact/comm/mpi_comm.hpp).

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "datatype.hpp"

namespace commpact::detail {

class mpi_failure_channel {
 public:
  static constexpr int tag = 23;
  static constexpr std::size_t capacity = 1024;  //!< longest reason carried

  //! Takes ownership of `comm` (a duplicate with MPI_ERRORS_RETURN) and posts the receive.
  //! `nonce` is agreed by all ranks of this instance: a notice left in flight for an
  //! earlier communicator whose context id was reused carries another nonce and is dropped.
  void open(MPI_Comm comm, int rank, int size, std::uint64_t nonce) {
    comm_ = comm;
    rank_ = rank;
    size_ = size;
    nonce_ = nonce;
    buf_.resize(capacity + sizeof(nonce_));
    post();
  }

  MPI_Comm comm() const { return comm_; }

  //! Tests the pre-posted receive. Returns true and sets `reason` when a notice for this
  //! instance arrived (or the test itself failed); false otherwise.
  bool poll(std::string& reason) {
    if (recv_ == MPI_REQUEST_NULL) return false;
    int flag = 0;
    MPI_Status st;
    const int rc = MPI_Test(&recv_, &flag, &st);
    if (rc != MPI_SUCCESS) {
      recv_ = MPI_REQUEST_NULL;
      reason = cat("rank ", rank_, ": MPI_Test on the failure-notice receive failed: ", mpi_error_text(rc));
      return true;
    }
    if (!flag) return false;
    int count = 0;
    MPI_Get_count(&st, MPI_BYTE, &count);
    std::uint64_t nonce = 0;
    if (count >= static_cast<int>(sizeof(nonce))) std::memcpy(&nonce, buf_.data(), sizeof(nonce));
    if (count < static_cast<int>(sizeof(nonce)) || nonce != nonce_) {
      post();  // a stale notice for an earlier communicator: drop it
      return false;
    }
    reason.assign(reinterpret_cast<const char*>(buf_.data()) + sizeof(nonce),
                  static_cast<std::size_t>(count) - sizeof(nonce));
    if (reason.empty()) reason = cat("rank ", st.MPI_SOURCE, " failed");
    return true;  // the receive is not re-posted: the group has failed for good
  }

  //! Sends `reason` to every other rank (nonblocking, once). Never throws.
  void tell(const std::string& reason) noexcept {
    if (comm_ == MPI_COMM_NULL || !sends_.empty()) return;
    try {
      payload_.assign(reinterpret_cast<const char*>(&nonce_), sizeof(nonce_));
      payload_ += reason.substr(0, capacity);
      sends_.assign(static_cast<std::size_t>(size_), MPI_REQUEST_NULL);
    } catch (...) {
      return;
    }
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      if (MPI_Isend(payload_.data(), static_cast<int>(payload_.size()), MPI_BYTE, r, tag, comm_, &sends_[r]) !=
          MPI_SUCCESS)
        sends_[r] = MPI_REQUEST_NULL;
    }
  }

  //! Lets sent notices leave (small, eager messages: up to `patience`), cancels the
  //! receive, and frees the communicator unless `keep` (a failed group keeps its
  //! context ids so that stale traffic never matches a later communicator). With MPI
  //! finalized, nothing may be called: the buffers are leaked instead.
  void close(std::chrono::milliseconds patience, bool keep) noexcept {
    if (mpi_finalized()) {
      if (!sends_.empty()) new std::string(std::move(payload_));  // intentionally never freed
      if (recv_ != MPI_REQUEST_NULL) new std::vector<std::byte>(std::move(buf_));
      return;
    }
    const auto deadline = std::chrono::steady_clock::now() + patience;
    bool pending = true;
    while (pending && std::chrono::steady_clock::now() < deadline) {
      pending = false;
      for (auto& r : sends_) {
        int f = 1;
        if (r != MPI_REQUEST_NULL && MPI_Test(&r, &f, MPI_STATUS_IGNORE) != MPI_SUCCESS) r = MPI_REQUEST_NULL;
        pending = pending || r != MPI_REQUEST_NULL;
      }
      if (pending) std::this_thread::yield();
    }
    if (pending) {
      for (auto& r : sends_)
        if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
      new std::string(std::move(payload_));  // intentionally never freed: MPI may still read it
    }
    if (recv_ != MPI_REQUEST_NULL) {
      MPI_Cancel(&recv_);
      MPI_Wait(&recv_, MPI_STATUS_IGNORE);  // a cancelled receive completes at once
    }
    if (!keep && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }

 private:
  void post() {
    if (MPI_Irecv(buf_.data(), static_cast<int>(buf_.size()), MPI_BYTE, MPI_ANY_SOURCE, tag, comm_, &recv_) !=
        MPI_SUCCESS)
      recv_ = MPI_REQUEST_NULL;  // without the receive, failures still end waits at the deadline
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::uint64_t nonce_ = 0;
  MPI_Request recv_ = MPI_REQUEST_NULL;
  std::vector<std::byte> buf_;
  std::string payload_;
  std::vector<MPI_Request> sends_;
};

}  // namespace commpact::detail
