// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file tree_merge.hpp
//! The tree-merge aggregation of gTop-k (Shi et al., ICDCS 2019): every rank holds a
//! sparse set of at most k entries; recursive doubling over a TreeSchedule (TreeComm<C>)
//! merges them pairwise (union, a + b at equal indices with the lower rank's set as a,
//! the k largest |value| kept, ties to the smaller index) until every rank holds the same
//! global set G; combine writes G / P densely. gTopK<Tree> (compressors/gtopk.hpp) is
//! its local phase (error feedback + top-k, fused) followed by this aggregation.
//!
//! This rank's contribution enters in one of two ways, each once per step:
//! - `block(capacity)` (the Aggregation concept): float storage of `capacity` bytes in
//!   which a codec writes a sparse_wire frame (wire/sparse_frame.hpp) of its set:
//!   the 48-byte header with magic, version, mask_bits = 0, count = the entries,
//!   n_min = n_max = n (the dense length), k_min = k_max = k (the same k on every rank),
//!   flags = 0; then count indices (int32, strictly increasing, in [0, n)), then their
//!   count values (finite float32); then zero bytes up to capacity. capacity must be
//!   sparse_tree_frame_bytes(kcap, false) = 48 + 8 kcap for some kcap >= k, the same on
//!   every rank (it sizes every frame of the tree). A rank that cannot contribute writes
//!   the header alone with flag_nonfinite (a NaN/Inf in its input) or flag_failed (its
//!   input was rejected) and count = 0: every rank then skips the step. exchange() reads
//!   the block (ops row tree_begin); a malformed block is status_wire on this rank (with
//!   wire_peer = this rank) and status_rejected on the others.
//! - `local_set(kcap)`: the meta and buffers that the fused local phase (ops row
//!   tree_local) writes directly, without a frame: gTopK's path (bit for bit the same
//!   merge as a block holding the same set).
//!
//! combine(codec, out, status) ignores the codec (the merged set is already decoded):
//! out = 0 except out[i] = mean_of(G[i], P) at G's indices, when the step is healthy;
//! otherwise out is untouched and status gets status_wire (a malformed frame),
//! status_nonfinite (some rank flagged a non-finite input, or a merged sum overflowed)
//! or status_rejected (some rank rejected its input, or ranks disagree on n or k). An
//! empty status span skips that word: gTopK reads the meta itself (meta()), to raise its
//! detailed errors.
//!
//! Bytes per rank per step: (48 + 8 kcap) per message, ceil(log2 P) messages or fewer
//! (plus the fold or unfold for P not a power of two; an unfold adds ceil(kcap / 8) bytes
//! of survival mask).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>

#include "../../comm/known_size.hpp"
#include "../../comm/tree_comm.hpp"
#include "../../concepts.hpp"
#include "../../error.hpp"
#include "../../kernels/deferred/ops.hpp"
#include "../../kernels/host/ops.hpp"
#include "../../kernels/host/sparse_tree.hpp"

namespace commpact {

namespace detail {
//! Whether ops<S> has TreeMerge's block path (ops<cuda_space> has no tree_begin yet).
template <class S>
concept has_tree_begin = requires(typename S::exec e, typename S::template span<sparse_tree_meta> m,
                                  typename S::template span<const std::byte> f, typename ops<S>::tree_views b) {
  ops<S>::tree_begin(e, m, f, 0, b);
};
}  // namespace detail

//! gTop-k's tree merge over a TreeSchedule (TreeComm<C>), in the space of its communicator.
template <class Tree>
class TreeMerge {
  static_assert(diagnose_tree_schedule<Tree>());

 public:
  using comm_type = Tree;
  using space_type = comm_space_t<Tree>;
  template <class T>
  using span = typename space_type::template span<T>;
  template <class T>
  using buffer = typename space_type::template buffer<T>;
  using tree_views = typename ops<space_type>::tree_views;

  explicit TreeMerge(Tree tree) : tree_(std::move(tree)) {}

  //! Sizes every buffer for sets of up to kcap entries (no allocation once a kcap at
  //! most the largest seen has been reserved).
  void reserve(std::size_t kcap) {
    kcap_ = std::max<std::size_t>(kcap, 1);
    const auto e = exec();
    for (auto* b : {&mine_idx_, &cur_idx_, &oth_idx_, &out_idx_, &extra_idx_}) b->resize(kcap_, e);
    for (auto* b : {&cur_val_, &oth_val_, &out_val_}) b->resize(kcap_, e);
    for (auto* b : {&mine_alive_, &extra_alive_, &mask_in_}) b->resize(kcap_, e);
    const std::size_t fb = sparse_tree_frame_bytes(kcap_, true);
    send_.resize(fb, e);
    recv_.resize(fb, e);
    meta_.resize(1, e);
    views_ = {mine_idx_.view(),   cur_idx_.view(),     oth_idx_.view(), out_idx_.view(),
              extra_idx_.view(),  cur_val_.view(),     oth_val_.view(), out_val_.view(),
              mine_alive_.view(), extra_alive_.view(), mask_in_.view()};
  }

  //! This rank's block: `capacity` = 48 + 8 kcap bytes of float storage for a sparse_wire
  //! frame of at most kcap entries (the file comment says what a codec writes there).
  span<float> block(std::size_t capacity) {
    if constexpr (!detail::has_tree_begin<space_type>) {
      throw invalid_argument(
          "commpact::TreeMerge::block: this space has no tree_begin kernel yet; feed the merge through "
          "local_set() (as gTopK does) or run it over host_space or deferred_space.");
    }
    const bool framed = capacity >= sparse_wire::header_bytes &&
                        (capacity - sparse_wire::header_bytes) % sparse_wire::entry_bytes == 0;
    require(framed,
            "commpact::TreeMerge::block: a capacity of ", capacity,
            " bytes is not a sparse frame's; pass sparse_tree_frame_bytes(kcap, false) = 48 + 8 kcap.");
    const std::size_t kcap = (capacity - sparse_wire::header_bytes) / sparse_wire::entry_bytes;
    if (kcap_ != std::max<std::size_t>(kcap, 1) || meta_.size() != 1) reserve(kcap);
    frame_k_ = std::max<std::size_t>(kcap, 1);
    block_.resize(capacity / 4, exec());
    from_block_ = true;
    return block_.view();
  }

  //! The meta and buffers the fused local phase (ops row tree_local) writes this step,
  //! for frames of kcap entries (kcap >= k, the same on every rank; reserve(kcap) first).
  struct local_target {
    span<sparse_tree_meta> meta;
    const tree_views& views;
  };
  local_target local_set(std::size_t kcap) {
    require(kcap <= kcap_ && meta_.size() == 1, "commpact::TreeMerge::local_set: kcap = ", kcap,
            " exceeds the reserved ", kcap_, "; call reserve(kcap) first.");
    frame_k_ = std::max<std::size_t>(kcap, 1);
    from_block_ = false;
    return {meta_.view(), views_};
  }

  //! Walks the tree: the frame of each step and the merge of what arrives (queued on the
  //! communicator's executor). Collective over every rank of the tree.
  void exchange() {
    if constexpr (detail::has_tree_begin<space_type>) {
      if (from_block_)
        ops<space_type>::tree_begin(exec(), meta_.view(), as_bytes(span<const float>(block_.view())), tree_.rank(),
                                    views_);
    }
    stepper s{*this};
    tree_.reduce_frames(s);
  }

  //! After exchange(): out = G / P (zero elsewhere) when the step is healthy; else out
  //! untouched and status bits set (none when status is empty). The codec is not used.
  template <class K>
  void combine(const K&, span<float> out, span<std::uint32_t> status) {
    const auto e = exec();
    ops<space_type>::tree_scatter(e, meta_.cview(), out, views_, tree_.size());
    if (!status.empty()) ops<space_type>::tree_status(e, meta_.cview(), status);
  }

  int sources() const { return tree_.size(); }
  Tree& comm() { return tree_; }
  const Tree& comm() const { return tree_; }

  //! The step's meta (one element in the space's memory) and the tree's buffers: gTopK
  //! reads the meta after its fence and removes the delivered entries from its residual.
  span<const sparse_tree_meta> meta() const { return meta_.cview(); }
  const tree_views& views() const { return views_; }
  std::size_t frame_k() const { return frame_k_; }

  template <class Out>
  void add_signature(Out& s) const {
    auto add = [&](const auto& b) { s.emplace_back(static_cast<const void*>(b.data()), b.capacity()); };
    add(mine_idx_), add(cur_idx_), add(oth_idx_), add(out_idx_), add(extra_idx_);
    add(cur_val_), add(oth_val_), add(out_val_), add(mine_alive_), add(extra_alive_), add(mask_in_);
    add(send_), add(recv_), add(meta_), add(block_);
    s.emplace_back(static_cast<const void*>(mws_.data()), mws_.capacity_bytes());
  }

 private:
  //! TreeComm's reducer: queues the frame of each step and the merge of what arrives.
  struct stepper {
    TreeMerge& t;
    span<const std::byte> frame_out(const tree_step& s) { return t.send_.view().first(t.frame_bytes(s)); }
    span<std::byte> frame_in(const tree_step& s) { return t.recv_.view().first(t.frame_bytes(s)); }
    void payload(const tree_step& s) {
      ops<space_type>::tree_payload(t.exec(), t.meta_.cview(), s.stage, t.send_.view().first(t.frame_bytes(s)),
                                    t.views_);
    }
    void absorb(const tree_step& s) {
      ops<space_type>::tree_absorb(t.exec(), t.meta_.view(), s.stage, t.tree_.rank() < s.peer, s.peer,
                                   span<const std::byte>(t.recv_.view().first(t.frame_bytes(s))), t.views_, t.mws_);
    }
  };

  std::size_t frame_bytes(const tree_step& s) const {
    const bool unfold = s.stage == tree_stage::unfold_send || s.stage == tree_stage::unfold_recv;
    return sparse_tree_frame_bytes(frame_k_, unfold);
  }
  auto exec() const { return comm_exec(const_cast<Tree&>(tree_)); }

  Tree tree_;
  typename ops<space_type>::merge_workspace mws_;
  buffer<std::int32_t> mine_idx_, cur_idx_, oth_idx_, out_idx_, extra_idx_;
  buffer<float> cur_val_, oth_val_, out_val_, block_;
  buffer<std::uint8_t> mine_alive_, extra_alive_, mask_in_;
  buffer<std::byte> send_, recv_;
  buffer<sparse_tree_meta> meta_;
  tree_views views_{};
  std::size_t kcap_ = 0, frame_k_ = 1;
  bool from_block_ = false;
};

}  // namespace commpact
