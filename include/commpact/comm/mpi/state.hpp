// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file mpi/state.hpp
//! The state every copy of one MpiComm shares: the duplicated data communicator, the
//! failure channel, the deadline-bounded wait, the built-in signature check, staging
//! memory and the send queue. Part of MpiComm (include commpact/comm/mpi_comm.hpp).
//! (One class over 450 lines on purpose: the check, the rings, the shared-memory path and
//! the staging pool all run through its one wait and failure state; the mechanisms
//! themselves are the files it includes.)

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "../../error.hpp"
#include "../signature.hpp"
#include "small_collectives.hpp"
#include "datatype.hpp"
#include "failure.hpp"
#include "options.hpp"
#include "point_to_point.hpp"
#include "ring_allreduce.hpp"
#include "shared_memory.hpp"

namespace commpact {

namespace detail {

//! Shared state of all copies of one MpiComm handle.
class mpi_state {
 public:
  mpi_state(MPI_Comm parent, mpi_options opt) : opt_(opt) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized || mpi_finalized())
      throw comm_error(
          "commpact::MpiComm: MPI is not initialized (or already finalized); call MPI_Init before constructing "
          "an MpiComm and destroy every MpiComm before MPI_Finalize.");
    require(parent != MPI_COMM_NULL,
            "commpact::MpiComm: the communicator is MPI_COMM_NULL; pass a valid communicator such as MPI_COMM_WORLD.");
    detail::require_timeout(opt_.timeout, "commpact::MpiComm: mpi_options::timeout");
    detail::require_timeout(opt_.setup_timeout, "commpact::MpiComm: mpi_options::setup_timeout");
    // Construction waits under the longer of the two deadlines (setup_timeout's comment).
    wait_limit_ = std::max(opt_.timeout, opt_.setup_timeout);
    wait_limit_name_ = "mpi_options::setup_timeout (construction waits the larger of it and timeout)";
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
    MPI_Comm notice = MPI_COMM_NULL;
    try {
      comm_ = dup(parent, "data");
      notice = dup(parent, "failure-notice");
    } catch (...) {
      restore();
      if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
      throw;
    }
    restore();
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    // A nonce all ranks agree on (see mpi_failure_channel::open).
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
    notice_.open(notice, rank_, size_, *cell);
    wait_limit_ = opt_.timeout;  // constructed: every later wait has the operations' deadline
    wait_limit_name_ = "mpi_options::timeout";
  }

  mpi_state(const mpi_state&) = delete;
  mpi_state& operator=(const mpi_state&) = delete;

  ~mpi_state() {
    const bool alive = !mpi_finalized();
    if (alive && !failed_) {  // deliver what send() queued; peers of a failed group do not receive
      const auto deadline = std::chrono::steady_clock::now() + opt_.timeout;
      while (!sends_.empty() && std::chrono::steady_clock::now() < deadline)
        if (sends_.reap_noexcept() == 0) std::this_thread::yield();
    }
    if (!sends_.empty()) {
      std::fprintf(stderr,
                   "commpact::MpiComm: rank %d destroyed with %zu undelivered send(s) (no matching recv within the "
                   "deadline or the group failed); their buffers are leaked so MPI never reads freed memory.\n",
                   rank_, sends_.size());
      sends_.abandon(alive);
    }
    // MPI cannot cancel collectives, and OpenMPI rejects MPI_Request_free on them: an
    // abandoned operation may still run inside MPI, so its memory must outlive us.
    if (!abandoned_.empty() || !alive) leak_staging();
    notice_.close(std::min<std::chrono::milliseconds>(opt_.timeout, std::chrono::milliseconds(1000)), failed_);
    // A failed group keeps its data duplicate too: abandoned operations may still be in
    // flight on it, and a freed context id would be reused by the next communicator.
    if (alive && !failed_) MPI_Comm_free(&comm_);
  }

  int rank() const { return rank_; }
  int size() const { return size_; }
  const mpi_options& options() const { return opt_; }
  MPI_Comm native() const { return comm_; }
  bool failed() const { return failed_; }
  const std::string& failure() const { return failure_; }
  mpi_send_queue& sends() { return sends_; }

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
    if (!failed_) poll_notice();
    if (failed_)
      throw peer_failure(detail::cat("commpact::MpiComm: rank ", rank_, " refused ", what,
                                     " because the communicator failed earlier: ", detail::without_stop(failure_),
                                     ". Create a new MpiComm only after every rank has recovered, or end the run."));
    if (!sends_.empty()) sends_.reap([&](int rc, const char* call) { check(rc, call, what); });
  }

  //! Marks the group failed (first reason wins) and sends the reason to every other rank.
  void fail_and_tell(std::string reason) noexcept {
    if (failed_) return;
    failed_ = true;
    failure_ = std::move(reason);
    if (!mpi_finalized()) notice_.tell(failure_);
  }

  //! Polls `req` until it completes, another rank fails, or the deadline passes. A
  //! request given up on is kept (MPI cannot cancel collectives), never freed.
  void wait(MPI_Request& req, const char* what, MPI_Status* status = MPI_STATUS_IGNORE) {
    world_errors_return guard;  // see world_errors_return
    try {
      poll(what, [&] {
        int flag = 0;
        check(MPI_Test(&req, &flag, status), "MPI_Test", what);
        return flag != 0;
      });
    } catch (...) {
      abandon(req);
      throw;
    }
  }

  void abandon(MPI_Request& req) noexcept {
    if (req == MPI_REQUEST_NULL) return;
    try {
      abandoned_.push_back(req);
    } catch (...) {
    }
    req = MPI_REQUEST_NULL;
  }

  //! Polls `done()` (which calls MPI). The first spins touch neither the clock nor the
  //! failure channel, so a fast operation pays for nothing but MPI_Test; then every
  //! 16th spin tests the failure notice and the deadline. Like MPI_Wait, it does not
  //! give the core away while an operation is merely in progress (a yield on a busy
  //! node costs a scheduler time slice, and MPI progresses only while it is called);
  //! on an oversubscribed node OpenMPI's progress engine yields inside MPI_Test
  //! itself (mpi_yield_when_idle). After 10 ms it yields, and after a second, when a
  //! peer is late rather than data slow, it sleeps 50 us between polls.
  //! Every poll also advances the rings in flight (progress_rings), so a rank waiting
  //! for anything keeps the rings other ranks wait for moving.
  //! `peer` (>= 0: a point-to-point wait) is named in the timeout's message.
  template <class Done>
  void poll(const char* what, Done&& done, int peer = -1) {
    for (int i = 0; i < 64; ++i) {
      if (!active_.empty()) progress_rings();
      if (done()) return;
    }
    const auto start = std::chrono::steady_clock::now();
    const auto deadline = start + wait_limit_;
    for (unsigned spin = 0;; ++spin) {
      if (!active_.empty()) progress_rings();
      if (done()) return;
      if ((spin & 15) != 0) continue;
      if (!failed_) poll_notice();
      if (failed_) {
        // A peer failed, perhaps just after it finished its part of this operation (a
        // rank that raises after an agreement): this rank's part may be one message from
        // done. A short grace lets it complete, so every rank whose operation completes
        // returns its result and raises its own error, the same class as the others',
        // rather than the failure notice; the notice raises at the next operation.
        const auto grace_end = std::chrono::steady_clock::now() + failure_grace;
        while (std::chrono::steady_clock::now() < grace_end) {
          if (done()) return;
          std::this_thread::yield();
        }
        throw_if_told(what);
      }
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) {
        const auto ms = wait_limit_.count();
        const std::string where = waiting_in(what, peer);
        fail_and_tell(detail::cat("rank ", rank_, " waited more than ", ms, " ms in ", where));
        throw timeout_error(detail::cat("commpact::MpiComm: rank ", rank_, " waited more than ", ms, " ms in ", where,
                                        peer < 0 ? "; another rank is missing" : "; that rank is missing",
                                        ", stuck or much slower. Raise ", wait_limit_name_,
                                        " if the work is legitimately slow."));
      }
      const auto waited = now - start;
      if (waited >= std::chrono::seconds(1)) std::this_thread::sleep_for(std::chrono::microseconds(50));
      else if (waited >= std::chrono::milliseconds(10)) std::this_thread::yield();
    }
  }

  //! "irecv from rank 2", "isend to rank 0", or `what` alone for a collective (peer < 0).
  static std::string waiting_in(const char* what, int peer) {
    if (peer < 0) return what;
    const bool receives = std::string_view(what).find("recv") != std::string_view::npos;
    return detail::cat(what, receives ? " from rank " : " to rank ", peer);
  }

  //! How long an operation in flight may still complete after a peer's failure notice.
  static constexpr std::chrono::milliseconds failure_grace{100};

  //! Tests the failure channel; raises peer_failure when the group failed.
  void throw_if_told(const char* what) {
    if (!failed_) poll_notice();
    if (failed_)
      throw peer_failure(detail::cat("commpact::MpiComm: rank ", rank_, " abandoned ", what, " because ",
                                     detail::without_stop(failure_),
                                     ". Every rank's operations on this communicator now fail; end the run or "
                                     "restart from a checkpoint."));
  }

  //! Agrees on the collective's signature (signature_words int64 per rank, combined by MAX);
  //! throws the same error class on every rank when they disagree or one passed an
  //! invalid argument. Also serves as barrier.
  //! With P <= mpi_direct_check_ranks the signatures travel by direct exchange
  //! (verify_direct), else by recursive doubling; the choice depends on P only, so every
  //! rank makes the same one.
  void verify(const collective_signature& sig, const std::string& local_error) {
    if (direct_checks()) {
      verify_direct(sig, local_error);
      return;
    }
    encode_signature(sig, rank_, !local_error.empty(), sig_.get(), opt_.isolate_buffers);
    const char* what = coll_sig_name(static_cast<std::int64_t>(sig.kind));
    small_allreduce(std::span<std::int64_t>(sig_.get(), signature_words), reduce_op::max, what);
    judge_signature(sig, rank_, sig_.get(), local_error, "commpact::MpiComm");
    any_isolates_ = signature_any_isolates(sig_.get());
  }

  //! The message pattern of a direct allgather after the check (or, unchecked, without
  //! one): whether some rank isolates its buffers (gather_pieces.hpp). Checked, the last
  //! check that passed says so for every rank alike (encode_signature); unchecked, every
  //! rank must give isolate_buffers the same value.
  bool gather_by_pieces() const { return opt_.verify_collectives ? any_isolates_ : opt_.isolate_buffers; }

  //! True when the signature check is a direct exchange (verify_direct).
  bool direct_checks() const { return size_ <= mpi_direct_check_ranks; }

  //! The signature check by direct exchange: every rank sends its signature to every
  //! other rank in one round (P - 1 messages, under this check's own tag,
  //! mpi_check_tag0 + the checks so far), so each rank holds every signature, takes
  //! their MAX word by word (what the recursive doubling computes) and judges it alike
  //! (judge_signature). One round instead of log2(P) dependent ones, and it lets an
  //! allgather move its data in the same round: the signature message carries a block of
  //! up to mpi_inline_gather_block_max bytes (`first`; the receives take the most a
  //! message holds, whatever a peer sends), which stays in internal memory (inline_block)
  //! until the caller copies it out, after a check that passed (a held gather,
  //! MpiComm::held_allgather). Nothing else travels under the check's tag, so a check
  //! that fails leaves no message behind, writes no user memory, and the communicator
  //! stays usable.
  void verify_direct(const collective_signature& sig, const std::string& local_error,
                     std::span<const std::byte> first = {}) {
    constexpr int W = signature_words;
    constexpr std::size_t sig_bytes = sig_word_bytes, cap = sig_message_bytes;
    std::int64_t* mine = sig_.get();
    encode_signature(sig, rank_, !local_error.empty(), mine, opt_.isolate_buffers);
    const char* what = coll_sig_name(static_cast<std::int64_t>(sig.kind));
    const int P = size_, m = P - 1;
    const int tag = mpi_check_tag0 + static_cast<int>(check_seq_++ % static_cast<unsigned>(mpi_check_tags));
    std::int64_t w[W];
    std::copy(mine, mine + W, w);
    if (P > 1) {
      if (first_in_.size() < static_cast<std::size_t>(P) * cap) first_in_.resize(static_cast<std::size_t>(P) * cap);
      first_out_.resize(sig_bytes + first.size());
      std::memcpy(first_out_.data(), mine, sig_bytes);
      if (!first.empty()) std::memcpy(first_out_.data() + sig_bytes, first.data(), first.size());
      sig_reqs_.assign(2 * static_cast<std::size_t>(m), MPI_REQUEST_NULL);
      auto peer = [&](int i) { return (rank_ + 1 + i) % P; };
      try {
        for (int i = 0; i < m; ++i)
          check(MPI_Irecv(first_in_.data() + static_cast<std::size_t>(peer(i)) * cap, static_cast<int>(cap), MPI_BYTE,
                          peer(i), tag, comm_, &sig_reqs_[static_cast<std::size_t>(i)]),
                "MPI_Irecv", what);
        for (int i = 0; i < m; ++i)
          check(MPI_Isend(first_out_.data(), static_cast<int>(first_out_.size()), MPI_BYTE, peer(i), tag, comm_,
                          &sig_reqs_[static_cast<std::size_t>(m + i)]),
                "MPI_Isend", what);
        poll(what, [&] {
          int flag = 0;
          check(MPI_Testall(2 * m, sig_reqs_.data(), &flag, MPI_STATUSES_IGNORE), "MPI_Testall", what);
          return flag != 0;
        });
      } catch (...) {
        for (int i = 0; i < m; ++i) abandon(sig_reqs_[static_cast<std::size_t>(i)]);
        for (int i = m; i < 2 * m; ++i)
          if (sig_reqs_[static_cast<std::size_t>(i)] != MPI_REQUEST_NULL) MPI_Request_free(&sig_reqs_[static_cast<std::size_t>(i)]);
        throw;  // the abandoned requests may still use first_in_/first_out_: leak_staging keeps them
      }
      for (int i = 0; i < m; ++i) {  // our own words are in w already
        std::int64_t v[W];
        std::memcpy(v, first_in_.data() + static_cast<std::size_t>(peer(i)) * cap, sig_bytes);
        for (int k = 0; k < W; ++k) w[k] = std::max(w[k], v[k]);
      }
    }
    judge_signature(sig, rank_, w, local_error, "commpact::MpiComm");
    any_isolates_ = signature_any_isolates(w);
  }
  //! verify_direct: peer q's block, which came inside its signature message (when
  //! mpi_gather_pieces::inline_first; valid after a check that passed, until the next check).
  const std::byte* inline_block(int q) const {
    return first_in_.data() + static_cast<std::size_t>(q) * sig_message_bytes + sig_word_bytes;
  }
  //! A signature message: the signature's words, then (an inline allgather) the block;
  //! sig_message_bytes is the most it holds.
  static constexpr std::size_t sig_word_bytes = signature_words * sizeof(std::int64_t);
  static constexpr std::size_t sig_message_bytes = sig_word_bytes + mpi_inline_gather_block_max;

  // The latency path over point to point (mpi/small_collectives.hpp), for collectives
  // of at most mpi_rd_allreduce_bytes (allreduce) or mpi_small_collective_bytes.
  template <class T>
  void small_allreduce(std::span<T> data, reduce_op op, const char* what) {
    mpi_rd_allreduce(*this, data, op, rd_scratch_, what);
  }
  //! Starts a ring allreduce (mpi/ring_allreduce.hpp) and returns it; it advances in
  //! every poll until finish_ring() or drop_ring() takes it back. Allocates nothing once
  //! the pool is warm.
  template <class T>
  std::unique_ptr<mpi_ring_op> start_ring(std::span<T> data, reduce_op op, const char* what) {
    auto ring = pooled_ring();
    ring->reset(data, op, rank_, size_, next_ring_tag(), opt_.isolate_buffers, what);
    return launch(std::move(ring));
  }
  //! Starts a direct allgather (every block to every rank at once; mpi/ring_allreduce.hpp),
  //! by pieces when gather_by_pieces().
  std::unique_ptr<mpi_ring_op> start_direct_gather(std::span<const std::byte> in, std::span<std::byte> out) {
    auto ring = pooled_ring();
    ring->reset_direct_gather(in, out, rank_, size_, next_ring_tag(), opt_.isolate_buffers, gather_by_pieces(),
                              "allgather");
    return launch(std::move(ring));
  }
  std::unique_ptr<mpi_ring_op> pooled_ring() {
    if (ring_pool_.empty()) return std::make_unique<mpi_ring_op>();
    auto ring = std::move(ring_pool_.back());
    ring_pool_.pop_back();
    return ring;
  }
  int next_ring_tag() {
    return mpi_ring_tag0 + static_cast<int>(ring_seq_++ % static_cast<unsigned>(mpi_ring_tags));
  }
  std::unique_ptr<mpi_ring_op> launch(std::unique_ptr<mpi_ring_op> ring) {
    active_.push_back(ring.get());
    try {
      ring->advance(*this);  // posts the first step
    } catch (...) {
      drop_ring(ring);
      throw;
    }
    return ring;
  }
  //! Takes a finished ring back: raises its error (the ring is then leaked) or pools it.
  void finish_ring(std::unique_ptr<mpi_ring_op>& ring) {
    unlist(ring.get());
    if (ring->error()) {
      const auto e = ring->error();
      (void)ring.release();  // its scratch may still be a receive target
      std::rethrow_exception(e);
    }
    if (ring_pool_.size() < 16) ring_pool_.push_back(std::move(ring));
    else ring.reset();
  }
  //! Gives up on a ring (a wait for it failed): its requests are kept, it is leaked.
  void drop_ring(std::unique_ptr<mpi_ring_op>& ring) noexcept {
    if (!ring) return;
    unlist(ring.get());
    ring->give_up(*this);
    (void)ring.release();
  }
  //! Advances every ring in flight, oldest first. A ring that fails here keeps its
  //! error for its own wait (the group is failed already, so the caller's wait raises).
  void progress_rings() noexcept {
    for (std::size_t i = 0; i < active_.size();) {
      mpi_ring_op* ring = active_[i];
      try {
        ring->advance(*this);
      } catch (...) {
        ring->fail(*this, std::current_exception());
      }
      if (ring->finished()) active_.erase(active_.begin() + static_cast<std::ptrdiff_t>(i));
      else ++i;
    }
  }
  void small_broadcast(std::span<std::byte> data, int root) {
    mpi_tree_broadcast(*this, data, root, opt_.isolate_buffers, rd_scratch_, "broadcast");
  }
  void small_allgather(std::span<const std::byte> in, std::span<std::byte> out) {
    mpi_direct_allgather(*this, in, out, opt_.isolate_buffers, rd_scratch_, rd_reqs_, "allgather");
  }

  // The shared-memory path (mpi/shared_memory.hpp), for checked collectives only.

  //! True when a checked collective moving `bytes` per rank (an allreduce's data, an
  //! allgather's block) takes the shared-memory path. Every rank that passes the same
  //! size decides alike (the ceiling changes only where every rank agreed).
  bool shm_wanted(std::size_t bytes) const {
    return opt_.verify_collectives && size_ > 1 && bytes > 0 && bytes <= opt_.shared_memory_max &&
           bytes <= shm_ceiling_;
  }
  //! Before the check: copies this rank's bytes into its current half when the segments
  //! hold them already (true), which the check then publishes; bytes [skip_lo, skip_hi)
  //! only this rank reads (an allreduce's own chunk), so they stay out. Else false:
  //! shm_ready sets the segments up after the check.
  bool shm_stage(std::span<const std::byte> mine, std::size_t skip_lo = 0, std::size_t skip_hi = 0) {
    if (!shm_.mapped() || mine.size() > shm_.capacity()) return false;
    shm_copy_in(shm_.half(rank_), mine, skip_lo, skip_hi);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    return true;
  }
  //! After a check that passed (so every rank calls it alike, with the same size and the
  //! same `staged`): true when every rank's bytes are in its current half. Where they were
  //! not staged, sets up or grows the segments (collective: two rounds of the latency
  //! path), staging this rank's bytes into the new ones before the second round. False
  //! when that failed on some rank: every rank then takes point to point for this size
  //! and above, and shared_memory_note() says why.
  bool shm_ready(std::span<const std::byte> mine, bool staged, const char* what, std::size_t skip_lo = 0,
                 std::size_t skip_hi = 0) {
    if (!staged) {
      std::size_t half = mpi_shm_min_half;
      while (half < mine.size()) half *= 2;
      const std::size_t most = (opt_.shared_memory_max + 4095) / 4096 * 4096;  // >= mine.size()
      half = std::min(half, std::max(most, mine.size()));
      const unsigned gen = shm_gen_++;
      try {
        std::string err = shm_.create(nonce_, rank_, gen, half);
        if (!shm_agree(err, what)) return false;
        for (int q = 0; q < size_ && err.empty(); ++q)
          if (q != rank_) err = shm_.attach(nonce_, q, gen);
        if (err.empty()) shm_copy_in(shm_.pending_own(), mine, skip_lo, skip_hi);
        std::atomic_thread_fence(std::memory_order_seq_cst);
        if (!shm_agree(err, what)) return false;  // also the barrier: every rank staged
        shm_.adopt(size_);
      } catch (...) {
        shm_.drop_pending();
        throw;
      }
    }
    std::atomic_thread_fence(std::memory_order_seq_cst);
    return true;
  }
  //! Why the shared-memory path was given up for some sizes (empty while it was not).
  const std::string& shm_note() const { return shm_note_; }
  //! Bytes each mapped half holds (0 while none is mapped).
  std::size_t shm_capacity() const { return shm_.capacity(); }

  //! The allgather over shared memory, after shm_ready: every peer's block from its half.
  void shm_allgather(std::span<const std::byte> in, std::span<std::byte> out) {
    const std::size_t b = in.size();
    for (int i = 0; i < size_; ++i) {
      const int q = (rank_ + i) % size_;
      std::memcpy(out.data() + b * static_cast<std::size_t>(q), q == rank_ ? in.data() : shm_.half(q), b);
    }
    shm_.flip();
  }
  //! The bytes of this rank's chunk of an allreduce of n elements of `elem` bytes, the
  //! chunk only this rank reads (shm_stage leaves it out; shm_allreduce reads it from `data`).
  std::pair<std::size_t, std::size_t> shm_own_chunk(std::size_t n, std::size_t elem) const {
    const auto P = static_cast<std::size_t>(size_), r = static_cast<std::size_t>(rank_);
    return {n * r / P * elem, n * (r + 1) / P * elem};
  }
  //! The allreduce over shared memory, after shm_ready: this rank folds chunk rank() of
  //! every rank's data (ranks in ascending order; its own operand straight from `data`,
  //! the others from their halves) into chunk rank() of its own half, a check round
  //! (`sig`, the collective's own signature again) makes sure every rank has folded,
  //! then every chunk is copied from the half of the rank that folded it.
  template <class T>
  void shm_allreduce(std::span<T> data, reduce_op op, const collective_signature& sig) {
    const std::size_t n = data.size(), P = static_cast<std::size_t>(size_), r = static_cast<std::size_t>(rank_);
    auto lo = [&](std::size_t c) { return n * c / P; };
    auto h = [&](std::size_t q) { return reinterpret_cast<T*>(shm_.half(static_cast<int>(q))); };
    auto operand = [&](std::size_t q) -> const T* { return q == r ? data.data() : h(q); };
    T* mine = h(r);  // the result's chunk r; no operand lives there
    const std::size_t a = lo(r), len = lo(r + 1) - a;
    mpi_combine(mine + a, operand(0) + a, operand(1) + a, len, op);
    for (std::size_t q = 2; q < P; ++q) mpi_combine(mine + a, mine + a, operand(q) + a, len, op);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    verify(sig, {});  // every rank folded its chunk
    std::atomic_thread_fence(std::memory_order_seq_cst);
    for (std::size_t c = 0; c < P; ++c) std::memcpy(data.data() + lo(c), h(c) + lo(c), (lo(c + 1) - lo(c)) * sizeof(T));
    shm_.flip();
  }

  //! A pooled buffer of n bytes for one operation (the best fit: the smallest that holds
  //! n, else the largest, so mixed sizes rarely reallocate); give it back with recycle()
  //! when the operation completed, or leak it when it was abandoned.
  std::vector<std::byte> take_buffer(std::size_t n) {
    std::vector<std::byte> b;
    if (!pool_.empty()) {
      std::size_t pick = 0;
      for (std::size_t i = 1; i < pool_.size(); ++i) {
        const auto c = pool_[i].capacity(), best = pool_[pick].capacity();
        if (best >= n ? (c >= n && c < best) : c > best) pick = i;
      }
      b = std::move(pool_[pick]);
      pool_[pick] = std::move(pool_.back());
      pool_.pop_back();
    }
    b.resize(n);
    return b;
  }
  void recycle(std::vector<std::byte>&& b) {
    if (pool_.size() < 16) pool_.push_back(std::move(b));
  }

  //! Waits until every queued send is delivered (deadline and failure notices apply).
  void flush() {
    poll("flush", [&] {
      sends_.reap([&](int rc, const char* call) { check(rc, call, "flush"); });
      return sends_.empty();
    });
  }

 private:
  static void shm_copy_in(std::byte* to, std::span<const std::byte> from, std::size_t skip_lo, std::size_t skip_hi) {
    if (skip_hi <= skip_lo) {
      std::memcpy(to, from.data(), from.size());
      return;
    }
    std::memcpy(to, from.data(), skip_lo);
    std::memcpy(to + skip_hi, from.data() + skip_hi, from.size() - skip_hi);
  }
  //! One round of the latency path: true when `err` is empty on every rank; else every
  //! rank drops the new segments and keeps point to point from this size up.
  bool shm_agree(const std::string& err, const char* what) {
    std::int64_t ok[1] = {err.empty() ? 1 : 0};  // never a receive target (small_collectives.hpp)
    small_allreduce(std::span<std::int64_t>(ok, 1), reduce_op::min, what);
    if (ok[0] == 1) return true;
    shm_.drop_pending();
    shm_ceiling_ = shm_.capacity();
    shm_note_ = err.empty() ? detail::cat("another rank could not set up shared memory; collectives above ",
                                          shm_ceiling_, " bytes per rank take point to point")
                            : detail::cat("rank ", rank_, ": ", err, "; collectives above ", shm_ceiling_,
                                          " bytes per rank take point to point");
    return false;
  }

  void poll_notice() {
    std::string reason;
    if (notice_.poll(reason) && !failed_) {
      failed_ = true;  // the sender already told everyone; no need to forward
      failure_ = std::move(reason);
    }
  }

  MPI_Comm dup(MPI_Comm parent, const char* which) {
    MPI_Comm out = MPI_COMM_NULL;
    MPI_Request req = MPI_REQUEST_NULL;
    int rc = MPI_Comm_idup(parent, &out, &req);
    if (rc != MPI_SUCCESS)
      throw comm_error(detail::cat("commpact::MpiComm: MPI_Comm_idup (", which, " communicator) failed: ",
                                   mpi_error_text(rc), "; pass a valid communicator on which every rank constructs "
                                                       "its MpiComm in the same order."));
    const auto start = std::chrono::steady_clock::now();
    const auto deadline = start + wait_limit_;
    world_errors_return guard;
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
                                        wait_limit_.count(),
                                        " ms in MPI_Comm_idup; every rank of the parent communicator must construct "
                                        "its MpiComm (in the same order). Raise ", wait_limit_name_,
                                        " if a rank legitimately arrives later."));
      if (spin >= 64) std::this_thread::yield();
    }
    rc = MPI_Comm_set_errhandler(out, MPI_ERRORS_RETURN);
    if (rc != MPI_SUCCESS) {
      MPI_Comm_free(&out);
      throw comm_error(detail::cat("commpact::MpiComm: MPI_Comm_set_errhandler failed: ", mpi_error_text(rc), "."));
    }
    return out;
  }

  void unlist(mpi_ring_op* ring) noexcept {
    for (std::size_t i = 0; i < active_.size(); ++i)
      if (active_[i] == ring) {
        active_.erase(active_.begin() + static_cast<std::ptrdiff_t>(i));
        return;
      }
  }

  void leak_staging() noexcept {  // intentionally never freed: an abandoned operation may still write there
    new std::vector<std::vector<std::byte>>(std::move(pool_));
    new std::vector<std::byte>(std::move(rd_scratch_));
    new std::vector<std::byte>(std::move(first_in_));
    new std::vector<std::byte>(std::move(first_out_));
    (void)sig_.release();
  }

  mpi_options opt_;
  // The deadline of a wait (poll, dup) and the option its message names: the larger of
  // setup_timeout and timeout while constructing, then timeout.
  std::chrono::milliseconds wait_limit_{};
  const char* wait_limit_name_ = "mpi_options::timeout";
  MPI_Comm comm_ = MPI_COMM_NULL;
  mpi_failure_channel notice_;
  int rank_ = 0, size_ = 1;
  bool failed_ = false;
  std::string failure_;
  std::unique_ptr<std::int64_t[]> sig_ = std::make_unique<std::int64_t[]>(signature_words);
  std::vector<MPI_Request> abandoned_;  // operations given up after a failure (MPI cannot cancel them)
  std::vector<std::byte> rd_scratch_;  // receive buffer of the small collectives
  std::vector<MPI_Request> rd_reqs_;
  std::vector<std::byte> first_in_;        // verify_direct: every peer's signature message (and inline block)
  std::vector<std::byte> first_out_;       // verify_direct: ours
  std::vector<MPI_Request> sig_reqs_;
  std::vector<std::vector<std::byte>> pool_;  // staging for nonblocking operations
  std::vector<mpi_ring_op*> active_;           // rings in flight, oldest first (owned by their callers)
  std::vector<std::unique_ptr<mpi_ring_op>> ring_pool_;  // finished rings, reused
  unsigned ring_seq_ = 0;                      // rings started; every rank counts alike
  unsigned check_seq_ = 0;                     // direct signature checks made; every rank counts alike
  bool any_isolates_ = true;                   // the last check that passed: some rank isolates its buffers
  mpi_send_queue sends_;
  std::uint64_t nonce_ = 0;                    // agreed by every rank at construction
  mpi_shared_segments shm_;                    // the shared-memory path (shared_memory.hpp)
  unsigned shm_gen_ = 0;                       // segment generations; every rank counts alike
  std::size_t shm_ceiling_ = static_cast<std::size_t>(-1);  // larger sizes stay on point to point
  std::string shm_note_;
};

}  // namespace detail
}  // namespace commpact
