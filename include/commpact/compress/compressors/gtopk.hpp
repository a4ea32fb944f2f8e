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
//! Traffic per rank per step: at most ceil(log2 P) messages (for P not a power of two the
//! fold or unfold is one of them: an extra rank sends one message, the fold), each a
//! fixed-capacity frame of exactly 48 + 8k bytes (fewer entries leave zero padding, so
//! the receiver knows the size without a probe); an unfold adds ceil(k / 8) bytes of
//! survival mask. So (48 + 8k) log2(p2) bytes for a core rank without an extra partner,
//! and (48 + 8k) ceil(log2 P) + ceil(k / 8) with one. The first step (and the first after
//! reset() or a load_state whose residual has another length than the agreed one) adds
//! one allreduce of 9 int64 that agrees on n, the largest k, the step count and the
//! residual length.
//!
//! Space (v3). Steps 2 and 3 are the aggregation TreeMerge<Tree>
//! (aggregations/tree_merge.hpp), fed by the fused local phase (step 1). The data plane
//! runs in the space of the tree's communicator
//! (comm_space_t: host_space for ThreadComm and MpiComm, deferred_space for
//! DeferredComm<C>, the CUDA space with NcclComm): every kernel is a row of ops<Space>,
//! and the step is transactional in two phases:
//! - `start(grad)` queues the step (local accumulate + select, the tree's frames and
//!   merges, the scatter of the result into grad); host_space runs it at once;
//! - `finish()` fences once, reads the step's status (kernels/status.hpp) and raises
//!   the same error on every rank, leaving grad untouched (zeroed under skip_step);
//! - `commit()` installs the residual (a swap of buffers) and advances the counters;
//!   `cancel()` drops the step: residual, velocity and counters stay as before it.
//! `reduce(grad)` is start + finish + commit.
//!
//! Errors reach every rank without extra messages: each header carries the subtree's
//! flags (non-finite value seen, input rejected) and the ranges of n and k; merged at
//! every exchange, they reach every rank, which then all raise the same error
//! (mismatch_error for different lengths or k, numeric_error for NaN/Inf unless
//! skip_step, invalid_argument on the rank whose input was bad and peer_failure on the
//! others). A malformed message (detectable by its receiver only) makes the receiver
//! call comm.abort() and raise wire_error (at its finish()); the others raise
//! peer_failure at their next communication.

#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "../../comm/agree.hpp"
#include "../../kernels/copies.hpp"
#include "../../comm/known_size.hpp"
#include "../../comm/tree_comm.hpp"
#include "../../concepts.hpp"
#include "../../detail/check_tag.hpp"
#include "../../error.hpp"
#include "../../kernels/host/ops.hpp"
#include "../../kernels/host/sparse_tree.hpp"
#include "../../state.hpp"
#include "../aggregations/tree_merge.hpp"
#include "../codecs/sparse_options.hpp"
#include "../../wire/sparse_frame.hpp"
#include "../error_feedback.hpp"
#include "../step_phase.hpp"

namespace commpact {

//! gTop-k over any TreeSchedule (TreeComm<C> is one), in the space of its communicator.
template <class Tree>
class gTopK {
  static_assert(diagnose_tree_schedule<Tree>());

 public:
  using options = sparse_options;
  using tree_type = Tree;
  using space_type = comm_space_t<Tree>;
  template <class T>
  using span = typename space_type::template span<T>;
  template <class T>
  using buffer = typename space_type::template buffer<T>;

  explicit gTopK(tree_type tree, options opt = {})
      : agg_(std::move(tree)), opt_(std::move(opt)), ef_(opt_.momentum > 0.0f) {
    detail::validate_sparse_options(opt_, "gTopK");
  }
  //! Builds the tree schedule from a communicator: gTopK<TreeComm<C>>{comm, opt}.
  template <class C>
    requires(!std::same_as<std::remove_cvref_t<C>, tree_type> && std::constructible_from<tree_type, C>)
  explicit gTopK(C comm, options opt = {}) : gTopK(tree_type(std::move(comm)), std::move(opt)) {}

  //! Replaces grad by G / P, identical on every rank: start + finish + commit. Returns
  //! false when the step was skipped (non-finite gradient with nonfinite::skip_step;
  //! grad zeroed, state kept). A step that raises changes nothing, grad included.
  bool reduce(span<float> grad) { return detail::reduce_now(*this, grad); }

  //! Queues a step on grad (read now or later, written by the step): the local phase,
  //! the tree exchange and the scatter of the result. On host_space it runs at once.
  //! grad must stay alive and untouched until finish().
  void start(span<float> grad) {
    phase_.require_idle("gTopK");
    const auto e = exec();
    const int P = agg_.sources();
    const auto n = static_cast<std::int64_t>(grad.size());
    if (!agreed_) agree(n);
    k_ = detail::k_at(opt_, steps_, n);
    problem_ = detail::sparse_problem("gTopK", n, k_);
    if (problem_.empty()) problem_ = detail::length_problem("gTopK", n, n_);
    // Frames are sized from what every rank agreed (n_ and the step count), so that a
    // rank whose own n or k is wrong still sends a frame of the right size, flagged.
    const auto frame_k = static_cast<std::size_t>(std::clamp<std::int64_t>(detail::k_at(opt_, steps_, n_), 1, kmax_));
    grad_ = grad;
    const bool ok = problem_.empty();
    // The step count rides in the frames' flags (sparse_wire::step_flag): ranks out of step
    // see a pair with both bits set. The check tag (Bucketed's bucket) is added to it
    // (detail/check_tag.hpp): buckets whose index differs by other than a multiple of 16
    // never carry the same bits at one step.
    const auto flags = static_cast<std::uint16_t>((ok ? 0 : sparse_wire::flag_failed) |
                                                  sparse_wire::step_flag(steps_ + check_tag_));
    if (ok) {
      ef_.begin(e, grad.size(), false);  // the fused local phase counts a missing residual as zero
      if (opt_.clip_norm > 0.0f) ops<space_type>::clip_scale(e, cview(grad), opt_.clip_norm, P, scale_.view());
    }
    const auto none = span<float>{};
    // The fused local phase writes this rank's set straight into the tree merge's buffers.
    const auto local = agg_.local_set(frame_k);
    ops<space_type>::tree_local(e, local.meta, n, k_, flags, ok ? ef_.candidate() : none,
                                ok ? ef_.candidate_velocity() : none, ef_.residual(), ef_.velocity(), cview(grad),
                                opt_.momentum,
                                opt_.clip_norm > 0.0f && ok ? scale_.cview() : span<const float>{}, local.views, ws_);
    phase_ = phase::started;
    try {
      agg_.exchange();
      agg_.combine(no_codec{}, grad, span<std::uint32_t>{});  // the status: the meta, read after the fence
      meta_host_.resize(1);
      ops<space_type>::to_host(e, agg_.meta(), meta_host_.view());
    } catch (...) {
      phase_ = phase::idle;
      throw;
    }
  }

  //! Waits for the step (one fence), then raises the same error on every rank or
  //! returns: true with grad = G / P, false for a skipped step (grad zeroed). After a
  //! raise, grad is as it was before start() and the step is over (nothing to commit).
  bool finish() {
    phase_.require_started("gTopK");
    const auto e = exec();
    try {
      fence();
    } catch (...) {
      phase_ = phase::idle;
      throw;
    }
    phase_ = phase::idle;
    const sparse_tree_meta& m = meta_host_.view()[0];
    require_fenced(m.status, "gTopK::finish");
    const int me = agg_.comm().rank();
    if (m.status & status_wire) {
      const auto why = detail::cat("gTopK: rank ", me, " received a malformed frame from rank ", m.wire_peer,
                                   " at step ", steps_, ".");
      agg_.comm().abort(why);
      throw wire_error(detail::cat("commpact::", why, " The step is abandoned on every rank."));
    }
    if (m.cur.n_min != m.cur.n_max)
      throw mismatch_error(detail::cat("commpact::gTopK::reduce: ranks disagree on the gradient length: rank ",
                                       me, " has n = ", m.n, ", the lengths range over [", m.cur.n_min, ", ",
                                       m.cur.n_max, "]; every rank must pass gradients of the same length."));
    if (m.cur.k_min != m.cur.k_max)
      throw mismatch_error(detail::cat("commpact::gTopK::reduce: ranks disagree on k: rank ", me, " has k = ",
                                       m.k, ", k ranges over [", m.cur.k_min, ", ", m.cur.k_max,
                                       "]; every rank must use the same options and step count."));
    if (!sparse_wire::one_step(m.cur.flags)) throw detail::out_of_step("gTopK", me, steps_, check_tag_);
    if (m.cur.flags & sparse_wire::flag_failed) detail::raise_rejected("gTopK", problem_, steps_);
    if (m.cur.flags & sparse_wire::flag_nonfinite) {
      if (opt_.on_nonfinite == nonfinite::raise)
        detail::raise_nonfinite("gTopK::reduce", "gradient (with its residual) of some rank, or a merged sum,",
                                static_cast<std::size_t>(-1), steps_);
      ops<space_type>::fill(e, grad_, 0.0f);
      fence();
      outcome_ = outcome::skipped;
    } else {
      outcome_ = outcome::delivered;
    }
    phase_ = phase::finished;
    return outcome_ == outcome::delivered;
  }

  //! Installs a finished step: the candidate becomes the residual (a swap), the
  //! delivered entries leave it, the counters advance.
  void commit() {
    phase_.require_finished("gTopK");
    if (outcome_ == outcome::delivered) {
      ef_.commit();
      ops<space_type>::tree_zero_delivered(exec(), agg_.meta(), ef_.installed_residual(), ef_.installed_velocity(),
                                           agg_.views());
      last_count_ = meta_host_.view()[0].cur_count;
    } else {
      ++skipped_;
    }
    ++steps_;
    phase_ = phase::idle;
  }

  //! Drops a started or finished step: the residual, the velocity and the counters stay
  //! as before start(). (grad holds the step's result if it finished.) Every rank that
  //! started the step must cancel it; queued communication is completed first.
  void cancel() noexcept {
    phase_.drop([&] { fence(); });
    ef_.cancel();
  }

  //! Saves the counters, the residual and the velocity (state.hpp format, kind "commpact.gTopK"),
  //! then who saved it (section 20, state_identity.hpp: k at the residual's length and
  //! this step, this rank, the number of ranks).
  void save_state(std::vector<std::byte>& out) const {
    phase_.require_none_in_flight("gTopK", "save_state");
    auto& c = const_cast<TreeMerge<tree_type>&>(agg_).comm();
    const state_identity id{fingerprint(static_cast<std::size_t>(ef_.size()), steps_), c.rank(), c.size()};
    save_feedback_state(out, "commpact.gTopK", ef_, exec(), steps_, skipped_, &id);
  }
  //! Restores what save_state wrote; raises and changes nothing on a malformed state.
  //! A compressor that has agreed keeps its agreement when the state's residual has the
  //! agreed length, or is empty (a state saved before any kept step): the frames' step
  //! bits then tell ranks out of step (one rank restored alone) with mismatch_error on
  //! every rank, where a re-agreement that only that rank called would wait for the
  //! deadline. Otherwise the next step agrees again. (The kept agreement holds the
  //! length, as after any step: a new length on every rank then needs reset().)
  void load_state(std::span<const std::byte> in) {
    phase_.require_none_in_flight("gTopK", "load_state");
    const identity_check id{agg_.comm().rank(), agg_.comm().size(),
                            [this](std::size_t n, std::int64_t step) { return fingerprint(n, step); }};
    auto st = load_feedback_state(in, "commpact.gTopK", "gTopK", opt_.momentum > 0.0f, &id);
    const std::int64_t agreed_n = n_;
    ef_.install(exec(), std::move(st.ef));
    steps_ = st.steps;
    skipped_ = st.skipped;
    agreed_ = agreed_ && (ef_.size() == 0 || ef_.size() == agreed_n);
    n_ = agreed_ ? agreed_n : ef_.size();  // not agreed: the residual's length, checked at the agreement
  }
  //! Forgets the residual and velocity (e.g. when the gradient length changes); every rank must call it.
  void reset() {
    ef_.forget();
    n_ = 0;
    agreed_ = false;
  }

  std::int64_t steps() const { return steps_; }
  //! The tag added to the step count in this compressor's frames (0 alone; Bucketed sets 1
  //! + the bucket's index, detail/check_tag.hpp).
  void set_check_tag(std::uint32_t tag) { check_tag_ = detail::checked_tag(tag); }
  std::uint32_t check_tag() const { return check_tag_; }
  //! True when the next start() begins with this compressor's agreement (one small
  //! allreduce: the first step, the first after reset() or after a load_state whose
  //! residual did not fit). Bucketed starts no bucket during backward at such a step.
  bool needs_agreement() const { return !agreed_; }
  std::int64_t skipped_steps() const { return skipped_; }
  //! The residual and the velocity, in the space's memory.
  span<const float> residual() const { return ef_.residual(); }
  span<const float> velocity() const { return ef_.velocity(); }
  //! k of the last step.
  std::int64_t k() const { return k_; }
  //! Entries of the global set G of the last completed step (<= k).
  std::size_t last_count() const { return last_count_; }
  const options& opts() const { return opt_; }
  tree_type& comm() { return agg_.comm(); }
  //! The tree merge (an Aggregation) that this compressor feeds with its fused local phase.
  const TreeMerge<tree_type>& aggregation() const { return agg_; }

  //! Address and capacity of every internal buffer, sorted, to check that steps after the
  //! first allocate nothing (tests compare it across steps).
  std::vector<std::pair<const void*, std::size_t>> workspace_signature() const {
    std::vector<std::pair<const void*, std::size_t>> s;
    auto add = [&](const auto& b) { s.emplace_back(b.data(), b.capacity()); };
    add(scale_);
    ef_.add_signature(s);
    s.emplace_back(ws_.data(), ws_.capacity_bytes());
    agg_.add_signature(s);
    std::sort(s.begin(), s.end());  // the residual and candidate swap roles at every commit
    return s;
  }

 private:
  using phase = detail::step_phase;
  using outcome = detail::step_outcome;

  //! TreeMerge::combine's codec argument: the merged set needs no decoding.
  struct no_codec {};

  auto exec() const { return comm_exec(const_cast<tree_type&>(agg_.comm())); }
  //! Waits for the step's queued work under the communicator's deadline.
  void fence() const { comm_fence(const_cast<tree_type&>(agg_.comm())); }

  template <class T>
  static span<const T> cview(span<T> s) {
    return span<const T>(s);
  }

  //! Agrees with every rank on n, the largest k, the step count and the state, then
  //! sizes every buffer once for the largest k of the schedule.
  void agree(std::int64_t n) {
    const auto km = detail::k_max(opt_, n);
    std::string problem = detail::sparse_problem("gTopK", n, std::max<std::int64_t>(detail::k_at(opt_, steps_, n), 0));
    if (problem.empty()) problem = detail::length_problem("gTopK", n, n_);
    commpact::agree(agg_.comm(), "gTopK",
                    {detail::length_item(n, opt_.on_nonfinite), {"the largest k", km}, {"the step count", steps_},
                     {"the residual length", ef_.size()}},
                    problem, steps_);
    n_ = n;
    kmax_ = std::max<std::int64_t>(km, 1);
    agg_.reserve(static_cast<std::size_t>(kmax_));
    const auto e = exec();
    scale_.resize(1, e);
    ef_.reserve(e, static_cast<std::size_t>(n));
    agreed_ = true;
  }

  //! What the ranks agree on at length n and step `step` (state_identity.hpp): k.
  std::int64_t fingerprint(std::size_t n, std::int64_t step) const {
    if (n == 0) return 0;
    const std::array<std::int64_t, 2> w{static_cast<std::int64_t>(n),
                                        detail::k_at(opt_, step, static_cast<std::int64_t>(n))};
    return detail::hash_words(w);
  }

  phase phase_;  // first: a move checks it before any other member has moved
  TreeMerge<tree_type> agg_;  // the exchange and the combination (compress/aggregations/tree_merge.hpp)
  options opt_;
  typename ops<space_type>::topk_workspace ws_;
  basic_error_feedback<space_type> ef_;  // the residual, the velocity and their candidates
  buffer<float> scale_;
  pinned_t<space_type, sparse_tree_meta> meta_host_;  // the step's outcome, read after the fence
  span<float> grad_{};
  std::string problem_;
  bool agreed_ = false;
  outcome outcome_ = outcome::delivered;
  std::int64_t n_ = 0, kmax_ = 1, k_ = 0;
  std::size_t last_count_ = 0;
  std::int64_t steps_ = 0, skipped_ = 0;
  std::uint32_t check_tag_ = 0;  // detail/check_tag.hpp
};

}  // namespace commpact
