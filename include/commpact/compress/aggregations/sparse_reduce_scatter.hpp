// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file sparse_reduce_scatter.hpp
//! Ok-Topk's aggregation (Li and Hoefler, PPoPP 2022): a sparse allreduce whose bytes per
//! rank stay about 2k (P - 1)/P entries whatever P, over any PointToPoint communicator.
//! `OkTopK<C>` (compressors/oktopk.hpp) is its local phase (error feedback + local top-k)
//! followed by this aggregation.
//!
//! Every rank contributes a sparse set of at most k entries (ascending indices in [0, n)):
//! - sparse reduce-scatter: the index space is cut into P contiguous regions; each rank
//!   sends the entries of region j to rank j, which sums what it receives in rank order;
//! - global selection. On an estimation step (every `period` steps, the first, and after
//!   the regions reset) it is exact: every owner allgathers its k largest |sum| (no region
//!   holds more than k of the global top k), theta = T, their k-th largest, and each
//!   region keeps its sums above T and its share of the ties at T (ties to the smaller
//!   index: regions in order), so the regions together keep the global top-k of the
//!   nonzero sums (all of them when fewer than k are nonzero), as the authors' code does
//!   at its threshold steps. Between estimations each region keeps its sums with |sum| >=
//!   theta (the last estimate), at most cap = ceil(2k / P) (the largest, ties to the
//!   smaller index), so at most about 2k in all;
//! - allgather of the selected entries by a ring of P - 1 point-to-point rounds;
//! - combine: out = 0 except the selected sums' mean_of(sum, P);
//! - when the step selected at least P entries, the regions are rebalanced so that each
//!   held as many of them (`clear_selected`, which also removes the delivered entries
//!   from the residual; after fewer, the bounds stay).
//! The regions and theta are this aggregation's state, kept by `commit()`.
//!
//! This rank's contribution enters in one of two ways, each once per step, after
//! `begin(n, k, step, flags, status)`:
//! - `local_set()`: k index and value slots that a fused local phase fills (the ops row
//!   oktopk_local, OkTopK's path): the local top-k, index-sorted;
//! - `block(capacity)` (the Aggregation concept): float storage for a sparse_wire frame
//!   (wire/sparse_frame.hpp) of at most k entries with n_min = n_max = n, k_min = k_max
//!   = k, no mask, zero padding to capacity (48 + 8k bytes or more); exchange() reads it
//!   (ops row oktopk_begin). A flagged frame (flag_nonfinite, flag_failed) contributes
//!   nothing and flags the step; a malformed one counts as rejected input on every rank.
//!
//! Messages (known-size point-to-point): reduce-scatter: a 40-byte header (u32 magic
//! "CPOK", u32 flags: bit 0 non-finite input, bit 1 rejected input, bit 2 an estimation
//! step, bit 3 on_nonfinite = skip_step; u64 count; i64 n, k, step), then count int32
//! indices (ascending, in the receiver's region) and count float32 values, sent as two messages (the header, then
//! the 8 count bytes of entries when count > 0). Allgather blocks: u32 origin rank, u32 count, count int32 indices (ascending, in
//! the origin's region) and count float32 values, sent as the 8-byte header (a ring of
//! P - 1 rounds) and then the entries (a second ring). Bytes per rank per step: sum over
//! peers j of (40 + 8 c_j) (c_j: this rank's local entries in region j) plus (P - 1) 8 + 8
//! (the selected entries of every region except the next rank's), at most about 8k + 16k
//! (8k + 8k on an estimation step, where k entries are selected): flat in P, where an
//! allgather of top-k sets is (P - 1) 8k; plus the allgather of k floats, (P - 1) 4k, on an
//! estimation step only (the authors' code allgathers every reduced entry there). Every
//! rank reads every peer's header, so a rejected or non-finite input anywhere is seen by
//! every rank alike (`flags()`).
//!
//! Space: the data plane runs in the communicator's space through the oktopk_ rows of
//! ops<Space> (kernels/host/oktopk.hpp). A message's size is known when it is posted (no
//! probe): the entries of a frame follow its header, whose count the host reads at a
//! fence. So exchange() fences twice (after the reduce-scatter's headers, and after the
//! selection and the allgather's headers); combine and clear_selected are queued.
//! exchange() raises, the same on every rank, mismatch_error when ranks disagree on n, k,
//! the step or whether it is an estimation step (another `period`), and wire_error
//! (after aborting the communicator) for a malformed frame.
//! Each all-to-all (headers, entries) and each ring round (send to the next rank, receive
//! from the previous one) is one group of point-to-point calls (known_size.hpp's
//! `grouped`: ncclGroupStart/End on NcclComm, which would otherwise deadlock at P > 1;
//! nothing on the host communicators, whose sends are buffered): the same calls in the
//! same order, so the same bytes and results on every communicator.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../../comm/known_size.hpp"
#include "../../concepts.hpp"
#include "../../detail/check_tag.hpp"
#include "../../error.hpp"
#include "../../kernels/deferred/ops.hpp"
#include "../../kernels/host/oktopk.hpp"
#include "../../kernels/host/ops.hpp"
#include "../../kernels/status.hpp"
#include "../../wire/sparse_frame.hpp"

namespace commpact {

namespace detail {
//! Whether ops<S> has the block path of SparseReduceScatter.
template <class S>
concept has_oktopk_begin = requires(typename S::exec e, typename S::template span<const std::byte> f,
                                    typename S::template span<std::int32_t> i, typename S::template span<float> v,
                                    typename S::template span<std::uint32_t> st) {
  ops<S>::oktopk_begin(e, f, std::int64_t{}, std::int64_t{}, i, v, st);
};
}  // namespace detail

//! Ok-Topk's sparse reduce-scatter, global selection and allgather over C.
template <class C>
class SparseReduceScatter {
  static_assert(diagnose_point_to_point<C>());
  static constexpr std::size_t header = host::oktopk::header_bytes;

 public:
  using comm_type = C;
  using space_type = comm_space_t<C>;
  template <class T>
  using span = typename space_type::template span<T>;
  template <class T>
  using buffer = typename space_type::template buffer<T>;

  //! period: steps between threshold re-estimations (>= 1).
  explicit SparseReduceScatter(C comm, std::int64_t period = 32) : comm_(std::move(comm)), period_(period) {
    require(period >= 1, "commpact::SparseReduceScatter: period = ", period,
            " must be >= 1 (steps between re-estimations of the threshold).");
  }

  //! What one region may select between estimations: ceil(2k / P), at most k.
  static std::size_t region_cap(std::size_t k, int P) {
    return std::min(k, (2 * k + static_cast<std::size_t>(P) - 1) / static_cast<std::size_t>(P));
  }

  //! Whether the compressor skips a non-finite step (on_nonfinite = skip_step): carried in
  //! every reduce-scatter header (flag_skips) and compared, so ranks built otherwise raise
  //! mismatch_error on every rank instead of deciding a non-finite step differently.
  void set_skips_nonfinite(bool skips) { skips_ = skips; }

  //! The tag added to the step in the headers (detail/check_tag.hpp; OkTopK's, set by Bucketed).
  void set_check_tag(std::uint32_t tag) { check_tag_ = detail::checked_tag(tag); }
  std::uint32_t check_tag() const { return check_tag_; }

  //! Starts a step over n entries, of which every rank contributes at most k (the same n,
  //! k and step on every rank). flags = 2 when this rank rejected its input (it then
  //! contributes nothing and every rank sees the flag; n-sized buffers are not grown).
  //! status (two words in the space, the caller's step status, kept until combine): a
  //! status_nonfinite bit set by the local phase flags this rank's input as non-finite;
  //! status_wire with status[1] = the peer reports a malformed frame.
  void begin(std::size_t n, std::size_t k, std::int64_t step, std::uint32_t flags, span<std::uint32_t> status) {
    const int P = comm_.size();
    step_bounds_.assign(bounds_.begin(), bounds_.end());
    reset_ = step_bounds_.size() != static_cast<std::size_t>(P) + 1 || step_bounds_.back() != static_cast<std::int64_t>(n);
    if (reset_) {
      step_bounds_.resize(static_cast<std::size_t>(P) + 1);
      for (int j = 0; j <= P; ++j) step_bounds_[static_cast<std::size_t>(j)] = static_cast<std::int64_t>(n) * j / P;
    }
    estimate_ = reset_ || !theta_valid_ || step % period_ == 0;
    n_ = n, k_ = std::max<std::size_t>(k, 1), cap_ = region_cap(k_, P), P_ = P, step_ = step;
    my_flags_ = flags, all_flags_ = 0;
    status_ = status;
    from_block_ = false;
    size_buffers(flags == 0);
    ops<space_type>::from_host(exec(), std::span<const std::int64_t>(step_bounds_), dbounds_.view());
  }

  //! The k index and value slots of this rank's set (index-sorted), for a fused local phase.
  struct local_target {
    span<std::int32_t> idx;
    span<float> val;
  };
  local_target local_set() {
    from_block_ = false;
    return {lidx_.view(), lval_.view()};
  }

  //! This rank's block: capacity (>= 48 + 8k, a multiple of 4) bytes of float storage for
  //! a sparse_wire frame of at most k entries (the file comment says what goes there).
  span<float> block(std::size_t capacity) {
    if constexpr (!detail::has_oktopk_begin<space_type>) {
      throw invalid_argument(
          "commpact::SparseReduceScatter::block: this space has no ops<Space>::oktopk_begin kernel (host, deferred "
          "and CUDA do); write one, feed the step through local_set() (as OkTopK does), or run it over one of those.");
    }
    require(capacity % 4 == 0 && capacity >= sparse_wire::header_bytes + sparse_wire::entry_bytes * k_,
            "commpact::SparseReduceScatter::block: a capacity of ", capacity, " bytes cannot hold a frame of k = ", k_,
            " entries; pass a multiple of 4 of at least 48 + 8k = ", sparse_wire::header_bytes + 8 * k_, ".");
    block_in_.resize(capacity / 4, exec());
    from_block_ = true;
    return block_in_.view();
  }

  //! The reduce-scatter, the region sums, theta, the selection and the allgather (queued
  //! on the communicator's executor; two fences). Collective.
  void exchange() {
    const auto e = exec();
    const auto up = static_cast<std::size_t>(P_);
    const int me = comm_.rank();
    const bool accepted = my_flags_ == 0;
    if constexpr (detail::has_oktopk_begin<space_type>) {
      if (from_block_ && accepted)
        ops<space_type>::oktopk_begin(e, as_bytes(span<const float>(block_in_.view())), static_cast<std::int64_t>(n_),
                                      static_cast<std::int64_t>(k_), lidx_.view(), lval_.view(), status_);
    }
    ops<space_type>::oktopk_frames(e, accepted ? lidx_.cview() : span<const std::int32_t>{},
                                   accepted ? lval_.cview() : span<const float>{}, dbounds_.cview(),
                                   span<const std::uint32_t>(status_),
                                   my_flags_ | (estimate_ ? host::oktopk::flag_estimate : 0u) |
                                       (skips_ ? host::oktopk::flag_skips : 0u),
                                   static_cast<std::int64_t>(n_),
                                   static_cast<std::int64_t>(k_), detail::tagged_step(step_, check_tag_),
                                   hdr_out_.view().first(up * header),
                                   accepted ? pay_out() : span<std::byte>{});
    auto slot = [&](auto& b, std::size_t j) { return b.view().subspan(j * header, header); };
    grouped(comm_, [&] {  // the headers' all-to-all: one group
      for (int j = 0; j < P_; ++j)
        if (j != me) send_known(comm_, j, span<const std::byte>(slot(hdr_out_, static_cast<std::size_t>(j))));
      for (int j = 0; j < P_; ++j)
        if (j != me) recv_known(comm_, j, slot(hdr_in_, static_cast<std::size_t>(j)));
    });
    ops<space_type>::to_host(e, hdr_out_.cview().first(up * header), hdr_out_host_.view().first(up * header));
    ops<space_type>::to_host(e, hdr_in_.cview().first(up * header), hdr_in_host_.view().first(up * header));
    comm_fence(comm_);
    if (!check_headers(me)) return;  // a flagged step: no entries move
    // The entries of every frame, sized by the headers.
    auto count = [&](const auto& h, int j) {
      return static_cast<std::size_t>(
          host::oktopk::read_header(h.view().data() + static_cast<std::size_t>(j) * header).count);
    };
    auto pay = [&](auto& b, int j, std::size_t c) {
      return b.view().subspan(static_cast<std::size_t>(j) * pay_stride(), 8 * c);
    };
    grouped(comm_, [&] {  // the entries' all-to-all: one group
      for (int j = 0; j < P_; ++j)
        if (const auto c = count(hdr_out_host_, j); j != me && c)
          send_known(comm_, j, span<const std::byte>(pay(pay_out_, j, c)));
      for (int j = 0; j < P_; ++j)
        if (const auto c = count(hdr_in_host_, j); j != me && c) recv_known(comm_, j, pay(pay_in_, j, c));
    });
    const auto lo = step_bounds_[static_cast<std::size_t>(me)], hi = step_bounds_[static_cast<std::size_t>(me) + 1];
    const auto len = static_cast<std::size_t>(hi - lo);
    const auto reg = reg_.view().first(len);
    const auto touched = touched_.view().first(len);
    ops<space_type>::oktopk_region_sum(e, hdr_out_.cview().first(up * header), pay_out_.cview().first(up * pay_stride()),
                                       hdr_in_.cview().first(up * header), pay_in_.cview().first(up * pay_stride()), me,
                                       lo, hi, reg, touched, status_);
    if (estimate_) {
      ops<space_type>::oktopk_mags(e, span<const float>(reg), span<const std::uint8_t>(touched), mags_.view().first(k_),
                                   magws_.view());
      comm_.allgather(mags_.cview().first(k_), allmags_.view().first(k_ * up));
      ops<space_type>::oktopk_theta(e, allmags_.cview().first(k_ * up), k_, me, theta_dev_.view(), limit_dev_.view());
    } else {
      ops<space_type>::fill(e, theta_dev_.view(), theta_);
      ops<space_type>::fill(e, limit_dev_.view(), static_cast<std::uint32_t>(cap_));
    }
    ops<space_type>::oktopk_select(e, span<const float>(reg), span<const std::uint8_t>(touched), theta_dev_.cview(),
                                   limit_dev_.cview(), lo, me, block(static_cast<std::size_t>(me), 0, block_stride()),
                                   selws_.view());
    // The allgather's headers (origin, count): a ring of P - 1 rounds of 8 bytes, each
    // round's send to the next rank and receive from the previous one a group.
    auto mod = [P = P_](int x) { return static_cast<std::size_t>(((x % P) + P) % P); };
    for (int s = 0; s < P_ - 1; ++s)
      grouped(comm_, [&] {
        send_known(comm_, static_cast<int>(mod(me + 1)), span<const std::byte>(block(mod(me - s), 0, 8)));
        recv_known(comm_, static_cast<int>(mod(me - 1)), block(mod(me - s - 1), 0, 8));
      });
    ops<space_type>::to_host(e, span<const std::uint32_t>(status_), st_host_.view());
    ops<space_type>::to_host(e, theta_dev_.cview(), theta_host_.view());
    for (std::size_t o = 0; o < up; ++o)
      ops<space_type>::to_host(e, span<const std::byte>(block(o, 0, 8)), block_hdr_host_.view().subspan(8 * o, 8));
    comm_fence(comm_);
    const auto st = std::span<const std::uint32_t>(st_host_.view());
    require_fenced(st[0], "OkTopK (SparseReduceScatter)");
    theta_step_ = theta_host_.view()[0];
    if (st[0] & status_wire)
      wire_failure(detail::cat("the frame of rank ", st[1], " has entries out of order, outside this region or not finite"));
    auto bcount = [&](std::size_t o) { return static_cast<std::size_t>(host::oktopk::get<std::uint32_t>(block_hdr_host_.view().data() + 8 * o + 4)); };
    const std::size_t most = estimate_ ? k_ : cap_;  // what a region may select this step
    for (std::size_t o = 0; o < up; ++o) {
      const auto origin = host::oktopk::get<std::uint32_t>(block_hdr_host_.view().data() + 8 * o);
      if (origin != o || bcount(o) > most)
        wire_failure(detail::cat("the allgather block of rank ", o, " is malformed (origin ", origin, ", ", bcount(o),
                                 " entries, at most ", most, ")"));
    }
    // The selected entries: a second ring, sized by the headers (a group a round).
    for (int s = 0; s < P_ - 1; ++s) {
      const auto so = mod(me - s), ro = mod(me - s - 1);
      const int next = static_cast<int>(mod(me + 1)), prev = static_cast<int>(mod(me - 1));
      grouped(comm_, [&] {
        if (bcount(so)) send_known(comm_, next, span<const std::byte>(block(so, 8, 8 * bcount(so))));
        if (bcount(ro)) recv_known(comm_, prev, block(ro, 8, 8 * bcount(ro)));
      });
    }
  }

  //! After exchange(): the union of every rank's flags (bit 0: some input was not finite,
  //! bit 1: some rank rejected its input). When it is not 0 the step has no result: the
  //! caller raises or skips alike on every rank, and does not call combine.
  std::uint32_t flags() const { return all_flags_; }

  //! After exchange() of an unflagged step: checks the other ranks' allgather blocks (else
  //! status_wire with status[1] = the origin, out untouched); a non-finite sum in any
  //! block (finite inputs that overflowed; every rank holds the same blocks) sets
  //! status_nonfinite, out untouched; else out = 0 except mean_of(sum, P) at every
  //! selected index. The codec is not used.
  template <class K>
  void combine(const K&, span<float> out, span<std::uint32_t> status) {
    ops<space_type>::oktopk_output(exec(), blocks(), dbounds_.cview(), comm_.rank(), out, status);
  }

  //! Unless status is set: acc[i] = 0 for this rank's entries i that were selected
  //! globally (error feedback's delivered entries), and the next step's regions are
  //! rebalanced by the selection (installed by commit). Queued; read after the fence.
  void clear_selected(span<float> acc, span<const std::uint32_t> status) {
    const auto e = exec();
    ops<space_type>::oktopk_clear_selected(e, acc, lidx_.cview(), blocks(), dbounds_.cview(), status,
                                           dbounds_next_.view());
    ops<space_type>::to_host(e, dbounds_next_.cview(), bounds_next_.view());
  }

  //! Installs the step (after the caller's fence): delivered, the rebalanced regions and
  //! this step's theta; else (a skipped step) the step's regions, and theta is kept only
  //! when the regions did not reset.
  void commit(bool delivered) {
    if (delivered) {
      const auto next = std::span<const std::int64_t>(bounds_next_.view());
      bounds_.assign(next.begin(), next.end());
      theta_ = theta_step_;
      theta_valid_ = true;
    } else {
      bounds_.assign(step_bounds_.begin(), step_bounds_.end());
      theta_valid_ = theta_valid_ && !reset_;
    }
  }
  //! The regions and theta restart (an even split and a new estimate at the next step).
  void reset() { bounds_.clear(), theta_valid_ = false; }
  //! Installs saved regions and theta (OkTopK::load_state, which checked them).
  void restore(std::vector<std::int64_t> bounds, float theta, bool theta_valid) {
    bounds_ = std::move(bounds);
    theta_ = theta;
    theta_valid_ = theta_valid;
  }
  //! Whether theta() holds an estimate the next step may reuse.
  bool theta_valid() const { return theta_valid_; }

  //! The region boundaries for the next step (P + 1 values; empty before the first) and
  //! the current threshold.
  std::span<const std::int64_t> bounds() const { return bounds_; }
  float theta() const { return theta_; }
  int sources() const { return comm_.size(); }
  C& comm() { return comm_; }
  const C& comm() const { return comm_; }

  template <class Out>
  void add_signature(Out& s) const {
    auto add = [&](const auto& b) { s.emplace_back(static_cast<const void*>(b.data()), b.capacity()); };
    add(lidx_), add(lval_), add(hdr_out_), add(hdr_in_), add(pay_out_), add(pay_in_), add(block_in_);
    add(reg_), add(touched_), add(mags_), add(allmags_), add(magws_), add(selws_), add(blocks_);
    add(theta_dev_), add(limit_dev_), add(dbounds_), add(dbounds_next_);
    add(step_bounds_), add(bounds_next_), add(hdr_out_host_), add(hdr_in_host_), add(block_hdr_host_);
  }

 private:
  auto exec() const { return comm_exec(const_cast<C&>(comm_)); }
  std::size_t pay_stride() const { return 8 * k_; }
  //! A block holds k entries: an estimation step's region may select up to k.
  std::size_t block_stride() const { return 8 + 8 * k_; }
  span<std::byte> pay_out() { return pay_out_.view().first(static_cast<std::size_t>(P_) * pay_stride()); }
  span<const std::byte> blocks() const { return blocks_.view().first(static_cast<std::size_t>(P_) * block_stride()); }
  span<std::byte> block(std::size_t o, std::size_t off, std::size_t len) {
    return blocks_.view().subspan(o * block_stride() + off, len);
  }

  //! Grows every buffer to this step's sizes (n-sized ones only for an accepted input).
  void size_buffers(bool accepted) {
    const std::size_t P = static_cast<std::size_t>(P_);
    const auto e = exec();
    theta_dev_.resize(1, e), limit_dev_.resize(1, e), dbounds_.resize(P + 1, e), dbounds_next_.resize(P + 1, e);
    bounds_next_.resize(P + 1), hdr_out_host_.resize(P * header), hdr_in_host_.resize(P * header);
    block_hdr_host_.resize(P * 8), st_host_.resize(2), theta_host_.resize(1);
    hdr_out_.resize(P * header, e), hdr_in_.resize(P * header, e);
    if (!accepted) return;
    reg_.resize(n_, e), touched_.resize(n_, e), magws_.resize(n_, e), selws_.resize(n_, e);
    lidx_.resize(k_, e), lval_.resize(k_, e);
    pay_out_.resize(P * pay_stride(), e), pay_in_.resize(P * pay_stride(), e);
    mags_.resize(k_, e), allmags_.resize(k_ * P, e), blocks_.resize(P * block_stride(), e);
  }

  [[noreturn]] void wire_failure(const std::string& what) {
    const auto why = detail::cat("OkTopK (SparseReduceScatter): rank ", comm_.rank(), " at step ", step_, ": ", what, ".");
    comm_.abort(why);
    throw wire_error(detail::cat("commpact::", why, " Every rank must run the same commpact; the step is abandoned."));
  }

  //! Reads every peer's header (after the fence): raises the same error on every rank for
  //! a malformed header, another n, k or step, or another estimation bit (another period:
  //! the ranks would otherwise wait for each other at the magnitudes' allgather until the
  //! deadline); collects the flags. Returns false for a
  //! flagged step. A flagged header carries its rank's n, k and step too, and they are
  //! compared first: a rank that rejected its input because its length changed after a
  //! good step (OkTopK's residual has the old length) is a mismatch on every rank, each
  //! rank seeing every other rank's header, so any two that differ raise it everywhere.
  bool check_headers(int me) {
    const auto own = host::oktopk::read_header(hdr_out_host_.view().data() + static_cast<std::size_t>(me) * header);
    namespace hok = host::oktopk;
    std::uint32_t all = own.flags & hok::stop_flags;
    for (int j = 0; j < P_; ++j) {
      if (j == me) continue;
      const auto h = hok::read_header(hdr_in_host_.view().data() + static_cast<std::size_t>(j) * header);
      if (h.magic != hok::magic || h.flags > (hok::stop_flags | hok::flag_estimate | hok::flag_skips))
        wire_failure(detail::cat("rank ", j, "'s reduce-scatter header is malformed (magic or flags)"));
      if (h.n != static_cast<std::int64_t>(n_) || h.k != static_cast<std::int64_t>(k_) ||
          h.step != detail::tagged_step(step_, check_tag_))
        throw mismatch_error(detail::cat(
            "commpact::OkTopK::reduce: rank ", j, " has n = ", h.n, ", k = ", h.k, " at ",
            detail::tagged_step_text(h.step), "; this rank (rank ", me, ") has n = ", n_, ", k = ", k_, " at ",
            detail::tagged_step_text(detail::tagged_step(step_, check_tag_)),
            ". Every rank must pass the same lengths with the same options and commit or cancel each step alike.",
            detail::bucket_hint(check_tag_ != 0)));
      if ((h.flags ^ own.flags) & hok::flag_estimate)
        throw mismatch_error(detail::cat("commpact::OkTopK::reduce: at step ", step_, " rank ", j,
                                         (h.flags & hok::flag_estimate) ? " re-estimates" : " does not re-estimate",
                                         " theta and this rank (rank ", me, ") ",
                                         estimate_ ? "does" : "does not",
                                         ". Every rank must be built with the same period (oktopk_options::period)."));
      if ((h.flags ^ own.flags) & hok::flag_skips)
        throw mismatch_error(detail::cat("commpact::OkTopK::reduce: ranks disagree on on_nonfinite at step ", step_,
                                         ": rank ", j, (h.flags & hok::flag_skips) ? " skips" : " raises",
                                         " on a non-finite step and this rank (rank ", me, ") ",
                                         skips_ ? "skips" : "raises",
                                         ". Every rank must be built with the same options (on_nonfinite)."));
      if (h.flags & hok::stop_flags) {
        all |= h.flags & hok::stop_flags;
        continue;
      }
      if (h.count > k_) wire_failure(detail::cat("rank ", j, " announced ", h.count, " entries, above k = ", k_));
    }
    all_flags_ = all;
    return all == 0;
  }

  C comm_;
  std::int64_t period_;
  buffer<float> lval_, reg_, mags_, allmags_, magws_, theta_dev_, block_in_;
  buffer<std::int32_t> lidx_, selws_;
  buffer<std::uint8_t> touched_;
  buffer<std::uint32_t> limit_dev_;  // how many region me selects this step (oktopk_theta, else cap)
  buffer<std::byte> hdr_out_, hdr_in_, pay_out_, pay_in_, blocks_;
  buffer<std::int64_t> dbounds_, dbounds_next_;
  std::vector<std::int64_t> bounds_, step_bounds_;
  // Host copies of device data, read after a fence: pinned on CUDA (the copies stay queued).
  pinned_t<space_type, std::int64_t> bounds_next_;
  pinned_t<space_type, std::byte> hdr_out_host_, hdr_in_host_, block_hdr_host_;
  pinned_t<space_type, std::uint32_t> st_host_;
  pinned_t<space_type, float> theta_host_;
  span<std::uint32_t> status_{};
  std::size_t n_ = 0, k_ = 1, cap_ = 1;
  int P_ = 1;
  std::int64_t step_ = 0;
  std::uint32_t check_tag_ = 0;  // detail/check_tag.hpp: added to the step in the headers
  std::uint32_t my_flags_ = 0, all_flags_ = 0;
  bool skips_ = false;  // the compressor's on_nonfinite is skip_step (header bit flag_skips)
  bool reset_ = false, estimate_ = false, from_block_ = false;
  float theta_ = 0.0f, theta_step_ = 0.0f;
  bool theta_valid_ = false;
};

}  // namespace commpact
