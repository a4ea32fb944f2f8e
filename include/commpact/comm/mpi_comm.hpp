#pragma once
//! \file mpi_comm.hpp
//! MpiComm: a commpact::PointToPoint communicator over an MPI communicator (OpenMPI),
//! with the operations and semantics of ThreadComm.
//!
//! \code
//! MPI_Init(&argc, &argv);
//! {
//!   commpact::MpiComm world{MPI_COMM_WORLD};
//!   std::vector<float> g(100, float(world.rank()));
//!   commpact::mpi_guard(world, [&] {           // an exception here reaches every rank
//!     world.allreduce(std::span(g), commpact::reduce_op::sum);
//!   });
//! }                                            // the last copy frees its communicators
//! MPI_Finalize();
//! \endcode
//!
//! - Isolation: the constructor duplicates the communicator twice (MPI_Comm_idup): one
//!   duplicate carries commpact's traffic, the other only failure notices ("poison").
//!   Both use MPI_ERRORS_RETURN; every MPI return code other than MPI_SUCCESS becomes a
//!   commpact::comm_error that names the call and MPI_Error_string. Nothing aborts:
//!   OpenMPI reports errors of nonblocking collectives on MPI_COMM_WORLD, so while a
//!   wait polls, MPI_COMM_WORLD returns errors too (the user's handler is restored).
//! - Never hang: every wait is a nonblocking MPI operation polled with MPI_Test until
//!   `mpi_options::timeout`. A wait that passes it raises commpact::timeout_error, marks
//!   the communicator failed and tells the other ranks. Every wait also tests a receive
//!   pre-posted on the poison communicator: when another rank failed, aborted or timed
//!   out, the wait raises commpact::peer_failure carrying that rank's reason. After a
//!   failure every further operation raises at once.
//! - Agreement: with `mpi_options::verify_collectives` (the default) every collective
//!   starts with one small allreduce of its signature (operation, element type, size,
//!   op or root, and whether any rank passed an invalid argument). Ranks that disagree
//!   all raise commpact::mismatch_error (or commpact::invalid_argument) before any data
//!   moves, and the communicator stays usable. barrier() is that signature allreduce.
//! - Identical results: allreduce uses MPI_Iallreduce. OpenMPI's nonblocking
//!   allreduce algorithms (libnbc: binomial reduce + broadcast, ring, reduce-scatter +
//!   allgather) compute each element's final value on one rank and copy it to the
//!   others, so every rank gets the same bits; the tests check this. The summation
//!   order is the implementation's, not rank order (ThreadComm's).
//! - Memory safety after a failure: with `mpi_options::isolate_buffers` (the default)
//!   collectives and receives write into an internal staging buffer that is copied out
//!   on success, so an operation abandoned after a failure (MPI cannot cancel
//!   collectives) can never write into user memory later. (It may still read the
//!   caller's input until the process ends; MPI only reads that.)
//! - Point to point: send() copies the message into a pooled buffer and MPI_Isends it;
//!   it does not wait for the receiver. Completed sends are reclaimed lazily; flush()
//!   waits for all of them, as does the destruction of the last copy. recv() polls
//!   MPI_Improbe and receives with MPI_Imrecv into a buffer resized to the message.
//! - Handles are cheap to copy (shared state); the last copy frees the duplicates,
//!   unless MPI is already finalized or the group failed (then abandoned operations may
//!   still use them, and their context ids must not be reused). Use one handle per
//!   thread; MpiComm needs no more than MPI_THREAD_FUNNELED.

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "../concepts.hpp"
#include "../config.hpp"
#include "../error.hpp"

namespace commpact {

struct mpi_options {
  //! Longest time one rank waits for the others in any operation.
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
  //! Start every collective with a small allreduce of its signature, so that ranks that
  //! disagree (sizes, operation, type, root) all raise mismatch_error instead of
  //! corrupting data or waiting for the deadline. Costs one small-message latency per
  //! collective; turn off only when every call site is known to agree.
  bool verify_collectives = true;
  //! Collectives and receives write into an internal staging buffer (reused; one copy
  //! out on success), so that an operation abandoned after a failure never writes into
  //! user memory later. Turn off to save that copy and memory when the process ends
  //! after any communication failure anyway; allreduce then runs in place, for which
  //! OpenMPI always uses a binomial reduce + broadcast (slower for large messages).
  bool isolate_buffers = true;
};

namespace detail {

//! The MPI datatype for an element type allreduce supports (float, double, and 32- or
//! 64-bit integers, signed or not); MPI_DATATYPE_NULL otherwise.
template <class T>
MPI_Datatype mpi_reduce_type() {
  if constexpr (std::is_same_v<T, float>) return MPI_FLOAT;
  else if constexpr (std::is_same_v<T, double>) return MPI_DOUBLE;
  else if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool> && sizeof(T) == 4)
    return std::is_signed_v<T> ? MPI_INT32_T : MPI_UINT32_T;
  else if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool> && sizeof(T) == 8)
    return std::is_signed_v<T> ? MPI_INT64_T : MPI_UINT64_T;
  else return MPI_DATATYPE_NULL;
}

template <class T>
inline constexpr bool mpi_reducible =
    std::is_same_v<T, float> || std::is_same_v<T, double> ||
    (std::is_integral_v<T> && !std::is_same_v<T, bool> && (sizeof(T) == 4 || sizeof(T) == 8));

template <class T>
constexpr int mpi_type_code() {
  if constexpr (std::is_same_v<T, float>) return 1;
  else if constexpr (std::is_same_v<T, double>) return 2;
  else if constexpr (std::is_integral_v<T> && sizeof(T) == 4) return std::is_signed_v<T> ? 3 : 5;
  else if constexpr (std::is_integral_v<T> && sizeof(T) == 8) return std::is_signed_v<T> ? 4 : 6;
  else return 0;  // allgather / broadcast move bytes; the size check covers them
}

inline const char* mpi_type_name(int code) {
  switch (code) {
    case 1: return "float";
    case 2: return "double";
    case 3: return "int32";
    case 4: return "int64";
    case 5: return "uint32";
    case 6: return "uint64";
    default: return "bytes";
  }
}

enum class mpi_coll : int { barrier = 1, allreduce = 2, allgather = 3, broadcast = 4 };

inline const char* mpi_coll_name(int k) {
  switch (k) {
    case 1: return "barrier";
    case 2: return "allreduce";
    case 3: return "allgather";
    case 4: return "broadcast";
    default: return "an unknown operation";
  }
}

inline std::string mpi_error_text(int rc) {
  char s[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(rc, s, &len) != MPI_SUCCESS) return detail::cat("MPI error code ", rc);
  return std::string(s, static_cast<std::size_t>(len));
}

inline bool mpi_finalized() {
  int f = 0;
  MPI_Finalized(&f);
  return f != 0;
}

//! Makes MPI_COMM_WORLD return error codes for the lifetime of the object, then
//! restores whatever handler it had.
class world_errors_return {
 public:
  world_errors_return() noexcept {
    swapped_ = MPI_Comm_get_errhandler(MPI_COMM_WORLD, &old_) == MPI_SUCCESS;
    if (swapped_ && MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN) != MPI_SUCCESS) {
      MPI_Errhandler_free(&old_);
      swapped_ = false;
    }
  }
  ~world_errors_return() {
    if (!swapped_) return;
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, old_);
    MPI_Errhandler_free(&old_);
  }
  world_errors_return(const world_errors_return&) = delete;
  world_errors_return& operator=(const world_errors_return&) = delete;

 private:
  MPI_Errhandler old_ = MPI_ERRHANDLER_NULL;
  bool swapped_ = false;
};

//! Shared state of all copies of one MpiComm handle.
class mpi_state {
 public:
  static constexpr int p2p_tag = 17;
  static constexpr int poison_tag = 23;
  static constexpr std::size_t poison_capacity = 1024;

  mpi_state(MPI_Comm parent, mpi_options opt) : opt_(opt) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized || mpi_finalized())
      throw comm_error(
          "commpact::MpiComm: MPI is not initialized (or already finalized); call MPI_Init before constructing "
          "an MpiComm and destroy every MpiComm before MPI_Finalize.");
    require(parent != MPI_COMM_NULL,
            "commpact::MpiComm: the communicator is MPI_COMM_NULL; pass a valid communicator such as MPI_COMM_WORLD.");
    require(opt_.timeout.count() > 0, "commpact::MpiComm: mpi_options::timeout is ", opt_.timeout.count(),
            " ms; it must be positive.");
    // Errors of the duplication itself must not abort either: switch the parent to
    // MPI_ERRORS_RETURN for the duration and restore the user's handler afterwards.
    MPI_Errhandler old = MPI_ERRHANDLER_NULL;
    const bool swapped = MPI_Comm_get_errhandler(parent, &old) == MPI_SUCCESS &&
                         MPI_Comm_set_errhandler(parent, MPI_ERRORS_RETURN) == MPI_SUCCESS;
    auto restore = [&] {
      if (swapped) {
        MPI_Comm_set_errhandler(parent, old);
        MPI_Errhandler_free(&old);
      }
    };
    try {
      comm_ = dup(parent, "data");
      poison_comm_ = dup(parent, "failure-notice");
    } catch (...) {
      restore();
      if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
      throw;
    }
    restore();
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    // A context id freed by an earlier MpiComm may be reused by this one, and a failure
    // notice sent on the old one may still be in flight: notices carry a nonce that all
    // ranks of this instance agree on, and notices with another nonce are dropped.
    {
      std::uint64_t x = static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
                        (reinterpret_cast<std::uintptr_t>(this) << 16) ^ (static_cast<std::uint64_t>(rank_) << 48);
      x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;  // splitmix64 finaliser
      x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
      auto* cell = reinterpret_cast<std::uint64_t*>(sig_.get());  // heap: kept if the wait is abandoned
      *cell = x ^ (x >> 31);
      MPI_Request req = MPI_REQUEST_NULL;
      try {
        check(MPI_Iallreduce(MPI_IN_PLACE, cell, 1, MPI_UINT64_T, MPI_MAX, comm_, &req), "MPI_Iallreduce",
              "the constructor");
        wait(req, "the constructor");
      } catch (...) {
        (void)sig_.release();  // MPI may still write there; the duplicates stay alive too
        throw;
      }
      nonce_ = *cell;
    }
    poison_buf_.resize(poison_capacity + sizeof(nonce_));
    post_poison_recv();
    pending_reqs_.reserve(16);
    pending_bufs_.reserve(16);
    spare_bufs_.reserve(16);
  }

  mpi_state(const mpi_state&) = delete;
  mpi_state& operator=(const mpi_state&) = delete;

  ~mpi_state() {
    if (mpi_finalized()) {
      // MPI is gone: nothing may be called. Buffers that MPI might still reference are
      // leaked on purpose rather than freed under a live request.
      if (!pending_bufs_.empty()) leak(std::move(pending_bufs_));
      if (!abandoned_.empty()) leak_staging();
      if (!poison_sends_.empty()) new std::string(std::move(poison_payload_));
      if (poison_recv_ != MPI_REQUEST_NULL) new std::vector<std::byte>(std::move(poison_buf_));
      return;
    }
    // Deliver what send() queued (unless the group failed: then peers are not receiving).
    if (!failed_) {
      const auto deadline = std::chrono::steady_clock::now() + opt_.timeout;
      while (!pending_reqs_.empty() && std::chrono::steady_clock::now() < deadline) {
        if (reap_sends_noexcept() == 0) backoff(1000);
      }
    }
    if (!pending_reqs_.empty()) {
      std::fprintf(stderr,
                   "commpact::MpiComm: rank %d destroyed with %zu undelivered send(s) (no matching recv within the "
                   "deadline or the group failed); their buffers are leaked so MPI never reads freed memory.\n",
                   rank_, pending_reqs_.size());
      for (auto& r : pending_reqs_) MPI_Request_free(&r);
      leak(std::move(pending_bufs_));
    }
    // Failure notices are small (eager) messages: give them a moment to leave.
    {
      const auto deadline = std::chrono::steady_clock::now() + std::min<std::chrono::milliseconds>(
                                                                    opt_.timeout, std::chrono::milliseconds(1000));
      bool pending = true;
      while (pending && std::chrono::steady_clock::now() < deadline) {
        pending = false;
        for (auto& r : poison_sends_) {
          int f = 1;
          if (r != MPI_REQUEST_NULL && MPI_Test(&r, &f, MPI_STATUS_IGNORE) != MPI_SUCCESS) r = MPI_REQUEST_NULL;
          pending = pending || r != MPI_REQUEST_NULL;
        }
        if (pending) backoff(1000);
      }
      if (pending) {
        for (auto& r : poison_sends_)
          if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
        new std::string(std::move(poison_payload_));
      }
    }
    if (poison_recv_ != MPI_REQUEST_NULL) {
      MPI_Cancel(&poison_recv_);
      MPI_Wait(&poison_recv_, MPI_STATUS_IGNORE);  // a cancelled receive completes at once
    }
    if (!abandoned_.empty()) {
      // MPI cannot cancel collectives, and OpenMPI rejects MPI_Request_free on them
      // (reported on MPI_COMM_WORLD, i.e. fatal by default). Drop the handles; the
      // operation may still run inside MPI, so its memory must outlive us.
      leak_staging();
    }
    if (failed_) {
      // Keep a failed group's duplicates: abandoned operations and notices may still
      // be in flight on them, and a freed context id would be reused by the next
      // communicator, where that stale traffic could match. (OpenMPI allocates one
      // context id for all ranks, so keeping it on any rank keeps it from everyone.)
      return;
    }
    MPI_Comm_free(&poison_comm_);
    MPI_Comm_free(&comm_);
  }

  int rank() const { return rank_; }
  int size() const { return size_; }
  const mpi_options& options() const { return opt_; }
  MPI_Comm native() const { return comm_; }
  bool failed() const { return failed_; }
  const std::string& failure() const { return failure_; }

  //! Throws when MPI returned an error: marks the group failed and tells the others.
  void check(int rc, const char* call, std::string_view what) {
    if (rc == MPI_SUCCESS) return;
    int cls = rc;
    MPI_Error_class(rc, &cls);
    const auto msg = detail::cat("commpact::MpiComm: rank ", rank_, ": ", call, " in ", what, " failed: ",
                                 mpi_error_text(rc), " (MPI error class ", cls,
                                 "). The communicator is now failed on every rank; check that all ranks call the "
                                 "same operations with the same sizes, then restart the run.");
    fail_and_tell(msg);
    throw comm_error(msg);
  }

  //! Raises at once if this group has failed (here or, as far as we know yet, elsewhere).
  void enter(const char* what) {
    if (mpi_finalized())
      throw comm_error(detail::cat("commpact::MpiComm: rank ", rank_, " called ", what,
                                   " after MPI_Finalize; finish all communication (and destroy every MpiComm) "
                                   "before finalizing MPI."));
    if (!failed_) poll_poison(what);
    if (failed_)
      throw peer_failure(detail::cat("commpact::MpiComm: rank ", rank_, " refused ", what,
                                     " because the communicator failed earlier: ", failure_,
                                     ". Create a new MpiComm only after every rank has recovered, or end the run."));
    if (!pending_reqs_.empty()) reap_sends(what);
  }

  //! Marks the group failed (first reason wins) and sends the reason to every other rank.
  void fail_and_tell(std::string reason) noexcept {
    if (failed_) return;
    failed_ = true;
    failure_ = std::move(reason);
    if (mpi_finalized()) return;  // nobody left to tell
    try {
      poison_payload_.assign(reinterpret_cast<const char*>(&nonce_), sizeof(nonce_));
      poison_payload_ += failure_.substr(0, poison_capacity);
      poison_sends_.assign(static_cast<std::size_t>(size_), MPI_REQUEST_NULL);
    } catch (...) {
      return;
    }
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      if (MPI_Isend(poison_payload_.data(), static_cast<int>(poison_payload_.size()), MPI_BYTE, r, poison_tag,
                    poison_comm_, &poison_sends_[r]) != MPI_SUCCESS)
        poison_sends_[r] = MPI_REQUEST_NULL;
    }
  }

  //! Polls `req` until it completes, another rank fails, or the deadline passes.
  void wait(MPI_Request& req, const char* what, MPI_Status* status = MPI_STATUS_IGNORE) {
    // OpenMPI (4.1, libnbc) reports an error of a nonblocking collective's MPI_Test on
    // MPI_COMM_WORLD, whose handler is fatal by default, not on the request's
    // communicator. No user code runs while we poll, so switch MPI_COMM_WORLD to
    // MPI_ERRORS_RETURN for the wait and restore the user's handler afterwards.
    world_errors_return guard;
    try {
      poll(what, [&] {
        int flag = 0;
        check(MPI_Test(&req, &flag, status), "MPI_Test", what);
        return flag != 0;
      });
    } catch (...) {
      if (req != MPI_REQUEST_NULL) abandoned_.push_back(req);
      req = MPI_REQUEST_NULL;
      throw;
    }
  }

  //! Polls `done()` (which calls MPI) under the deadline and the poison receive.
  template <class Done>
  void poll(const char* what, Done&& done) {
    const auto start = std::chrono::steady_clock::now();
    const auto deadline = start + opt_.timeout;
    for (unsigned spin = 0;; ++spin) {
      if (done()) return;
      poll_poison(what);
      if (failed_)
        throw peer_failure(detail::cat("commpact::MpiComm: rank ", rank_, " abandoned ", what, " because ", failure_,
                                       ". Every rank's operations on this communicator now fail; end the run or "
                                       "restart from a checkpoint."));
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) {
        const auto ms = opt_.timeout.count();
        fail_and_tell(detail::cat("rank ", rank_, " waited more than ", ms, " ms in ", what));
        throw timeout_error(detail::cat("commpact::MpiComm: rank ", rank_, " waited more than ", ms, " ms in ", what,
                                        "; another rank is missing, stuck or much slower. Raise "
                                        "mpi_options::timeout if the work is legitimately slow."));
      }
      if (spin >= 64) backoff(std::chrono::duration_cast<std::chrono::microseconds>(now - start).count());
    }
  }

  // ---- collectives -------------------------------------------------------------
  //! Agrees on the collective's signature; throws the same error class on every rank
  //! when they disagree or one passed an invalid argument. Also serves as barrier.
  void verify(mpi_coll kind, int type_code, std::int64_t bytes, std::int64_t extra, const std::string& local_error) {
    const std::int64_t code = static_cast<std::int64_t>(kind) * 256 + type_code;
    sig_[0] = bytes;
    sig_[1] = -bytes;
    sig_[2] = code;
    sig_[3] = -code;
    sig_[4] = extra;
    sig_[5] = -extra;
    sig_[6] = local_error.empty() ? -1 : rank_;
    const char* what = mpi_coll_name(static_cast<int>(kind));
    MPI_Request req = MPI_REQUEST_NULL;
    check(MPI_Iallreduce(MPI_IN_PLACE, sig_.get(), 7, MPI_INT64_T, MPI_MAX, comm_, &req), "MPI_Iallreduce", what);
    wait(req, what);
    if (sig_[6] >= 0) {
      if (!local_error.empty()) throw invalid_argument(local_error);
      throw invalid_argument(detail::cat("commpact::MpiComm::", what, ": rank ", sig_[6],
                                         " passed an invalid argument (its error says which); no rank moved data, "
                                         "and the communicator stays usable."));
    }
    if (sig_[2] != -sig_[3]) {
      const auto hi = sig_[2], lo = -sig_[3];
      throw mismatch_error(detail::cat(
          "commpact::MpiComm: ranks disagree on the collective: rank ", rank_, " called ", what, "<",
          mpi_type_name(static_cast<int>(code % 256)), ">, while the calls range over ",
          mpi_coll_name(static_cast<int>(lo / 256)), "<", mpi_type_name(static_cast<int>(lo % 256)), "> .. ",
          mpi_coll_name(static_cast<int>(hi / 256)), "<", mpi_type_name(static_cast<int>(hi % 256)),
          ">; every rank must call the same collectives, with the same element type, in the same order."));
    }
    if (sig_[0] != -sig_[1])
      throw mismatch_error(detail::cat("commpact::MpiComm::", what, ": ranks disagree on the size: rank ", rank_,
                                       " passed ", bytes, " bytes, the ranks' sizes range over [", -sig_[1], ", ",
                                       sig_[0], "] bytes; every rank must pass the same number of elements."));
    if (sig_[4] != -sig_[5])
      throw mismatch_error(detail::cat("commpact::MpiComm::", what, ": ranks disagree on the ",
                                       kind == mpi_coll::broadcast ? "root" : "reduce_op", ": rank ", rank_,
                                       " passed ", extra, ", the values range over [", -sig_[5], ", ", sig_[4],
                                       "]; every rank must pass the same one."));
  }

  //! A staging buffer of at least n bytes (reused; grows only).
  std::byte* staging(std::size_t n) {
    if (staging_.size() < n) staging_.resize(n);
    return staging_.data();
  }

  // ---- point to point ----------------------------------------------------------
  void send(int peer, std::span<const std::byte> msg) {
    std::vector<std::byte> buf;
    if (!spare_bufs_.empty()) {
      // Best fit among the spares, so steady state never allocates.
      std::size_t pick = spare_bufs_.size() - 1;
      bool fits = false;
      for (std::size_t i = 0; i < spare_bufs_.size(); ++i) {
        const auto c = spare_bufs_[i].capacity();
        if (c >= msg.size() && (!fits || c < spare_bufs_[pick].capacity())) {
          pick = i;
          fits = true;
        }
      }
      buf = std::move(spare_bufs_[pick]);
      spare_bufs_[pick] = std::move(spare_bufs_.back());
      spare_bufs_.pop_back();
    }
    buf.assign(msg.begin(), msg.end());
    MPI_Request req = MPI_REQUEST_NULL;
    check(MPI_Isend(buf.data(), static_cast<int>(buf.size()), MPI_BYTE, peer, p2p_tag, comm_, &req), "MPI_Isend",
          "send");
    pending_reqs_.push_back(req);
    pending_bufs_.push_back(std::move(buf));
  }

  void recv(int peer, std::vector<std::byte>& out) {
    MPI_Message msg = MPI_MESSAGE_NULL;
    MPI_Status st;
    poll("recv", [&] {
      int flag = 0;
      check(MPI_Improbe(peer, p2p_tag, comm_, &flag, &msg, &st), "MPI_Improbe", "recv");
      return flag != 0;
    });
    int count = 0;
    check(MPI_Get_count(&st, MPI_BYTE, &count), "MPI_Get_count", "recv");
    if (opt_.isolate_buffers && count > 0) {
      // Receive into pooled memory so an abandoned receive can never write into `out`.
      auto* p = staging(static_cast<std::size_t>(count));
      MPI_Request req = MPI_REQUEST_NULL;
      check(MPI_Imrecv(p, count, MPI_BYTE, &msg, &req), "MPI_Imrecv", "recv");
      wait(req, "recv");
      out.resize(static_cast<std::size_t>(count));
      std::memcpy(out.data(), p, static_cast<std::size_t>(count));
    } else {
      out.resize(static_cast<std::size_t>(count));
      MPI_Request req = MPI_REQUEST_NULL;
      check(MPI_Imrecv(out.data(), count, MPI_BYTE, &msg, &req), "MPI_Imrecv", "recv");
      wait(req, "recv");
    }
  }

  //! Waits until every queued send is delivered (deadline and failure notices apply).
  void flush() {
    poll("flush", [&] {
      reap_sends("flush");
      return pending_reqs_.empty();
    });
  }

  std::size_t pending_sends() const { return pending_reqs_.size(); }

  //! Tests queued sends; completed buffers return to the pool.
  void reap_sends(const char* what) {
    for (std::size_t i = 0; i < pending_reqs_.size();) {
      int flag = 0;
      check(MPI_Test(&pending_reqs_[i], &flag, MPI_STATUS_IGNORE), "MPI_Test", what);
      if (flag) {
        retire(i);
      } else {
        ++i;
      }
    }
  }


 private:
  MPI_Comm dup(MPI_Comm parent, const char* which) {
    MPI_Comm out = MPI_COMM_NULL;
    MPI_Request req = MPI_REQUEST_NULL;
    int rc = MPI_Comm_idup(parent, &out, &req);
    if (rc != MPI_SUCCESS)
      throw comm_error(detail::cat("commpact::MpiComm: MPI_Comm_idup (", which, " communicator) failed: ",
                                   mpi_error_text(rc), "; pass a valid communicator on which every rank constructs "
                                                       "its MpiComm in the same order."));
    const auto deadline = std::chrono::steady_clock::now() + opt_.timeout;
    const auto start = std::chrono::steady_clock::now();
    world_errors_return guard;  // see wait()
    for (unsigned spin = 0;; ++spin) {
      int flag = 0;
      rc = MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS)
        throw comm_error(detail::cat("commpact::MpiComm: MPI_Test on MPI_Comm_idup (", which,
                                     " communicator) failed: ", mpi_error_text(rc), "."));
      if (flag) break;
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline)
        throw timeout_error(detail::cat("commpact::MpiComm: constructing the communicator waited more than ",
                                        opt_.timeout.count(),
                                        " ms in MPI_Comm_idup; every rank of the parent communicator must construct "
                                        "its MpiComm (in the same order)."));
      if (spin >= 64) backoff(std::chrono::duration_cast<std::chrono::microseconds>(now - start).count());
    }
    rc = MPI_Comm_set_errhandler(out, MPI_ERRORS_RETURN);
    if (rc != MPI_SUCCESS) {
      MPI_Comm_free(&out);
      throw comm_error(detail::cat("commpact::MpiComm: MPI_Comm_set_errhandler failed: ", mpi_error_text(rc), "."));
    }
    return out;
  }

  //! Be polite on oversubscribed nodes: spin briefly, then yield (MPI progresses only
  //! while we call it, so a long transfer must not be slowed by sleeps); sleep a little
  //! only once a wait has lasted a second, i.e. when a peer is late, not data slow.
  static void backoff(long long waited_us) {
    if (waited_us < 1000000) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(50));
  }

  void post_poison_recv() {
    check(MPI_Irecv(poison_buf_.data(), static_cast<int>(poison_buf_.size()), MPI_BYTE, MPI_ANY_SOURCE, poison_tag,
                    poison_comm_, &poison_recv_),
          "MPI_Irecv", "the failure-notice receive");
  }

  void poll_poison(const char* what) {
    if (poison_recv_ == MPI_REQUEST_NULL) return;
    int flag = 0;
    MPI_Status st;
    const int rc = MPI_Test(&poison_recv_, &flag, &st);
    if (rc != MPI_SUCCESS) {
      poison_recv_ = MPI_REQUEST_NULL;
      fail_and_tell(detail::cat("rank ", rank_, ": MPI_Test on the failure-notice receive in ", what,
                                " failed: ", mpi_error_text(rc)));
      return;
    }
    if (!flag) return;
    int count = 0;
    MPI_Get_count(&st, MPI_BYTE, &count);
    std::uint64_t nonce = 0;
    if (count >= static_cast<int>(sizeof(nonce))) std::memcpy(&nonce, poison_buf_.data(), sizeof(nonce));
    if (count < static_cast<int>(sizeof(nonce)) || nonce != nonce_) {
      post_poison_recv();  // a stale notice for an earlier communicator: drop it
      return;
    }
    std::string reason(reinterpret_cast<const char*>(poison_buf_.data()) + sizeof(nonce),
                       static_cast<std::size_t>(count) - sizeof(nonce));
    if (!failed_) {
      failed_ = true;  // the sender already told everyone; no need to forward
      failure_ = reason.empty() ? detail::cat("rank ", st.MPI_SOURCE, " failed") : std::move(reason);
    }
  }

  std::size_t reap_sends_noexcept() noexcept {
    std::size_t done = 0;
    for (std::size_t i = 0; i < pending_reqs_.size();) {
      int flag = 0;
      if (MPI_Test(&pending_reqs_[i], &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) return done;
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
    auto buf = std::move(pending_bufs_[i]);
    pending_reqs_[i] = pending_reqs_.back();
    pending_bufs_[i] = std::move(pending_bufs_.back());
    pending_reqs_.pop_back();
    pending_bufs_.pop_back();
    buf.clear();
    if (spare_bufs_.size() < 64) spare_bufs_.push_back(std::move(buf));
  }

  static void leak(std::vector<std::vector<std::byte>>&& bufs) {
    new std::vector<std::vector<std::byte>>(std::move(bufs));  // intentionally never freed
  }
  void leak_staging() {  // intentionally never freed: an abandoned operation may still write there
    new std::vector<std::byte>(std::move(staging_));
    (void)sig_.release();
  }

  mpi_options opt_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Comm poison_comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::uint64_t nonce_ = 0;
  bool failed_ = false;
  std::string failure_;
  std::unique_ptr<std::int64_t[]> sig_ = std::make_unique<std::int64_t[]>(7);  // MPI may hold it if abandoned
  // failure notices
  MPI_Request poison_recv_ = MPI_REQUEST_NULL;
  std::vector<std::byte> poison_buf_;
  std::string poison_payload_;
  std::vector<MPI_Request> poison_sends_;
  // operations given up after a failure (MPI cannot cancel them)
  std::vector<MPI_Request> abandoned_;
  std::vector<std::byte> staging_;
  // point to point
  std::vector<MPI_Request> pending_reqs_;
  std::vector<std::vector<std::byte>> pending_bufs_;
  std::vector<std::vector<std::byte>> spare_bufs_;
};

}  // namespace detail

//! One rank's handle on an MPI communicator; see the file comment. Cheap to copy: all
//! copies share one duplicated communicator and one failure state.
class MpiComm {
 public:
  //! Duplicates `comm` (collective over `comm`: every rank must construct its MpiComm
  //! in the same order). Requires MPI to be initialized.
  explicit MpiComm(MPI_Comm comm, mpi_options opt = {})
      : state_(std::make_shared<detail::mpi_state>(comm, opt)) {}

  int rank() const { return state_->rank(); }
  int size() const { return state_->size(); }
  const mpi_options& options() const { return state_->options(); }
  //! The duplicated communicator commpact's traffic runs on (for interoperation only).
  MPI_Comm native() const { return state_->native(); }
  //! True once this rank knows the group failed (abort, timeout, MPI error, notice).
  bool failed() const { return state_->failed(); }
  //! Why the group failed (empty while it has not).
  const std::string& failure() const { return state_->failure(); }

  //! In-place element-wise reduction over all ranks, bit-identical on every rank.
  //! T: float, double, or a 32- or 64-bit integer.
  template <class T>
    requires std::is_arithmetic_v<T>
  void allreduce(std::span<T> data, reduce_op op = reduce_op::sum) {
    static_assert(detail::mpi_reducible<T>,
                  "commpact::MpiComm::allreduce supports float, double and 32- or 64-bit integers; convert other "
                  "element types first.");
    auto& s = *state_;
    s.enter("allreduce");
    std::string bad;
    if (op != reduce_op::sum && op != reduce_op::min && op != reduce_op::max)
      bad = detail::cat("commpact::MpiComm::allreduce: rank ", rank(), " passed reduce_op ", static_cast<int>(op),
                        "; use reduce_op::sum, min or max.");
    else if (data.size() > static_cast<std::size_t>(INT_MAX))
      bad = detail::cat("commpact::MpiComm::allreduce: rank ", rank(), " passed ", data.size(),
                        " elements; MPI counts are int, so at most ", INT_MAX, " per call: split the buffer.");
    if (!verified(detail::mpi_coll::allreduce, detail::mpi_type_code<T>(), data.size_bytes(), static_cast<int>(op),
                  bad))
      return;
    MPI_Op mop = op == reduce_op::sum ? MPI_SUM : op == reduce_op::min ? MPI_MIN : MPI_MAX;
    // Isolated: MPI reads `data` and writes the staging buffer (out of place, which also
    // lets OpenMPI pick its bandwidth-optimal algorithms for large messages; in place it
    // always uses binomial reduce + broadcast). Otherwise in place on `data`.
    const void* src = MPI_IN_PLACE;
    T* dst = data.data();
    if (s.options().isolate_buffers && !data.empty()) {
      src = data.data();
      dst = reinterpret_cast<T*>(s.staging(data.size_bytes()));
    }
    MPI_Request req = MPI_REQUEST_NULL;
    s.check(MPI_Iallreduce(src, dst, static_cast<int>(data.size()), detail::mpi_reduce_type<T>(), mop, s.native(),
                           &req),
            "MPI_Iallreduce", "allreduce");
    s.wait(req, "allreduce");
    if (dst != data.data()) std::memcpy(data.data(), dst, data.size_bytes());
  }

  //! Concatenates every rank's `in` (all the same size) into `out` in rank order.
  template <class T>
    requires std::is_trivially_copyable_v<T>
  void allgather(std::span<const T> in, std::span<T> out) {
    auto& s = *state_;
    s.enter("allgather");
    const int P = size();
    std::string bad;
    if (out.size() != in.size() * static_cast<std::size_t>(P))
      bad = detail::cat("commpact::MpiComm::allgather: rank ", rank(), " passed an output of ", out.size(),
                        " elements; it must hold size() * in.size() = ", P, " * ", in.size(), ".");
    else if (in.size_bytes() > static_cast<std::size_t>(INT_MAX))
      bad = detail::cat("commpact::MpiComm::allgather: rank ", rank(), " passed a block of ", in.size_bytes(),
                        " bytes; MPI counts are int, so at most ", INT_MAX, " bytes per block: split the call.");
    if (!verified(detail::mpi_coll::allgather, 0, in.size_bytes(), 0, bad)) return;
    const int n = static_cast<int>(in.size_bytes());
    void* dst = out.data();
    if (s.options().isolate_buffers && n > 0) dst = s.staging(out.size_bytes());
    MPI_Request req = MPI_REQUEST_NULL;
    s.check(MPI_Iallgather(in.data(), n, MPI_BYTE, dst, n, MPI_BYTE, s.native(), &req), "MPI_Iallgather",
            "allgather");
    s.wait(req, "allgather");
    if (dst != out.data()) std::memcpy(out.data(), dst, out.size_bytes());
  }

  //! Copies root's data to every rank.
  template <class T>
    requires std::is_trivially_copyable_v<T>
  void broadcast(std::span<T> data, int root) {
    auto& s = *state_;
    s.enter("broadcast");
    std::string bad;
    if (root < 0 || root >= size())
      bad = detail::cat("commpact::MpiComm::broadcast: rank ", rank(), " passed root ", root, ", outside [0, ", size(),
                        "); pass the rank that holds the data.");
    else if (data.size_bytes() > static_cast<std::size_t>(INT_MAX))
      bad = detail::cat("commpact::MpiComm::broadcast: rank ", rank(), " passed ", data.size_bytes(),
                        " bytes; MPI counts are int, so at most ", INT_MAX, " bytes per call: split the buffer.");
    if (!verified(detail::mpi_coll::broadcast, 0, data.size_bytes(), root, bad)) return;
    void* buf = data.data();  // the root's buffer is only read
    if (s.options().isolate_buffers && !data.empty() && rank() != root) buf = s.staging(data.size_bytes());
    MPI_Request req = MPI_REQUEST_NULL;
    s.check(MPI_Ibcast(buf, static_cast<int>(data.size_bytes()), MPI_BYTE, root, s.native(), &req), "MPI_Ibcast",
            "broadcast");
    s.wait(req, "broadcast");
    if (buf != data.data() && rank() != root) std::memcpy(data.data(), buf, data.size_bytes());
  }

  //! Returns when every rank has entered barrier(). Queued sends are progressed, not
  //! awaited: like ThreadComm, a send never waits for its receiver (use flush()).
  void barrier() {
    auto& s = *state_;
    s.enter("barrier");
    if (s.options().verify_collectives) {
      s.verify(detail::mpi_coll::barrier, 0, 0, 0, {});
      return;
    }
    MPI_Request req = MPI_REQUEST_NULL;
    s.check(MPI_Ibarrier(s.native(), &req), "MPI_Ibarrier", "barrier");
    s.wait(req, "barrier");
  }

  //! Sends a copy of msg to peer; does not wait for the receiver.
  void send(int peer, std::span<const std::byte> msg) {
    check_peer(peer, "send");
    require(msg.size() <= static_cast<std::size_t>(INT_MAX), "commpact::MpiComm::send: rank ", rank(),
            " passed a message of ", msg.size(), " bytes; MPI counts are int, so at most ", INT_MAX,
            " bytes per message: split it.");
    state_->enter("send");
    state_->send(peer, msg);
  }

  //! Receives the next message from peer into buf (resized to the message length).
  void recv(int peer, std::vector<std::byte>& buf) {
    check_peer(peer, "recv");
    state_->enter("recv");
    state_->recv(peer, buf);
  }

  //! Pairwise exchange: sends msg to peer and receives peer's message into buf.
  void sendrecv(int peer, std::span<const std::byte> msg, std::vector<std::byte>& buf) {
    send(peer, msg);
    recv(peer, buf);
  }

  //! Waits until every message queued by send() has been delivered.
  void flush() {
    state_->enter("flush");
    state_->flush();
  }

  //! Sends queued by send() and not yet known to be delivered.
  std::size_t pending_sends() const { return state_->pending_sends(); }

  //! Marks the communicator failed on this rank and sends `why` to every other rank,
  //! whose current or next operation raises peer_failure. Never throws; a second call
  //! does nothing.
  void abort(std::string_view why) noexcept {
    try {
      state_->fail_and_tell(detail::cat("rank ", rank(), " aborted: ", why));
    } catch (...) {
    }
  }

 private:
  void check_peer(int peer, const char* what) const {
    require(peer >= 0 && peer < size() && peer != rank(), "commpact::MpiComm::", what, ": rank ", rank(),
            " named peer ", peer, "; a peer must be another rank in [0, ", size(), ").");
  }

  //! Returns false when the collective has nothing to move (all ranks agreed on 0 bytes).
  bool verified(detail::mpi_coll kind, int type_code, std::size_t bytes, int extra, const std::string& bad) {
    auto& s = *state_;
    if (s.options().verify_collectives) {
      s.verify(kind, type_code, static_cast<std::int64_t>(bytes), extra, bad);
      return bytes != 0;
    }
    if (!bad.empty()) throw invalid_argument(bad);
    return true;
  }

  std::shared_ptr<detail::mpi_state> state_;
};

static_assert(PointToPoint<MpiComm>);

//! Runs fn (as fn(comm) if that compiles, else fn()) and returns its result. If an
//! exception escapes, calls comm.abort(its message) so that every other rank raises
//! peer_failure instead of waiting, then rethrows. Works for any Communicator.
template <class C, class F>
  requires Communicator<C>
decltype(auto) mpi_guard(C& comm, F&& fn) {
  try {
    if constexpr (std::is_invocable_v<F&&, C&>) return std::invoke(std::forward<F>(fn), comm);
    else return std::invoke(std::forward<F>(fn));
  } catch (const std::exception& e) {
    comm.abort(detail::cat("threw: ", e.what()));
    throw;
  } catch (...) {
    comm.abort("threw a non-standard exception");
    throw;
  }
}

}  // namespace commpact
