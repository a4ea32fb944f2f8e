// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file mpi/ring_allreduce.hpp
//! MpiComm's bandwidth path for allreduces above 64 KiB, blocking and nonblocking alike:
//! a ring reduce-scatter then a ring allgather over point-to-point messages. Each rank
//! moves 2 (P-1)/P of the data instead of recursive doubling's log2(P) times all of it,
//! and it avoids OpenMPI's nonblocking allreduce (libnbc), which is 2-2.7x slower than
//! the blocking one from 1 MiB up on shared memory.
//!
//! Allgathers above 64 KiB are a direct exchange run by the same object (every rank
//! sends its block to every other rank at once, as libnbc's MPI_Iallgather, used
//! before, does): each rank's block goes from `in` straight into `out`, and with
//! isolated buffers each received block is copied out of its slot of scratch as soon
//! as it arrived (MPI_Iallgather into staging copied the whole output once more, and
//! its own block twice); blocks above 128 KiB travel as 64 KiB pieces through a few
//! slots of scratch per peer that stay in cache (gather_pieces.hpp), so that copy reads
//! from cache, not memory. The ring's allgather half alone was tried and removed: no
//! better within the noise at P = 4 on 2 cores, where each of its P-1 dependent steps
//! waits for a neighbour to be scheduled.
//!
//! One operation is an mpi_ring_op: a state machine of 2 (P-1) steps (one send to the
//! right, one receive from the left, then a fold or a copy). `allreduce` starts one and
//! waits for it; `iallreduce` starts one and returns a handle. So both forms send the
//! same messages, and ranks may mix them (a blocking allreduce on some ranks, an
//! iallreduce on others), as on ThreadComm. Every wait of the communicator (any
//! operation's, blocking or not) advances every ring in flight, in the order they
//! started, so rings complete whatever order ranks wait for them in; each ring has its
//! own tag (a sequence number every rank counts alike), so the messages of two rings in
//! flight never meet.
//!
//! Identical results: the data is cut into P chunks; chunk c is combined along the ring
//! in one fixed order, its final value is computed on exactly one rank, and the other
//! ranks receive those bytes, so every rank holds the same bits.
//! Isolation: as in the recursive doubling, MPI receives only into internal scratch
//! when buffers are isolated; this rank folds and copies each arrived chunk into `data`
//! itself (so after a failure `data` may hold partly reduced values, but nothing
//! writes into it later). Part of MpiComm (include commpact/comm/mpi_comm.hpp).

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstring>
#include <exception>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "combine.hpp"
#include "gather_pieces.hpp"

namespace commpact::detail {

//! Ring tags: mpi_ring_tag0 + (sequence number mod mpi_ring_tags), apart from the
//! latency path's tag (small_collectives.hpp), the send queue's and the failure notices'.
inline constexpr int mpi_ring_tag0 = 1024;
inline constexpr int mpi_ring_tags = 16384;
//! Direct signature checks' tags (mpi_state::verify_direct): mpi_check_tag0 + (the
//! number of direct checks so far mod mpi_check_tags), counted alike on every rank
//! whether a check passes or fails (ring tags are counted per ring, which a failed check
//! does not start). A check's messages, which may carry an allgather's block (a held
//! gather), never meet another collective's.
inline constexpr int mpi_check_tag0 = mpi_ring_tag0 + mpi_ring_tags;
inline constexpr int mpi_check_tags = 8192;

//! The path an allreduce of `bytes` (elements of `elem` bytes) over P ranks takes, the
//! same for allreduce and iallreduce: the latency path (recursive doubling), the ring,
//! or MPI_Iallreduce where one ring step would pass MPI's int count.
enum class mpi_allreduce_path { small, ring, libnbc };
inline mpi_allreduce_path allreduce_path_for(std::size_t bytes, std::size_t elem, int P, std::size_t small_max) {
  if (bytes <= small_max) return mpi_allreduce_path::small;
  if (bytes / static_cast<std::size_t>(P) + 2 * elem > static_cast<std::size_t>(INT_MAX))
    return mpi_allreduce_path::libnbc;
  return mpi_allreduce_path::ring;
}

//! One ring allreduce in flight. Reused through the state's pool (no allocation per
//! call once warm); abandoned (leaked) when a wait for it fails, since MPI may still
//! write into its scratch.
class mpi_ring_op {
 public:
  //! Prepares a ring over `data` (elements of T, reduced with op) for rank r of P, with
  //! the given tag. `isolate`: MPI receives only into scratch.
  template <class T>
  void reset(std::span<T> data, reduce_op op, int r, int P, int tag, bool isolate, const char* what) {
    d_ = reinterpret_cast<std::byte*>(data.data());
    n_ = data.size();
    elem_ = sizeof(T);
    combine_ = [](std::byte* out, const std::byte* a, const std::byte* b, std::size_t n, reduce_op o) {
      mpi_combine(reinterpret_cast<T*>(out), reinterpret_cast<const T*>(a), reinterpret_cast<const T*>(b), n, o);
    };
    op_ = op;
    start(r, P, tag, isolate, what);
    // One chunk: the receive target of the reduce-scatter (and, isolated, of the allgather half).
    const std::size_t most = (n_ + static_cast<std::size_t>(P) - 1) / static_cast<std::size_t>(P);
    if (scratch_.size() < most * elem_) scratch_.resize(most * elem_);
  }

  //! Prepares a direct allgather: every rank sends its block to every other rank at
  //! once (no chain of steps, which costs a scheduling round per step when ranks share
  //! cores); with `isolate` each block arrives in its own slot of scratch and is copied
  //! out as soon as it arrived. `pieces`: some rank isolates its buffers, so blocks
  //! above 128 KiB travel by pieces (gather_pieces.hpp), which every rank must know
  //! alike (it is the message pattern); else each block is one message.
  void reset_direct_gather(std::span<const std::byte> in, std::span<std::byte> out, int r, int P, int tag,
                           bool isolate, bool pieces, const char* what) {
    d_ = out.data();
    n_ = out.size();
    elem_ = 1;
    combine_ = nullptr;
    std::memcpy(out.data() + in.size() * static_cast<std::size_t>(r), in.data(), in.size());
    start(r, P, tag, isolate, what);
    direct_ = true;
    in_ = in.data();
    block_ = in.size();
    if (pieces && P > 1 && mpi_gather_pieces::wanted(block_)) {  // large blocks: by cache-sized pieces
      by_pieces_ = true;
      pieces_.reset(in_, d_, block_, r, P, tag, isolate);
      return;
    }
    const std::size_t need = isolate ? block_ * static_cast<std::size_t>(P - 1) : 0;
    if (scratch_.size() < need) scratch_.resize(need);
  }

  //! True once the ring completed or failed (then error() holds why).
  bool finished() const { return done_ || error_ != nullptr; }
  const std::exception_ptr& error() const { return error_; }
  const char* what() const { return what_; }

  //! Moves the ring on as far as arrived messages allow, without waiting. Returns
  //! finished(). Throws what the state's check() throws on an MPI error.
  template <class State>
  bool advance(State& s) {
    if (finished()) return true;
    if (direct_) return advance_direct(s);
    for (;;) {
      if (posted_) {
        int flag = 0;
        s.check(MPI_Testall(2, q_, &flag, MPI_STATUSES_IGNORE), "MPI_Testall", what_);
        if (!flag) return false;
        posted_ = false;
        const int rc = recv_chunk(k_);
        if (k_ < P_ - 1) combine_(at(rc), scratch_.data(), at(rc), len(rc), op_);
        else if (isolate_) std::memcpy(at(rc), scratch_.data(), len(rc) * elem_);
        ++k_;
      }
      if (k_ == 2 * (P_ - 1)) {
        done_ = true;
        return true;
      }
      post(s);
    }
  }

  //! Records a failure raised while another wait advanced this ring (the group is then
  //! failed already); the owner's wait raises it.
  template <class State>
  void fail(State& s, std::exception_ptr e) noexcept {
    give_up(s);
    error_ = std::move(e);
  }

  //! Hands the requests still in flight to the state (kept, never freed: the receive
  //! may still write into scratch, which the caller then leaks with this object).
  template <class State>
  void give_up(State& s) noexcept {
    if (by_pieces_) pieces_.give_up(s);
    s.abandon(q_[0]);
    if (q_[1] != MPI_REQUEST_NULL) MPI_Request_free(&q_[1]);
    const std::size_t m = static_cast<std::size_t>(P_ - 1);
    for (std::size_t i = 0; i < dq_.size(); ++i) {
      if (i < m) s.abandon(dq_[i]);
      else if (dq_[i] != MPI_REQUEST_NULL) MPI_Request_free(&dq_[i]);
    }
    posted_ = false;
  }

 private:
  // Reduce-scatter: in step k rank r passes chunk r - k on (its own data in step 0, the
  // chunk it folded in step k - 1 later) and folds chunk r - k - 1 in; afterwards rank r
  // holds the final value of chunk r + 1. Allgather (steps P-1 .. 2P-3, j = k - P + 1):
  // rank r passes chunk r + 1 - j on and receives chunk r - j.
  int send_chunk(int k) const {
    return k < P_ - 1 ? (r_ - k + P_) % P_ : (r_ + 1 - (k - P_ + 1) + P_) % P_;
  }
  int recv_chunk(int k) const {
    return k < P_ - 1 ? (r_ - k - 1 + 2 * P_) % P_ : (r_ - (k - P_ + 1) + P_) % P_;
  }
  // The direct allgather: slot i (of P - 1) is rank r + 1 + i; requests dq_[0, P-1) are
  // the receives, dq_[P-1, 2P-2) the sends; pending_ receives are outstanding.
  int slot_rank(int i) const { return (r_ + 1 + i) % P_; }
  template <class State>
  bool advance_direct(State& s) {
    if (by_pieces_) return done_ = pieces_.advance(s, what_);
    const int m = P_ - 1;
    if (!posted_) {
      dq_.assign(2 * static_cast<std::size_t>(m), MPI_REQUEST_NULL);
      idx_.resize(static_cast<std::size_t>(m));
      posted_ = true;  // from here on give_up() must abandon the receives
      const int b = static_cast<int>(block_);
      for (int i = 0; i < m; ++i) {
        const int q = slot_rank(i);
        std::byte* into = isolate_ ? scratch_.data() + block_ * static_cast<std::size_t>(i)
                                   : d_ + block_ * static_cast<std::size_t>(q);
        s.check(MPI_Irecv(into, b, MPI_BYTE, q, tag_, s.native(), &dq_[static_cast<std::size_t>(i)]), "MPI_Irecv",
                what_);
      }
      for (int i = 0; i < m; ++i)
        s.check(MPI_Isend(in_, b, MPI_BYTE, slot_rank(i), tag_, s.native(), &dq_[static_cast<std::size_t>(m + i)]),
                "MPI_Isend", what_);
      pending_ = m;
    }
    while (pending_ > 0) {
      int count = 0;
      s.check(MPI_Testsome(m, dq_.data(), &count, idx_.data(), MPI_STATUSES_IGNORE), "MPI_Testsome", what_);
      if (count == MPI_UNDEFINED || count == 0) return false;
      for (int j = 0; j < count; ++j) {
        const int i = idx_[static_cast<std::size_t>(j)];
        if (isolate_)
          std::memcpy(d_ + block_ * static_cast<std::size_t>(slot_rank(i)),
                      scratch_.data() + block_ * static_cast<std::size_t>(i), block_);
      }
      pending_ -= count;
    }
    int flag = 0;
    s.check(MPI_Testall(m, dq_.data() + m, &flag, MPI_STATUSES_IGNORE), "MPI_Testall", what_);
    if (!flag) return false;
    posted_ = false;
    done_ = true;
    return true;
  }

  void start(int r, int P, int tag, bool isolate, const char* what) {
    r_ = r;
    P_ = P;
    tag_ = tag;
    isolate_ = isolate;
    what_ = what;
    k_ = 0;
    posted_ = false;
    direct_ = false;
    by_pieces_ = false;
    done_ = P == 1 || n_ == 0;
    error_ = nullptr;
    q_[0] = q_[1] = MPI_REQUEST_NULL;
    dq_.clear();
  }
  std::size_t lo(int c) const { return n_ * static_cast<std::size_t>(c) / static_cast<std::size_t>(P_); }
  std::size_t len(int c) const { return lo(c + 1) - lo(c); }
  std::byte* at(int c) const { return d_ + lo(c) * elem_; }

  template <class State>
  void post(State& s) {
    const int sc = send_chunk(k_), rc = recv_chunk(k_);
    const int right = (r_ + 1) % P_, left = (r_ + P_ - 1) % P_;
    std::byte* into = k_ < P_ - 1 || isolate_ ? scratch_.data() : at(rc);
    s.check(MPI_Irecv(into, static_cast<int>(len(rc) * elem_), MPI_BYTE, left, tag_, s.native(), &q_[0]), "MPI_Irecv",
            what_);
    posted_ = true;  // from here on give_up() must abandon the receive
    s.check(MPI_Isend(at(sc), static_cast<int>(len(sc) * elem_), MPI_BYTE, right, tag_, s.native(), &q_[1]),
            "MPI_Isend", what_);
  }

  std::byte* d_ = nullptr;
  std::size_t n_ = 0, elem_ = 1;
  void (*combine_)(std::byte*, const std::byte*, const std::byte*, std::size_t, reduce_op) = nullptr;
  reduce_op op_ = reduce_op::sum;
  int r_ = 0, P_ = 1, tag_ = mpi_ring_tag0, k_ = 0;
  bool isolate_ = true, posted_ = false, done_ = true;
  const char* what_ = "allreduce";
  MPI_Request q_[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  bool direct_ = false;                // a direct allgather (advance_direct)
  const std::byte* in_ = nullptr;      // its block
  std::size_t block_ = 0;
  int pending_ = 0;
  std::vector<MPI_Request> dq_;        // its requests (kept: no allocation once warm)
  std::vector<int> idx_;
  std::vector<std::byte> scratch_;  // one chunk: the receive target of the reduce-scatter
  bool by_pieces_ = false;          // a direct allgather of large blocks by pieces (gather_pieces.hpp)
  mpi_gather_pieces pieces_;
  std::exception_ptr error_;
};

}  // namespace commpact::detail
