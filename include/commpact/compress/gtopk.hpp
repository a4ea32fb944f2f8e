// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file gtopk.hpp
//! gTopK<Tree>: gTop-k S-SGD (Shi et al., ICDCS 2019) with error feedback, over any
//! TreeSchedule (concepts.hpp); TreeComm<C>, recursive doubling for any P, is the one
//! commpact ships.
//!
//! \code
//! commpact::gTopK<commpact::TreeComm<commpact::ThreadComm>> reducer{comm, {.density = 0.001}};
//! reducer.reduce(std::span(grad));   // grad = G / P, the same bits on every rank
//! \endcode
//!
//! Per step, on every rank p:
//! 1. acc = g + residual (with DGC options: clipping of g, momentum correction);
//!    S_p = the k entries of largest |acc| (ties: the smaller index), sorted by index.
//! 2. gTopKAllReduce by recursive doubling over TreeComm's schedule: an extra rank
//!    (p >= p2) folds its set into p - p2; in round j each core rank exchanges its current
//!    set with p XOR 2^j and both compute merge(S_low, S_high) (union, a + b at equal
//!    indices with the lower rank's set as a, keep the k largest |value|, ties to the
//!    smaller index); the core rank unfolds the result G to its extra rank. Every rank
//!    ends with the same G.
//! 3. grad = 0 except grad[i] = G[i] / P at G's indices.
//! 4. Residual rule: an entry of S_p leaves p's residual only when p's value is inside G,
//!    that is when its index survived every merge since p's set entered (p's "alive"
//!    entries). Each rank tracks, merge by merge, which of its original entries are still
//!    in its current set; once dropped, an entry never counts again, even if its index
//!    re-enters later from another subtree (that value is someone else's). A core rank
//!    tracks its extra rank's entries the same way and sends the survival mask with G.
//!    The authors' code instead zeroes every local top-k entry whose index is in the
//!    final set, which loses a rank's value when its index was dropped at one merge and
//!    re-entered from another subtree; here nothing is lost:
//!    sum_p residual_new_p + P * result == sum_p (g_p + residual_old_p) up to rounding.
//!
//! Traffic per rank per step: ceil(log2 P) messages or fewer (plus the fold or unfold
//! for P not a power of two), each 48 + 8 * count bytes, count <= k; an unfold adds
//! ceil(k / 8) bytes of survival mask. So at most (48 + 8k) log2(p2) bytes for a core
//! rank without an extra partner.
//!
//! Errors reach every rank without extra messages: each header carries the subtree's
//! flags (non-finite value seen, input rejected) and the ranges of n and k; merged at
//! every exchange, they reach every rank, which then all raise the same error
//! (mismatch_error for different lengths or k, numeric_error for NaN/Inf unless
//! skip_step, invalid_argument on the rank whose input was bad and peer_failure on the
//! others). A malformed message (detectable by its receiver only) makes the receiver
//! call comm.abort() and raise wire_error; the others raise peer_failure.

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "../comm/tree_comm.hpp"
#include "../concepts.hpp"
#include "../error.hpp"
#include "../kernels/host/commit.hpp"
#include "../kernels/host/sparse_merge.hpp"
#include "../kernels/host/topk.hpp"
#include "error_feedback.hpp"
#include "sparse_options.hpp"
#include "sparse_wire.hpp"

namespace commpact {

//! gTop-k over any TreeSchedule (TreeComm<C> is one).
template <class Tree>
class gTopK {
  static_assert(diagnose_tree_schedule<Tree>());

 public:
  using options = sparse_options;
  using tree_type = Tree;

  explicit gTopK(tree_type tree, options opt = {}) : tree_(std::move(tree)), opt_(std::move(opt)) {
    detail::validate_sparse_options(opt_, "gTopK");
  }
  //! Builds the tree schedule from a communicator: gTopK<TreeComm<C>>{comm, opt}.
  template <class C>
    requires(!std::same_as<std::remove_cvref_t<C>, tree_type> && std::constructible_from<tree_type, C>)
  explicit gTopK(C comm, options opt = {}) : gTopK(tree_type(std::move(comm)), std::move(opt)) {}

  //! Replaces grad by G / P, identical on every rank. Returns false when the step was
  //! skipped (non-finite gradient with nonfinite::skip_step; grad zeroed, state kept).
  bool reduce(std::span<float> grad) {
    const int P = tree_.size();
    const auto n = static_cast<std::int64_t>(grad.size());
    k_ = detail::k_at(opt_, steps_, n);
    std::string problem = detail::sparse_problem("gTopK", n, k_);
    if (problem.empty()) problem = detail::length_problem("gTopK", n, ef_.size());

    cur_ = {};
    cur_.n_min = cur_.n_max = n;
    cur_.k_min = cur_.k_max = k_;
    cur_count_ = 0;
    mine_count_ = 0;
    extra_count_ = 0;
    if (!problem.empty()) {
      cur_.flags = sparse_wire::flag_failed;
    } else {
      setup(n);
      if (!ef_.accumulate(grad, opt_.momentum, detail::clip_scale(grad, opt_.clip_norm, P))) {
        cur_.flags = sparse_wire::flag_nonfinite;
      } else {
        const auto k = static_cast<std::size_t>(k_);
        host::topk_abs(ef_.acc(), k, std::span(mine_idx_).first(k), std::span(cur_val_).first(k), ws_);
        std::copy_n(mine_idx_.begin(), k, cur_idx_.begin());
        std::fill_n(mine_alive_.begin(), k, std::uint8_t{1});
        mine_count_ = cur_count_ = k;
      }
    }

    stepper s{*this};
    tree_.reduce(s, recv_);

    // cur_ now holds the same flags and ranges on every rank.
    if (cur_.n_min != cur_.n_max)
      throw mismatch_error(detail::cat("commpact::gTopK::reduce: ranks disagree on the gradient length: rank ",
                                       tree_.rank(), " has n = ", n, ", the lengths range over [", cur_.n_min, ", ",
                                       cur_.n_max, "]; every rank must pass gradients of the same length."));
    if (cur_.k_min != cur_.k_max)
      throw mismatch_error(detail::cat("commpact::gTopK::reduce: ranks disagree on k: rank ", tree_.rank(), " has k = ",
                                       k_, ", k ranges over [", cur_.k_min, ", ", cur_.k_max,
                                       "]; every rank must use the same options and step count."));
    if (cur_.flags & sparse_wire::flag_failed) detail::raise_rejected("gTopK", problem, steps_);
    if (cur_.flags & sparse_wire::flag_nonfinite) {
      detail::end_nonfinite_step(opt_.on_nonfinite, "gTopK::reduce",
                                 "gradient (with its residual) of some rank, or a merged sum,", static_cast<std::size_t>(-1),
                                 steps_, grad);
      ++steps_, ++skipped_;
      return false;
    }

    host::scatter_into_zeroed(grad, std::span<const std::int32_t>(cur_idx_).first(cur_count_),
                              std::span<const float>(cur_val_).first(cur_count_), static_cast<float>(P));
    ef_.commit();
    ef_.clear_delivered(std::span<const std::int32_t>(mine_idx_).first(mine_count_),
                        std::span<const std::uint8_t>(mine_alive_).first(mine_count_));
    last_count_ = cur_count_;
    ++steps_;
    return true;
  }

  //! Saves the counters, the residual and the velocity (state.hpp format, kind "commpact.gTopK").
  void save_state(std::vector<std::byte>& out) const {
    save_feedback_state(out, "commpact.gTopK", ef_, steps_, skipped_);
  }
  //! Restores what save_state wrote; raises and changes nothing on a malformed state.
  void load_state(std::span<const std::byte> in) {
    load_feedback_state(in, "commpact.gTopK", "gTopK", opt_.momentum > 0.0f, ef_, steps_, skipped_);
  }
  //! Forgets the residual and velocity (e.g. when the gradient length changes); every rank must call it.
  void reset() { ef_.clear(); }

  std::int64_t steps() const { return steps_; }
  std::int64_t skipped_steps() const { return skipped_; }
  std::span<const float> residual() const { return ef_.residual(); }
  std::span<const float> velocity() const { return ef_.velocity(); }
  //! k of the last step.
  std::int64_t k() const { return k_; }
  //! Entries of the global set G of the last completed step (<= k).
  std::size_t last_count() const { return last_count_; }
  const options& opts() const { return opt_; }
  tree_type& comm() { return tree_; }

  //! Address and capacity of every internal buffer, sorted, to check that steps after the
  //! first allocate nothing (tests compare it across steps).
  std::vector<std::pair<const void*, std::size_t>> workspace_signature() const {
    std::vector<std::pair<const void*, std::size_t>> s;
    auto add = [&](const auto& v) { s.emplace_back(static_cast<const void*>(v.data()), v.capacity()); };
    add(mine_idx_), add(cur_idx_), add(cur_val_), add(oth_idx_), add(oth_val_), add(out_idx_), add(out_val_);
    add(mine_alive_), add(extra_idx_), add(extra_alive_), add(send_);
    s.emplace_back(ws_.data(), ws_.capacity_bytes());
    s.emplace_back(mws_.data(), mws_.capacity_bytes());
    ef_.add_signature(s);
    std::sort(s.begin(), s.end());  // cur/out buffers swap roles at every merge
    return s;
  }

 private:
  //! TreeComm's reducer: encodes the current set and merges what arrives.
  struct stepper {
    gTopK& g;
    std::span<const std::byte> payload(const tree_step& s) { return g.payload(s); }
    void absorb(const tree_step& s, std::span<const std::byte> m) { g.absorb(s, m); }
  };

  bool healthy() const { return cur_.healthy_for(static_cast<std::int64_t>(n_), k_); }

  void poison() {
    cur_count_ = 0;
    mine_count_ = 0;  // no entry is delivered on a step that does not complete
    extra_count_ = 0;
  }

  std::span<const std::byte> payload(const tree_step& s) {
    sparse_wire::header h = cur_;
    const std::size_t c = healthy() ? cur_count_ : 0;
    std::span<const std::uint8_t> mask{};
    if (s.stage == tree_stage::unfold_send && healthy()) mask = std::span(extra_alive_).first(extra_count_);
    h.mask_bits = static_cast<std::uint32_t>(mask.size());
    sparse_wire::encode(send_, h, std::span<const std::int32_t>(cur_idx_).first(c),
                        std::span<const float>(cur_val_).first(c), mask);
    return send_;
  }

  [[noreturn]] void fail_wire(const tree_step& s, const wire_error& e) {
    const auto why = detail::cat("gTopK: rank ", tree_.rank(), " received a malformed message from rank ", s.peer, ": ",
                                 e.what());
    tree_.abort(why);
    throw wire_error(detail::cat("commpact::", why, " The step is abandoned on every rank."));
  }

  void absorb(const tree_step& s, std::span<const std::byte> msg) {
    sparse_wire::header h;
    try {
      h = sparse_wire::decode_header(msg);
    } catch (const wire_error& e) {
      fail_wire(s, e);
    }
    cur_.merge_meta(h);  // at unfold_recv: the final, global flags and ranges
    if (!healthy()) {
      poison();
      return;
    }
    const auto k = static_cast<std::size_t>(k_);
    const std::size_t want_mask = s.stage == tree_stage::unfold_recv ? mine_count_ : 0;
    sparse_wire::header got;
    try {
      got = sparse_wire::decode(msg, {static_cast<std::int64_t>(n_), k, want_mask}, std::span(oth_idx_),
                                std::span(oth_val_), std::span(mask_in_));
    } catch (const wire_error& e) {
      fail_wire(s, e);
    }
    const std::size_t m = got.count;
    auto oi = std::span<const std::int32_t>(oth_idx_).first(m);
    auto ov = std::span<const float>(oth_val_).first(m);
    auto ci = std::span<const std::int32_t>(cur_idx_).first(cur_count_);
    auto cv = std::span<const float>(cur_val_).first(cur_count_);
    switch (s.stage) {
      case tree_stage::unfold_recv:
        std::copy(oi.begin(), oi.end(), cur_idx_.begin());
        std::copy(ov.begin(), ov.end(), cur_val_.begin());
        cur_count_ = m;
        std::copy_n(mask_in_.begin(), mine_count_, mine_alive_.begin());
        return;
      case tree_stage::fold_recv:  // the extra rank is the higher one
        std::copy(oi.begin(), oi.end(), extra_idx_.begin());
        std::fill_n(extra_alive_.begin(), m, std::uint8_t{1});
        extra_count_ = m;
        merge_into_out(ci, cv, oi, ov);
        break;
      case tree_stage::exchange:
        if (tree_.rank() < s.peer) merge_into_out(ci, cv, oi, ov);
        else merge_into_out(oi, ov, ci, cv);
        break;
      default: return;
    }
    std::swap(cur_idx_, out_idx_);
    std::swap(cur_val_, out_val_);
    // Alive tracking: an original entry stays alive while its index is in the merged set.
    keep_alive(std::span<const std::int32_t>(mine_idx_).first(mine_count_), mine_alive_);
    keep_alive(std::span<const std::int32_t>(extra_idx_).first(extra_count_), extra_alive_);
    // Both partners (and their whole block) hold this merged set, so a sum that
    // overflowed is seen by all of them and spreads to every rank with the flags.
    for (std::size_t j = 0; j < cur_count_; ++j)
      if (!std::isfinite(cur_val_[j])) {
        cur_.flags |= sparse_wire::flag_nonfinite;
        poison();
        break;
      }
  }

  void merge_into_out(std::span<const std::int32_t> ia, std::span<const float> va, std::span<const std::int32_t> ib,
                      std::span<const float> vb) {
    cur_count_ = host::sparse_merge_topk(ia, va, ib, vb, static_cast<std::size_t>(k_), std::span(out_idx_),
                                         std::span(out_val_), mws_);
  }

  void keep_alive(std::span<const std::int32_t> orig, std::vector<std::uint8_t>& alive) const {
    std::size_t q = 0;
    for (std::size_t j = 0; j < orig.size(); ++j) {
      while (q < cur_count_ && cur_idx_[q] < orig[j]) ++q;
      if (!(q < cur_count_ && cur_idx_[q] == orig[j])) alive[j] = 0;
    }
  }

  //! Sizes every buffer once for the largest k of the schedule.
  void setup(std::int64_t n) {
    n_ = static_cast<std::size_t>(n);
    const auto kmax = static_cast<std::size_t>(std::max(k_, detail::k_max(opt_, n)));
    if (mine_idx_.size() >= kmax) return;
    for (auto* v : {&mine_idx_, &cur_idx_, &oth_idx_, &out_idx_, &extra_idx_}) v->assign(kmax, 0);
    for (auto* v : {&cur_val_, &oth_val_, &out_val_}) v->assign(kmax, 0.0f);
    for (auto* v : {&mine_alive_, &extra_alive_, &mask_in_}) v->assign(kmax, 0);
    send_.reserve(sparse_wire::encoded_size(kmax, kmax));
  }

  tree_type tree_;
  options opt_;
  error_feedback ef_;
  host::topk_workspace ws_;
  host::merge_workspace mws_;
  sparse_wire::header cur_{};  // flags and ranges of the current (subtree) set
  std::size_t n_ = 0;
  std::int64_t k_ = 0;
  std::vector<std::int32_t> mine_idx_, cur_idx_, oth_idx_, out_idx_, extra_idx_;
  std::vector<float> cur_val_, oth_val_, out_val_;
  std::vector<std::uint8_t> mine_alive_, extra_alive_, mask_in_;
  std::size_t cur_count_ = 0, mine_count_ = 0, extra_count_ = 0, last_count_ = 0;
  std::vector<std::byte> send_, recv_;
  std::int64_t steps_ = 0, skipped_ = 0;
};

}  // namespace commpact
