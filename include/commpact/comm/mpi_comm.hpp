// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file mpi_comm.hpp
//! MpiComm: a commpact::PointToPoint communicator over an MPI communicator (OpenMPI),
//! with the operations and semantics of ThreadComm, plus nonblocking forms.
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
//! The implementation is split by concern under comm/mpi/: datatype.hpp (element types,
//! MPI error text), failure.hpp (the failure-notice channel), point_to_point.hpp (the
//! send pool and receives), small_collectives.hpp (the latency path), options.hpp
//! (mpi_options), state.hpp (the shared state, the wait and the built-in signature check)
//! and request.hpp (nonblocking handles). This file (over 450 lines on purpose) is the
//! contract below and MpiComm itself: one class, its operations and their argument checks.
//!
//! - Isolation: the constructor duplicates the communicator twice (MPI_Comm_idup): one
//!   duplicate carries commpact's traffic, the other only failure notices. Both use
//!   MPI_ERRORS_RETURN; every MPI error becomes a commpact::comm_error naming the call.
//! - Never hang: every wait is a nonblocking MPI operation progressed with MPI_Test: a
//!   tight loop first (no clock, no other call), then the deadline and the failure
//!   channel every 16th test, yielding after 10 ms and sleeping 50 us between tests
//!   after a second (a late peer rather than slow data). A wait that passes
//!   `mpi_options::timeout` (construction's: the larger of it and `setup_timeout`)
//!   raises timeout_error and tells the other ranks; a notice from
//!   another rank raises peer_failure carrying its reason. After a failure every further
//!   operation raises at once. No message is sent for this unless a rank fails.
//! - Agreement: with `mpi_options::verify_collectives` (the default) every collective
//!   starts with an exchange of its signature (comm/signature.hpp, the rule CheckedComm<C>
//!   also uses; up to 8 ranks a direct exchange, one round, above a recursive doubling):
//!   ranks that disagree all raise mismatch_error (a bad argument on one rank:
//!   invalid_argument on all) before any data reaches user memory, and the communicator
//!   stays usable. Up to 8 ranks an allgather's blocks of up to 32 KiB travel inside the
//!   signature message into internal memory (a held gather, mpi/state.hpp verify_direct)
//!   and are copied out only once the check passed; larger blocks move after the check,
//!   by pieces when any rank isolates its buffers (the check tells every rank). With it
//!   off (the unchecked mode) a disagreement is undefined behaviour, as in MPI and NCCL.
//! - Shared memory: where every rank runs on one node, checked allreduces and allgathers
//!   (up to mpi_options::shared_memory_max bytes per rank, 64 MiB by default) move
//!   through POSIX shared memory (mpi/shared_memory.hpp): each rank copies its data into
//!   a segment of its own before the check, and after it reads its peers' segments with
//!   its own CPU (an allreduce folds its chunk of every segment, a second check round,
//!   then copies every chunk out). MPI never writes into user memory, each byte is copied
//!   twice, and the call completes before it returns (the nonblocking forms return a
//!   completed handle). At -O2 on 2 vCPUs: 0.31-1.03x a raw MPI_Allgather at P = 2 and
//!   4, and 0.41-1.14x a raw MPI_Allreduce from 64 KiB except at 1 MiB, P = 4 (1.57x;
//!   the ring: 1.16x) (docs/communicators.md, "Shared memory: the default on one node").
//!   Otherwise (ranks on several nodes, shared_memory_max = 0, unchecked), the paths below.
//! - Latency path: allreduces, broadcasts and allgathers up to 64 KiB, and
//!   the signature check run over point-to-point messages (mpi/small_collectives.hpp),
//!   as fast as OpenMPI's blocking collectives. Larger allreduces run a ring and larger
//!   allgathers a direct exchange over point to point, both advanced by every wait
//!   (mpi/ring_allreduce.hpp; isolated blocks above 128 KiB move in cache-sized pieces,
//!   mpi/gather_pieces.hpp); larger broadcasts use MPI_Ibcast (libnbc).
//! - One path per size: a blocking collective runs exactly what its nonblocking form
//!   then wait() runs, so ranks may mix the forms (as on ThreadComm). On shared memory,
//!   and up to 64 KiB, the nonblocking form completes before it returns; a ring advances in every wait of the
//!   communicator, so rings in flight complete in any wait order.
//! - Identical results: the recursive doubling combines op(lower rank, higher rank) on
//!   both partners (one vectorised fold, mpi/combine.hpp); the ring, and OpenMPI's
//!   nonblocking algorithms, and the shared-memory allreduce compute each
//!   element's final value on one rank and copy it, so every rank gets the same bits
//!   (tests check it).
//! - Memory safety after a failure: with `mpi_options::isolate_buffers` (the default)
//!   operations write into pooled staging memory copied out on success, so an operation
//!   abandoned after a failure (MPI cannot cancel collectives) never writes into user
//!   memory later. The shared-memory path needs no staging for it: only this rank's own
//!   copies write there, after the checks passed.
//! - Point to point: send() copies the message into a pooled buffer and returns;
//!   recv() receives a message of any length (MPI_Improbe + MPI_Imrecv) into a pooled
//!   buffer swapped into the caller's vector (no copy). sendrecv() sends without a copy
//!   and, like MPI_Sendrecv, returns once the peer has taken the message. isend()/irecv()
//!   move messages of a size both sides know, without a copy on the sending side.
//! - Handles are cheap to copy (shared state); use one handle per thread
//!   (MPI_THREAD_FUNNELED suffices).

#include <mpi.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "../concepts.hpp"
#include "guard.hpp"
#include "../error.hpp"
#include "mpi/datatype.hpp"
#include "mpi/point_to_point.hpp"
#include "mpi/request.hpp"
#include "mpi/small_collectives.hpp"
#include "mpi/state.hpp"
#include "blocking.hpp"
#include "signature.hpp"

namespace commpact {

//! One rank's handle on an MPI communicator; see the file comment. Cheap to copy: all
//! copies share one duplicated communicator and one failure state.
class MpiComm : public detail::blocking_collectives<MpiComm> {
 public:
  using request = mpi_request;

  //! Duplicates `comm` (collective over `comm`: every rank must construct its MpiComm
  //! in the same order). Requires MPI to be initialized.
  explicit MpiComm(MPI_Comm comm, mpi_options opt = {}) : state_(std::make_shared<detail::mpi_state>(comm, opt)) {}

  int rank() const { return state_->rank(); }
  int size() const { return state_->size(); }
  const mpi_options& options() const { return state_->options(); }
  //! How long one wait may last (mpi_options::timeout): the deadline of a fence on its work.
  std::chrono::milliseconds timeout() const { return state_->options().timeout; }
  //! True when this communicator checks collective signatures itself (verify_collectives).
  bool checks_collectives() const { return state_->options().verify_collectives; }
  //! True when MPI runs at MPI_THREAD_SERIALIZED or above: a second thread may then make
  //! this communicator's calls while the first makes none (Bucketed overlap needs it).
  static bool allows_calls_from_other_threads() {
    int provided = MPI_THREAD_SINGLE;
    MPI_Query_thread(&provided);
    return provided >= MPI_THREAD_SERIALIZED;
  }
  //! The duplicated communicator commpact's traffic runs on (for interoperation only).
  MPI_Comm native() const { return state_->native(); }
  //! True once this rank knows the group failed (abort, timeout, MPI error, notice).
  bool failed() const { return state_->failed(); }
  //! Why the group failed (empty while it has not).
  const std::string& failure() const { return state_->failure(); }
  //! Bytes per rank the shared-memory path holds now (mpi_options::shared_memory_max;
  //! 0 before its first collective, or where it is unavailable).
  std::size_t shared_memory_bytes() const { return state_->shm_capacity(); }
  //! Why the shared-memory path was given up for some sizes (empty while it was not):
  //! /dev/shm too small, or ranks on different nodes. Those sizes take point to point.
  const std::string& shared_memory_note() const { return state_->shm_note(); }

  // allreduce, allgather and broadcast (blocking): blocking_collectives, comm/blocking.hpp.

  //! Nonblocking in-place element-wise reduction over all ranks, bit-identical on every
  //! rank (allreduce(data, op) is this and wait(), so ranks may mix the two forms). T:
  //! float, double, or a 32- or 64-bit integer; `data` must stay alive until the handle completed. With
  //! verify_collectives the signature check runs before this returns (one round trip).
  //! Checked, on one node, up to shared_memory_max bytes: shared memory, complete when
  //! this returns (mpi/shared_memory.hpp). Otherwise the path depends on the size only,
  //! the same as allreduce's: up to 64 KiB the
  //! recursive doubling runs before this returns (the check already waited for every
  //! rank; the handle is complete); above, a ring (mpi/ring_allreduce.hpp) that every
  //! wait of this communicator advances; where one ring step would pass MPI's int count,
  //! MPI_Iallreduce.
  template <class T>
    requires std::is_arithmetic_v<T>
  mpi_request iallreduce(std::span<T> data, reduce_op op = reduce_op::sum) {
    static_assert(detail::mpi_reducible<T>,
                  "commpact::MpiComm::allreduce supports float, double and 32- or 64-bit integers; convert other "
                  "element types first.");
    auto& s = *state_;
    s.enter("allreduce");
    const auto path =
        detail::allreduce_path_for(data.size_bytes(), sizeof(T), size(), detail::mpi_rd_allreduce_bytes);
    const auto sig = allreduce_signature(data, op);
    const auto bad = allreduce_error(data, op);
    if (s.shm_wanted(data.size_bytes())) {
      // Shared memory (mpi/shared_memory.hpp): stage, check, fold, check, copy out.
      const auto mine = std::as_bytes(data);
      const auto [own_lo, own_hi] = s.shm_own_chunk(data.size(), sizeof(T));  // read by this rank only
      const bool staged = bad.empty() && s.shm_stage(mine, own_lo, own_hi);
      auto shm_sig = sig;
      shm_sig.shared_memory = true;  // a rank that chose the other path fails the check alike
      s.verify(shm_sig, bad);
      if (s.shm_ready(mine, staged, "allreduce", own_lo, own_hi)) {
        s.shm_allreduce(data, op, shm_sig);
        return {};
      }
    } else if (!verified(sig, bad)) {
      return {};
    }
    // Small: recursive doubling (mpi/small_collectives.hpp), with the latency of a
    // blocking MPI_Allreduce; large: a ring (mpi/ring_allreduce.hpp). Both run over
    // point to point and receive only into internal memory when buffers are isolated.
    if (path == detail::mpi_allreduce_path::small) {
      s.small_allreduce(data, op, "allreduce");
      return {};
    }
    mpi_request r(state_, "allreduce", true);
    if (path == detail::mpi_allreduce_path::ring) {
      r.ring_ = s.start_ring(data, op, "allreduce");
      return r;
    }
    const MPI_Op mop = op == reduce_op::sum ? MPI_SUM : op == reduce_op::min ? MPI_MIN : MPI_MAX;
    // Isolated: MPI reads `data` and writes staging (out of place, which also lets
    // OpenMPI pick its bandwidth-optimal algorithms). Otherwise in place on `data`.
    const void* src = MPI_IN_PLACE;
    void* dst = data.data();
    if (s.options().isolate_buffers) {
      r.stage_ = s.take_buffer(data.size_bytes());
      r.out_ = data.data();
      r.out_bytes_ = data.size_bytes();
      src = data.data();
      dst = r.stage_.data();
    }
    r.started(MPI_Iallreduce(src, dst, static_cast<int>(data.size()), detail::mpi_reduce_type<T>(), mop, s.native(),
                           &r.req_), "MPI_Iallreduce");
    return r;
  }

  //! Nonblocking allgather of every rank's `in` (all the same size) into `out` in rank
  //! order (allgather(in, out) is this and wait()), see iallreduce. Checked, on one node,
  //! blocks up to shared_memory_max bytes: shared memory, complete when this returns.
  //! Otherwise an output of up to 64 KiB is exchanged
  //! directly over point to point before this returns; a larger one is a direct
  //! exchange too, advanced by every wait of this communicator like a ring
  //! (mpi/ring_allreduce.hpp), each block copied out as it arrives.
  template <class T>
    requires std::is_trivially_copyable_v<T>
  mpi_request iallgather(std::span<const T> in, std::span<T> out) {
    auto& s = *state_;
    s.enter("allgather");
    if (s.shm_wanted(in.size_bytes())) {
      // Shared memory (mpi/shared_memory.hpp): stage, check, copy every peer's block out.
      const auto bad = allgather_error(in, out);
      const auto mine = std::as_bytes(in);
      const bool staged = bad.empty() && s.shm_stage(mine);
      auto shm_sig = allgather_signature(in);
      shm_sig.shared_memory = true;  // a rank that chose the other path fails the check alike
      s.verify(shm_sig, bad);
      if (s.shm_ready(mine, staged, "allgather")) {
        s.shm_allgather(mine, std::as_writable_bytes(out));
        return {};
      }
    } else if (s.options().verify_collectives && s.direct_checks() &&
               detail::mpi_gather_pieces::inline_first(in.size_bytes())) {
      return held_allgather(in, out);
    } else if (!verified(allgather_signature(in), allgather_error(in, out))) {
      return {};
    }
    if (out.size_bytes() <= detail::mpi_small_collective_bytes) {
      s.small_allgather(std::as_bytes(in), std::as_writable_bytes(out));
      return {};
    }
    mpi_request r(state_, "allgather", true);
    r.ring_ = s.start_direct_gather(std::as_bytes(in), std::as_writable_bytes(out));
    return r;
  }

  //! Nonblocking copy of root's data to every rank (broadcast(data, root) is this and
  //! wait()), see iallreduce: up to 64 KiB a binomial tree over point to
  //! point before this returns; larger, MPI_Ibcast.
  template <class T>
    requires std::is_trivially_copyable_v<T>
  mpi_request ibroadcast(std::span<T> data, int root) {
    auto& s = *state_;
    s.enter("broadcast");
    if (!verified(broadcast_signature(data, root), broadcast_error(data, root))) return {};
    if (data.size_bytes() <= detail::mpi_small_collective_bytes) {
      s.small_broadcast(std::as_writable_bytes(data), root);
      return {};
    }
    mpi_request r(state_, "broadcast", true);
    void* buf = data.data();  // the root's buffer is only read
    if (s.options().isolate_buffers && rank() != root) {
      r.stage_ = s.take_buffer(data.size_bytes());
      r.out_ = data.data();
      r.out_bytes_ = data.size_bytes();
      buf = r.stage_.data();
    }
    r.started(MPI_Ibcast(buf, static_cast<int>(data.size_bytes()), MPI_BYTE, root, s.native(), &r.req_),
              "MPI_Ibcast");
    return r;
  }

  //! Returns when every rank has entered barrier(). Queued sends are progressed, not
  //! awaited: like ThreadComm, a send never waits for its receiver (use flush()).
  void barrier() {
    auto& s = *state_;
    s.enter("barrier");
    if (s.options().verify_collectives) {
      s.verify({detail::coll_kind_sig::barrier, 0, 0, 0}, {});  // the signature allreduce is the barrier
      return;
    }
    MPI_Request req = MPI_REQUEST_NULL;
    s.check(MPI_Ibarrier(s.native(), &req), "MPI_Ibarrier", "barrier");
    s.wait(req, "barrier");
  }

  //! Sends a copy of msg to peer; does not wait for the receiver.
  void send(int peer, std::span<const std::byte> msg) {
    check_message(peer, msg.size(), "send");
    auto& s = *state_;
    s.enter("send");
    auto buf = s.sends().copy_of(msg);
    MPI_Request req = MPI_REQUEST_NULL;
    s.check(MPI_Isend(buf.data(), static_cast<int>(buf.size()), MPI_BYTE, peer, detail::mpi_send_queue::tag,
                      s.native(), &req),
            "MPI_Isend", "send");
    s.sends().push(req, std::move(buf));
  }

  //! Receives the next message from peer into buf (resized to the message length).
  void recv(int peer, std::vector<std::byte>& buf) {
    check_peer(peer, "recv");
    state_->enter("recv");
    detail::mpi_recv_any(*state_, peer, buf);
  }

  //! Pairwise exchange: sends msg to peer and receives peer's message into buf. Like
  //! MPI_Sendrecv, and unlike send() then recv(), msg goes out without a copy and the
  //! call returns once peer's message arrived and peer has taken msg: peer must receive
  //! from this rank (recv, sendrecv or irecv) without first waiting for this rank to do
  //! something else, or the exchange ends at the deadline (timeout_error).
  void sendrecv(int peer, std::span<const std::byte> msg, std::vector<std::byte>& buf) {
    check_message(peer, msg.size(), "sendrecv");
    auto& s = *state_;
    s.enter("sendrecv");
    detail::mpi_sendrecv(s, peer, msg, buf);
  }

  //! Nonblocking send of msg to peer, without a copy: msg must stay alive and unchanged
  //! until the handle completed. Matches the peer's recv() or irecv() in order with send().
  mpi_request isend(int peer, std::span<const std::byte> msg) {
    check_message(peer, msg.size(), "isend");
    auto& s = *state_;
    s.enter("isend");
    mpi_request r(state_, "isend", false);
    r.peer_ = peer;
    r.started(MPI_Isend(msg.data(), static_cast<int>(msg.size()), MPI_BYTE, peer, detail::mpi_send_queue::tag,
                      s.native(), &r.req_), "MPI_Isend");
    return r;
  }

  //! Nonblocking receive of the next message from peer, which must be exactly buf.size()
  //! bytes (a longer one raises comm_error, a shorter one mismatch_error, and the
  //! communicator fails on every rank: the two sides disagree about the protocol).
  mpi_request irecv(int peer, std::span<std::byte> buf) {
    check_message(peer, buf.size(), "irecv");
    auto& s = *state_;
    s.enter("irecv");
    mpi_request r(state_, "irecv", false);
    r.peer_ = peer;
    r.expect_bytes_ = static_cast<long long>(buf.size());
    void* dst = buf.data();
    if (s.options().isolate_buffers && !buf.empty()) {
      r.stage_ = s.take_buffer(buf.size());
      r.out_ = buf.data();
      r.out_bytes_ = buf.size();
      dst = r.stage_.data();
    }
    r.started(MPI_Irecv(dst, static_cast<int>(buf.size()), MPI_BYTE, peer, detail::mpi_send_queue::tag, s.native(),
                      &r.req_), "MPI_Irecv");
    return r;
  }

  //! Waits until every message queued by send() has been delivered.
  void flush() {
    state_->enter("flush");
    state_->flush();
  }

  //! Sends queued by send() and not yet known to be delivered.
  std::size_t pending_sends() const { return state_->sends().size(); }

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
  void check_message(int peer, std::size_t bytes, const char* what) const {
    check_peer(peer, what);
    require(bytes <= static_cast<std::size_t>(INT_MAX), "commpact::MpiComm::", what, ": rank ", rank(),
            " passed a message of ", bytes, " bytes; MPI counts are int, so at most ", INT_MAX,
            " bytes per message: split it (a compressor's message: reduce the gradient in smaller "
            "buckets, Bucketed).");
  }

  template <class T>
  static detail::collective_signature allreduce_signature(std::span<T> data, reduce_op op) {
    return {detail::coll_kind_sig::allreduce, detail::sig_type_code<T>(), static_cast<std::int64_t>(data.size_bytes()),
            static_cast<int>(op)};
  }
  template <class T>
  std::string allreduce_error(std::span<T> data, reduce_op op) const {
    if (op != reduce_op::sum && op != reduce_op::min && op != reduce_op::max)
      return detail::cat("commpact::MpiComm::allreduce: rank ", rank(), " passed reduce_op ", static_cast<int>(op),
                         "; use reduce_op::sum, min or max.");
    if (data.size() > static_cast<std::size_t>(INT_MAX))
      return detail::cat("commpact::MpiComm::allreduce: rank ", rank(), " passed ", data.size(),
                         " elements; MPI counts are int, so at most ", INT_MAX,
                         " per call: split the buffer (inside a compressor: reduce the gradient in smaller buckets, "
                         "Bucketed).");
    return {};
  }

  template <class T>
  static detail::collective_signature allgather_signature(std::span<const T> in) {
    return {detail::coll_kind_sig::allgather, 0, static_cast<std::int64_t>(in.size_bytes()), 0};
  }
  template <class T>
  std::string allgather_error(std::span<const T> in, std::span<T> out) const {
    const int P = size();
    if (out.size() != in.size() * static_cast<std::size_t>(P))
      return detail::cat("commpact::MpiComm::allgather: rank ", rank(), " passed an output of ", out.size(),
                         " elements; it must hold size() * in.size() = ", P, " * ", in.size(), ".");
    if (in.size_bytes() > static_cast<std::size_t>(INT_MAX))
      return detail::cat("commpact::MpiComm::allgather: rank ", rank(), " passed a block of ", in.size_bytes(),
                         " bytes; MPI counts are int, so at most ", INT_MAX,
                         " bytes per block: split the call (inside a compressor: reduce the gradient in smaller "
                         "buckets, Bucketed).");
    return {};
  }
  template <class T>
  static detail::collective_signature broadcast_signature(std::span<T> data, int root) {
    return {detail::coll_kind_sig::broadcast, 0, static_cast<std::int64_t>(data.size_bytes()), root};
  }
  template <class T>
  std::string broadcast_error(std::span<T> data, int root) const {
    if (root < 0 || root >= size())
      return detail::cat("commpact::MpiComm::broadcast: rank ", rank(), " passed root ", root, ", outside [0, ",
                         size(), "); pass the rank that holds the data.");
    if (data.size_bytes() > static_cast<std::size_t>(INT_MAX))
      return detail::cat("commpact::MpiComm::broadcast: rank ", rank(), " passed ", data.size_bytes(),
                         " bytes; MPI counts are int, so at most ", INT_MAX,
                         " bytes per call: split the buffer (inside a compressor: reduce the gradient in smaller "
                         "buckets, Bucketed).");
    return {};
  }

  //! The checked allgather with P <= mpi_direct_check_ranks of a block that fits inside
  //! the signature message (mpi_gather_pieces::inline_first, up to 32 KiB - 128 B): a
  //! held gather. The block travels inside the signature message (one message per peer,
  //! so the check costs no message of its own) into internal memory, and is copied into
  //! `out` once the check passed (even without isolate_buffers); a check that fails
  //! raises alike on every rank with `out` untouched and the communicator usable. It
  //! completes before it returns. A larger block moves after the check (iallgather): a
  //! held gather of pieces sent before the check measured 1.14-1.30x raw MPI_Allgather
  //! from 1 MiB at P = 2 without isolate_buffers, against 1.00-1.11x for the check, then
  //! one message per peer (docs/communicators.md).
  template <class T>
  mpi_request held_allgather(std::span<const T> in, std::span<T> out) {
    auto& s = *state_;
    const auto bad = allgather_error(in, out);
    // A valid call sends its block inside its signature message; an invalid one only its signature.
    s.verify_direct(allgather_signature(in), bad, bad.empty() ? std::as_bytes(in) : std::span<const std::byte>{});
    const std::size_t b = in.size_bytes();  // the check passed: every rank's block came with its signature
    auto* o = reinterpret_cast<std::byte*>(out.data());
    for (int q = 0; q < size(); ++q) {
      const std::byte* from = q == rank() ? reinterpret_cast<const std::byte*>(in.data()) : s.inline_block(q);
      std::memcpy(o + b * static_cast<std::size_t>(q), from, b);
    }
    return {};
  }

  //! Returns false when the collective has nothing to move (all ranks agreed on 0 bytes).
  bool verified(const detail::collective_signature& sig, const std::string& bad) {
    auto& s = *state_;
    if (s.options().verify_collectives) {
      s.verify(sig, bad);
      return sig.bytes != 0;
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
  return comm_guard(comm, std::forward<F>(fn));
}

}  // namespace commpact

// HierarchicalComm over MpiComm (hierarchical_mpi), whatever order the user's includes come in.
#include "hierarchical_mpi.hpp"
