// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file mpi/gather_pieces.hpp
//! The isolated direct allgather of large blocks, received in cache-sized pieces.
//! With isolate_buffers (the default) MPI may receive only into internal memory, and
//! each block is copied out of it once it arrived. Received whole, a block of 16 MiB
//! lands in 16 MiB of scratch that has left the cache by the time it is copied, so the
//! copy costs a pass over memory: at P = 4 on shared memory the isolated allgather
//! measured 1.3-1.4x raw MPI_Allgather from 4 MiB, against 0.9-1.0x received straight
//! into the output (docs/notes/communicators-history.md, "At -O2"). Here every block travels as
//! pieces of mpi_gather_piece_bytes; each peer has mpi_gather_depth slots of scratch (a
//! few hundred KiB in all, which stay in cache), and a piece is copied out of its slot
//! as soon as it arrived, then the slot takes the peer's next piece. Each rank keeps
//! mpi_gather_depth sends per peer in flight, so it never floods a receiver with pieces
//! it has no slot for (OpenMPI would buffer their first fragments, one more copy).
//!
//! MPI matches messages of one sender, tag and communicator in the order they were
//! posted, so piece j of a block always meets the j-th receive posted for that peer:
//! both sides post pieces in ascending order, whatever order their requests complete
//! in. Isolated, receives target the scratch slots only; a give-up leaves them to the
//! state and the scratch to its owner, which leaks it (mpi_ring_op).
//!
//! Going by pieces or not is the message pattern, which every rank must share: a rank
//! that does not isolate its buffers still goes by pieces when another rank does (it
//! then receives each piece straight into `out`). MpiComm's check tells every rank
//! whether any rank isolates (mpi_state::verify); unchecked ranks must agree on
//! isolate_buffers. Part of MpiComm (include commpact/comm/mpi_comm.hpp).

#include <mpi.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <vector>

namespace commpact::detail {

//! Bytes per piece of an isolated allgather's blocks above this size (gather_pieces).
inline constexpr std::size_t mpi_gather_piece_bytes = 64 * 1024;
//! Pieces in flight per peer and direction (receive slots per peer, sends per peer).
inline constexpr int mpi_gather_depth = 2;
//! A checked allgather's block of at most this many bytes travels inside its signature
//! message (a held gather, mpi_state::verify_direct): OpenMPI's shared-memory transport
//! (vader) sends up to 32 KiB, headers included, with a message's first fragment, so the
//! signature and the block arrive together, one message per peer. A larger block would
//! delay the signature behind its rendezvous; it moves after the check.
inline constexpr std::size_t mpi_inline_gather_block_max = 32 * 1024 - 128;

//! One direct allgather moved piece by piece (see the file comment). Reused through its
//! owner (mpi_ring_op): no allocation once warm.
class mpi_gather_pieces {
 public:
  //! True when a direct allgather of `block` bytes per rank goes by pieces, given that
  //! some rank isolates its buffers (the file comment).
  static bool wanted(std::size_t block) { return block > 2 * mpi_gather_piece_bytes; }
  //! True when a checked allgather's block of `bytes` travels inside the signature message.
  static bool inline_first(std::size_t bytes) { return bytes > 0 && bytes <= mpi_inline_gather_block_max; }

  //! Prepares the exchange of `block` bytes from `in` into P blocks of `out` (this
  //! rank's block is the caller's to copy) for rank r of P under `tag`. No MPI call.
  //! `isolate`: pieces are received into the scratch slots and copied out; else
  //! straight into `out` (MPI may then write there after a failure, as isolate_buffers says).
  void reset(const std::byte* in, std::byte* out, std::size_t block, int r, int P, int tag, bool isolate) {
    in_ = in;
    out_ = out;
    block_ = block;
    r_ = r;
    P_ = P;
    tag_ = tag;
    isolate_ = isolate;
    pieces_ = pieces_of(block);
    const auto m = static_cast<std::size_t>(P - 1), slots = m * static_cast<std::size_t>(mpi_gather_depth);
    rq_.assign(2 * slots, MPI_REQUEST_NULL);
    piece_of_.assign(slots, -1);
    idx_.resize(2 * slots);
    next_recv_.assign(m, 0);
    next_send_.assign(m, 0);
    left_ = 2 * (P - 1) * pieces_;
    posted_ = false;
    if (isolate_ && scratch_.size() < slots * mpi_gather_piece_bytes) scratch_.resize(slots * mpi_gather_piece_bytes);
  }

  //! The pieces a block of `bytes` travels in.
  static int pieces_of(std::size_t bytes) {
    return static_cast<int>((bytes + mpi_gather_piece_bytes - 1) / mpi_gather_piece_bytes);
  }

  //! Posts the first receives and sends; then moves on as far as completed requests
  //! allow (copying arrived pieces out, posting the next ones). True once every piece
  //! was received (and copied out) and every send completed. Throws what s.check throws.
  template <class State>
  bool advance(State& s, const char* what) {
    const int m = P_ - 1, slots = m * mpi_gather_depth;
    if (!posted_) {
      posted_ = true;  // from here on give_up() must abandon the receives
      for (int i = 0; i < m; ++i)
        for (int d = 0; d < mpi_gather_depth; ++d) {
          post_recv(s, i, i * mpi_gather_depth + d, what);
          post_send(s, i, slots + i * mpi_gather_depth + d, what);
        }
    }
    while (left_ > 0) {
      int count = 0;
      s.check(MPI_Testsome(2 * slots, rq_.data(), &count, idx_.data(), MPI_STATUSES_IGNORE), "MPI_Testsome", what);
      if (count == MPI_UNDEFINED || count == 0) return false;
      for (int j = 0; j < count; ++j) {
        const int k = idx_[static_cast<std::size_t>(j)];
        --left_;
        if (k >= slots) post_send(s, (k - slots) / mpi_gather_depth, k, what);
        else take(s, k, what);
      }
    }
    posted_ = false;
    return true;
  }

  //! Hands the receives still in flight to the state (they may still write into the
  //! scratch, or into `out` when not isolated, which the owner then leaks) and frees
  //! the sends (they only read).
  template <class State>
  void give_up(State& s) noexcept {
    const std::size_t slots = rq_.size() / 2;
    for (std::size_t k = 0; k < rq_.size(); ++k) {
      if (k < slots) s.abandon(rq_[k]);
      else if (rq_[k] != MPI_REQUEST_NULL) MPI_Request_free(&rq_[k]);
    }
    posted_ = false;
  }

 private:
  int peer(int i) const { return (r_ + 1 + i) % P_; }
  std::size_t offset(int p) const { return static_cast<std::size_t>(p) * mpi_gather_piece_bytes; }
  std::size_t length(int p) const { return std::min(mpi_gather_piece_bytes, block_ - offset(p)); }

  // Posts peer i's next receive into slot k, if a piece is left.
  template <class State>
  void post_recv(State& s, int i, int k, const char* what) {
    const int p = next_recv_[static_cast<std::size_t>(i)];
    piece_of_[static_cast<std::size_t>(k)] = -1;
    if (p >= pieces_) return;
    next_recv_[static_cast<std::size_t>(i)] = p + 1;
    piece_of_[static_cast<std::size_t>(k)] = p;
    std::byte* into = isolate_ ? scratch_.data() + static_cast<std::size_t>(k) * mpi_gather_piece_bytes
                               : out_ + block_ * static_cast<std::size_t>(peer(i)) + offset(p);
    s.check(MPI_Irecv(into, static_cast<int>(length(p)), MPI_BYTE, peer(i), tag_, s.native(),
                      &rq_[static_cast<std::size_t>(k)]),
            "MPI_Irecv", what);
  }
  // Posts the next piece of this rank's block to peer i as request k, if one is left.
  template <class State>
  void post_send(State& s, int i, int k, const char* what) {
    const int p = next_send_[static_cast<std::size_t>(i)];
    if (p >= pieces_) return;
    next_send_[static_cast<std::size_t>(i)] = p + 1;
    s.check(MPI_Isend(in_ + offset(p), static_cast<int>(length(p)), MPI_BYTE, peer(i), tag_, s.native(),
                      &rq_[static_cast<std::size_t>(k)]),
            "MPI_Isend", what);
  }

  // Copies the piece in receive slot k out (isolated) and posts the slot's next receive.
  template <class State>
  void take(State& s, int k, const char* what) {
    const int p = piece_of_[static_cast<std::size_t>(k)];
    if (isolate_)
      std::memcpy(out_ + block_ * static_cast<std::size_t>(peer(k / mpi_gather_depth)) + offset(p),
                  scratch_.data() + static_cast<std::size_t>(k) * mpi_gather_piece_bytes, length(p));
    post_recv(s, k / mpi_gather_depth, k, what);
  }

  const std::byte* in_ = nullptr;
  std::byte* out_ = nullptr;
  std::size_t block_ = 0;
  int r_ = 0, P_ = 1, tag_ = 0, pieces_ = 0, left_ = 0;
  bool posted_ = false, isolate_ = true;
  std::vector<MPI_Request> rq_;  // receive slots (peer-major), then as many send slots
  std::vector<int> piece_of_;    // the piece a receive slot holds
  std::vector<int> idx_;
  std::vector<int> next_recv_, next_send_;  // per peer: the next piece to post
  std::vector<std::byte> scratch_;          // isolated: one piece per receive slot
};

}  // namespace commpact::detail
