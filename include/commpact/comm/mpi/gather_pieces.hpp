// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file mpi/gather_pieces.hpp
//! The isolated direct allgather of large blocks, received in cache-sized pieces.
//! With isolate_buffers (the default) MPI may receive only into internal memory, and
//! each block is copied out of it once it arrived. Received whole, a block of 16 MiB
//! lands in 16 MiB of scratch that has left the cache by the time it is copied, so the
//! copy costs a pass over memory: at P = 4 on shared memory the isolated allgather
//! measured 1.3-1.4x raw MPI_Allgather from 4 MiB, against 0.9-1.0x received straight
//! into the output (docs/communicators.md, "At -O2"). Here every block travels as
//! pieces of mpi_gather_piece_bytes; each peer has mpi_gather_depth slots of scratch (a
//! few hundred KiB in all, which stay in cache), and a piece is copied out of its slot
//! as soon as it arrived, then the slot takes the peer's next piece. Each rank keeps
//! mpi_gather_depth sends per peer in flight, so it never floods a receiver with pieces
//! it has no slot for (OpenMPI would buffer their first fragments, one more copy).
//!
//! MPI matches messages of one sender, tag and communicator in the order they were
//! posted, so piece j of a block always meets the j-th receive posted for that peer:
//! both sides post pieces in ascending order, whatever order their requests complete
//! in. Receives target the scratch slots only; a give-up leaves them to the state and
//! the scratch to its owner, which leaks it (mpi_ring_op).
//!
//! Held (MpiComm's checked allgather, mpi_state::verify_direct): the object starts
//! before the signatures are judged, under the check's own tag. It sends this rank's
//! pieces and posts receives for each peer's first pieces as if the peer's block equals
//! ours, each for a whole slot so that no piece can be truncated; arrived pieces wait in
//! their slots. peer_sends() then says what a peer really sends: receives for messages
//! it will not send are cancelled, and a disagreeing peer's messages are received and
//! dropped. release() (the check passed) copies the held pieces out and goes on as
//! above; drop() (it failed) drops everything still to come. Part of MpiComm (include
//! commpact/comm/mpi_comm.hpp).

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
//! A held gather's block of at most this many bytes travels inside its signature
//! message (mpi_state::verify_direct): OpenMPI's shared-memory transport (vader) sends
//! up to 32 KiB, headers included, with a message's first fragment, so the signature
//! and the block arrive together, one message per peer. A larger block's first piece
//! would delay the signature behind its rendezvous; it goes apart, as piece 0.
inline constexpr std::size_t mpi_inline_gather_block_max = 32 * 1024 - 128;

//! One isolated direct allgather moved piece by piece (see the file comment). Reused
//! through its owner (mpi_ring_op): no allocation once warm.
class mpi_gather_pieces {
 public:
  //! True when an isolated direct allgather of `block` bytes per rank goes by pieces.
  static bool wanted(std::size_t block) { return block > 2 * mpi_gather_piece_bytes; }

  //! Prepares the exchange of `block` bytes from `in` into P blocks of `out` (this
  //! rank's block is the caller's to copy) for rank r of P under `tag`. No MPI call.
  //! `held`: MpiComm's checked allgather, started before the signatures are judged
  //! (see peer_sends); a block of at most mpi_inline_gather_block_max bytes then travels
  //! inside the signature message and this object only holds it. Otherwise every peer
  //! sends exactly this rank's pieces.
  //! `isolate` false (held only): once the check passed, pieces are received straight
  //! into `out` (MPI may then write there after a failure, as isolate_buffers says).
  void reset(const std::byte* in, std::byte* out, std::size_t block, int r, int P, int tag, bool held = false,
             bool isolate = true) {
    in_ = in;
    out_ = out;
    block_ = block;
    r_ = r;
    P_ = P;
    tag_ = tag;
    held_ = held;
    isolate_ = isolate || !held;
    first_ = held && inline_first(block) ? 1 : 0;
    pieces_ = pieces_of(block);
    const auto m = static_cast<std::size_t>(P - 1), slots = m * static_cast<std::size_t>(mpi_gather_depth);
    rq_.assign(2 * slots, MPI_REQUEST_NULL);
    piece_of_.assign(2 * slots, -1);
    arrived_.assign(slots, 0);
    direct_.assign(slots, 0);
    idx_.resize(2 * slots);
    next_recv_.assign(m, first_);
    next_send_.assign(m, first_);
    expect_.assign(m, pieces_);
    drain_.assign(m, 0);
    left_ = 2 * (P - 1) * moved(pieces_);
    cancels_ = 0;
    posted_ = false;
  }

  //! The pieces a block of `bytes` travels in.
  static int pieces_of(std::size_t bytes) {
    return static_cast<int>((bytes + mpi_gather_piece_bytes - 1) / mpi_gather_piece_bytes);
  }
  //! Held: true when a block of `bytes` travels inside the signature message.
  static bool inline_first(std::size_t bytes) { return bytes > 0 && bytes <= mpi_inline_gather_block_max; }
  //! Held: the messages a block of `bytes` sends after the signature message.
  static int messages_of(std::size_t bytes) { return pieces_of(bytes) - (inline_first(bytes) ? 1 : 0); }
  //! Held: this rank's block came inside the signature messages (the peers' likewise,
  //! if the check passes).
  bool first_inline() const { return first_ == 1; }

  //! Held: peer q's signature arrived. It sends `msgs` messages after its signature
  //! message (messages_of; 0: it makes no allgather, an invalid one or an empty one);
  //! `keep`: its blocks are ours to take if the check passes (its signature equals
  //! ours, so its pieces are ours in layout), else they are received and dropped, only
  //! counted. Receives posted for messages it will not send are cancelled (nothing else
  //! can match them: the tag is this collective's own).
  template <class State>
  void peer_sends(State& s, int q, int msgs, bool keep, const char* what) {
    const int i = (q - r_ - 1 + 2 * P_) % P_;
    const auto u = static_cast<std::size_t>(i);
    const int pieces = first_ + msgs;  // in this rank's numbering of the receives
    if (!keep) drain_[u] = 1;
    left_ += moved(pieces) - moved(expect_[u]);
    expect_[u] = pieces;
    next_recv_[u] = std::max(first_, std::min(next_recv_[u], pieces));
    for (int d = 0; d < mpi_gather_depth; ++d) {
      const int k = i * mpi_gather_depth + d;
      const auto uk = static_cast<std::size_t>(k);
      if (rq_[uk] != MPI_REQUEST_NULL && piece_of_[uk] >= pieces) {
        s.check(MPI_Cancel(&rq_[uk]), "MPI_Cancel", what);
        piece_of_[uk] = cancelled;  // completes in advance(), which then ignores it
        ++cancels_;
      } else if (drain_[u] && arrived_[uk]) {
        arrived_[uk] = 0;  // held, now dropped
        post_recv(s, i, k, what);
      } else if (posted_ && rq_[uk] == MPI_REQUEST_NULL && !arrived_[uk] && piece_of_[uk] != cancelled) {
        post_recv(s, i, k, what);  // a peer that sends more than we expected
      }
    }
  }
  //! Held, the check passed: copies the pieces that arrived into `out` and moves on.
  template <class State>
  void release(State& s, const char* what) {
    held_ = false;
    for (int k = 0; k < static_cast<int>(arrived_.size()); ++k)
      if (arrived_[static_cast<std::size_t>(k)]) {
        arrived_[static_cast<std::size_t>(k)] = 0;
        take(s, k, what);
      }
  }
  //! Held, the check failed: every piece still to come is received and dropped.
  template <class State>
  void drop(State& s, const char* what) {
    held_ = false;
    std::fill(drain_.begin(), drain_.end(), char{1});
    for (int k = 0; k < static_cast<int>(arrived_.size()); ++k)
      if (arrived_[static_cast<std::size_t>(k)]) {
        arrived_[static_cast<std::size_t>(k)] = 0;
        post_recv(s, k / mpi_gather_depth, k, what);
      }
  }

  //! Posts the first receives and sends; then moves on as far as completed requests
  //! allow (copying arrived pieces out, posting the next ones). True once every piece
  //! was received and copied out (or dropped), every send completed and, held, the
  //! check was decided (release or drop). Throws what s.check throws.
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
    while (left_ > 0 || cancels_ > 0) {
      int count = 0;
      s.check(MPI_Testsome(2 * slots, rq_.data(), &count, idx_.data(), MPI_STATUSES_IGNORE), "MPI_Testsome", what);
      if (count == MPI_UNDEFINED || count == 0) return false;
      for (int j = 0; j < count; ++j) {
        const int k = idx_[static_cast<std::size_t>(j)];
        const auto uk = static_cast<std::size_t>(k);
        const int i = (k < slots ? k : k - slots) / mpi_gather_depth;  // the peer's slot index
        if (k >= slots) {
          --left_;
          post_send(s, i, k, what);
        } else if (piece_of_[uk] == cancelled) {
          piece_of_[uk] = -1;
          --cancels_;
        } else {
          --left_;
          if (drain_[static_cast<std::size_t>(i)]) post_recv(s, i, k, what);
          else if (held_) arrived_[uk] = 1;
          else take(s, k, what);
        }
      }
    }
    if (held_) return false;
    posted_ = false;
    return true;
  }

  //! Hands the receives still in flight to the state (they may still write into the
  //! scratch, which the owner then leaks) and frees the sends (they only read).
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
    if (p >= expect_[static_cast<std::size_t>(i)]) return;
    next_recv_[static_cast<std::size_t>(i)] = p + 1;
    piece_of_[static_cast<std::size_t>(k)] = p;
    // Held or dropped, a peer's pieces may differ from ours in length: receive up to a
    // whole slot (no piece is longer), so that no receive can be truncated.
    const bool exact = !held_ && !drain_[static_cast<std::size_t>(i)];
    // Not isolated, a held gather whose check passed receives straight into `out`.
    direct_[static_cast<std::size_t>(k)] = exact && !isolate_;
    // The slots are allocated whole, before any receive targets them: a held gather of
    // blocks that travel inside the signature messages never needs them.
    if (const std::size_t whole = arrived_.size() * mpi_gather_piece_bytes;  // one piece per slot
        !direct_[static_cast<std::size_t>(k)] && scratch_.size() < whole)
      scratch_.resize(whole);
    std::byte* into = direct_[static_cast<std::size_t>(k)]
                          ? out_ + block_ * static_cast<std::size_t>(peer(i)) + offset(p)
                          : scratch_.data() + static_cast<std::size_t>(k) * mpi_gather_piece_bytes;
    s.check(MPI_Irecv(into, static_cast<int>(exact ? length(p) : mpi_gather_piece_bytes), MPI_BYTE, peer(i), tag_,
                      s.native(), &rq_[static_cast<std::size_t>(k)]),
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

  // Copies the piece in receive slot k out and posts the slot's next receive.
  template <class State>
  void take(State& s, int k, const char* what) {
    const int p = piece_of_[static_cast<std::size_t>(k)];
    if (!direct_[static_cast<std::size_t>(k)])
      std::memcpy(out_ + block_ * static_cast<std::size_t>(peer(k / mpi_gather_depth)) + offset(p),
                  scratch_.data() + static_cast<std::size_t>(k) * mpi_gather_piece_bytes, length(p));
    post_recv(s, k / mpi_gather_depth, k, what);
  }

  static constexpr int cancelled = -2;  // piece_of_: a cancelled receive, not yet completed
  // The pieces of a block of `pieces` this object moves (held: the first travels apart).
  int moved(int pieces) const { return std::max(0, pieces - first_); }

  const std::byte* in_ = nullptr;
  std::byte* out_ = nullptr;
  std::size_t block_ = 0;
  int r_ = 0, P_ = 1, tag_ = 0, pieces_ = 0, left_ = 0, cancels_ = 0, first_ = 0;
  bool posted_ = false, held_ = false, isolate_ = true;
  std::vector<char> direct_;     // a receive slot's request receives into `out` (not isolated)
  std::vector<char> arrived_;    // held: a receive slot holds its piece until release()
  std::vector<int> expect_;      // per peer: the pieces it sends (held: ours until its signature says)
  std::vector<char> drain_;      // per peer: its pieces are received and dropped
  std::vector<MPI_Request> rq_;  // receive slots (peer-major), then as many send slots
  std::vector<int> piece_of_;    // the piece a receive slot holds
  std::vector<int> idx_;
  std::vector<int> next_recv_, next_send_;  // per peer: the next piece to post
  std::vector<std::byte> scratch_;          // one piece per receive slot (allocated by post_recv)
};

}  // namespace commpact::detail
