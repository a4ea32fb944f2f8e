// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file power.hpp
//! PowerCompressor<Rank>: PowerSGD (Vogels, Karimireddy and Jaggi, NeurIPS 2019),
//! low-rank gradient compression by one step of subspace iteration per step, with error
//! feedback and warm start, over any Communicator (bound at construction; the type names
//! no communicator, as the design card writes it).
//!
//! The user describes the flat gradient buffer as a list of tensors (tensor_layout.hpp):
//!
//! \code
//! std::vector<commpact::tensor_shape> layout = {{64, 3 * 7 * 7}, {64}, {10, 512}, {10}};
//! commpact::PowerCompressor<2> psgd{comm, layout};        // comm: ThreadComm, MpiComm, CountingComm<...>
//! for (int step = 0; step < steps; ++step) {
//!   backward(grads);                 // grads: one flat float buffer, tensors in layout order
//!   psgd.reduce(std::span(grads));   // grads = the same rank-2 estimate of the mean on every rank
//!   sgd_update(params, grads, lr);
//! }
//! \endcode
//!
//! `Rank` is the default approximation rank; `options::approximation_rank` overrides it
//! at run time (PyTorch's matrix_approximation_rank). As in PyTorch's hook, the rank is
//! clamped per tensor to r = min(rank, n, m), and an n x m matrix is compressed only when
//! (n + m) r * min_compression_rate < n m (strictly); vectors and other matrices travel
//! uncompressed.
//!
//! Per step, for each compressed matrix with error-compensated gradient M = g + e
//! (n x m) and warm-start factor Q (m x r):
//!   P = M Q; allreduce-sum P; orthonormalise the columns of P; Q = M^T P;
//!   allreduce-mean Q; approximation A = P Q^T; e = M - A; g = A.
//! All P of all matrices travel in one allreduce, all Q in one, the uncompressed tensors
//! in a third (mean): sum (n + m) r, sum (n + m) r and the dense element count.
//! Before `start_step` the whole buffer is allreduced dense and the residual stays 0.
//!
//! The products stream once over each matrix (kernels/host/lowrank.hpp: M = g + e and
//! P = M Q in one pass; Q = M^T P; A = P Q^T and e = M - A in one pass), in a fixed
//! arithmetic order that does not depend on the vector width or -march.
//! `options::products` (kernels/power_products.hpp) picks that order (`exact`, the
//! default) or cuBLAS SGEMMs (`blas`) on cuda_space; the host and deferred spaces always
//! run the exact order. The compressor passes the choice to the rows; its code is the same.
//!
//! Every rank gets bit-identical results: A is computed from the allreduced P and Q
//! only, the orthonormalisation is a fixed-order loop (kernels/host/orthogonalize.hpp)
//! and the first Q is drawn from a seed shared by all ranks. A Q column that is exactly
//! zero after a step is redrawn at the next step, so a layer never stays stuck at zero.
//! A step that raises changes nothing (residual, Q, counters, grad); a skipped step
//! keeps the residual and Q and counts as skipped.
//!
//! Space (v3): `PowerCompressor<Rank, Space>` runs in an execution space (default
//! host_space, bound to any host Communicator through any_communicator). For another
//! space, name it and pass a communicator of that space (any_space_communicator<Space>):
//!
//! <!-- snippet: grad=commpact::deferred_space::buffer<float> -->
//! \code
//! commpact::PowerCompressor<2, commpact::deferred_space> psgd{commpact::DeferredComm{comm}, layout};
//! psgd.reduce(grad.view());          // grad: deferred_space::buffer<float>
//! \endcode
//!
//! Every product, the orthonormalisation, the Q draw, the means and the non-finite
//! checks are rows of the kernel table ops<Space> (kernels/ops.hpp); the three
//! allreduces (and the step count's, compress/step_check.hpp) are the communicator's
//! data plane. Two phases, as Dense and gTopK:
//! `start(grad)` queues the whole step (host_space: runs it), `finish()` fences once,
//! reads the step status and raises the same error on every rank (grad untouched: M,
//! the candidate residual and the new Q live in workspaces, and grad is written only by
//! kernels that see a clear status), `commit()` installs the residual and Q by swapping
//! buffers, `cancel()` drops the step; `reduce` = start + finish + commit. So
//! pending_step (compress/transaction.hpp) no longer snapshots it.
//! Every buffer is sized by set_layout(): nothing is allocated by a step.
//!
//! Files: this one is the control (agreement, phases, status, state, inspection);
//! power_plan.hpp the options and the layout plan; power_step.hpp the factors and the
//! queued step; the residual is the error feedback's (compress/error_feedback.hpp).

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <new>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "../../comm/agree.hpp"
#include "../../comm/any_comm.hpp"
#include "../../comm/any_space_comm.hpp"
#include "../../concepts.hpp"
#include "../../error.hpp"
#include "../../kernels/deferred/ops.hpp"
#include "../../kernels/host/ops.hpp"
#include "../../kernels/host/orthogonalize.hpp"
#include "../../kernels/status.hpp"
#include "../../state.hpp"
#include "../error_feedback.hpp"
#include "../state_identity.hpp"
#include "../../nonfinite.hpp"
#include "../step_check.hpp"
#include "../step_phase.hpp"
#include "power_plan.hpp"
#include "power_step.hpp"

namespace commpact {

//! PowerSGD with default approximation rank `Rank` (1, 2, 4 are usual), in execution
//! space `Space`.
template <int Rank = 1, class Space = host_space>
class PowerCompressor {
  static_assert(Rank >= 1, "commpact::PowerCompressor<Rank>: Rank must be >= 1.");

 public:
  using options = power_options;
  using space_type = Space;
  //! any_communicator on the host; any_space_communicator<Space> in another space.
  using comm_type =
      std::conditional_t<std::is_same_v<Space, host_space>, any_communicator, any_space_communicator<Space>>;
  template <class T>
  using span = typename Space::template span<T>;
  template <class T>
  using buffer = typename Space::template buffer<T>;
  static constexpr int default_rank = Rank;

  //! Binds to `comm` (any Communicator of the space, wrapped in comm_type); reduce()
  //! needs a layout (set_layout()).
  explicit PowerCompressor(comm_type comm, options opt = {}) : comm_(std::move(comm)), opt_(opt) {
    check_options();
  }
  PowerCompressor(comm_type comm, tensor_layout layout, options opt = {}) : comm_(std::move(comm)), opt_(opt) {
    check_options();
    set_layout(std::move(layout));
  }

  //! Registers the tensors of the flat buffer, in order. Resets the state and sizes
  //! every workspace (no step allocates).
  void set_layout(tensor_layout layout) {
    require(phase_ == phase::idle, "commpact::PowerCompressor::set_layout: a step is in flight; finish and commit "
                                   "(or cancel) it first.");
    auto plan = detail::plan_power(layout, rank(), opt_);
    const std::int64_t agree[] = {plan.hash, static_cast<std::int64_t>(opt_.products)};
    const std::int64_t total = plan.total;
    const std::size_t p = plan.p, q = plan.q, e = plan.e, d = plan.d;
    const auto ex = exec();
    try {
      factors_.resize(ex, p, q, d, opt_.start_step > 0 ? static_cast<std::size_t>(total) : 0);
      ef_.resize(ex, e);
      status_.resize(status_words, ex);
      step_check_.prepare(ex);
    } catch (const std::exception&) {
      throw invalid_argument(detail::cat("commpact::PowerCompressor::set_layout: cannot allocate the factors of a "
                                         "layout of ", total, " elements (", p + q, " factor and ", d,
                                         " dense floats); check the shapes."));
    }
    // Q is saved with the state even before the first step: zero, as on every space.
    // The products' resources (cuda_space with blas: the cuBLAS handle and the
    // approximation's scratch) are made here, not on a step.
    for (const auto& en : plan.entries)
      if (en.compressed) ops<Space>::lowrank_prepare(ex, en.rows, en.cols, en.r, opt_.products);
    if (q > 0) {
      ops<Space>::fill(ex, factors_.q(), 0.0f);
      fence();
    }
    layout_ = std::move(layout);
    entries_ = std::move(plan.entries);
    total_ = static_cast<std::size_t>(total);
    compressed_ = e;
    ef_.forget();
    q_ready_ = false;
    steps_ = skipped_ = 0;
    checked_ = false;
    layout_hash_ = plan.hash;
    agree_hash_ = detail::hash_words(agree);
  }

  //! Replaces grad by the low-rank PowerSGD estimate of the mean gradient, identical on
  //! every rank: start + finish + commit. Returns false when the step was skipped
  //! (non-finite values with nonfinite::skip_step: grad is zeroed, the residual and Q
  //! are kept). A step that raises changes nothing, grad included, except a mismatch_error
  //! of the per-step check (step counts or lengths differ): the ranks that ran the step
  //! hold its result in grad (the state is unchanged everywhere).
  bool reduce(span<float> grad) { return detail::reduce_now(*this, grad); }

  //! Queues the whole step on grad (host_space: runs it). grad must stay alive until
  //! finish(), which leaves the result in it.
  void start(span<float> grad) {
    phase_.require_idle("PowerCompressor");
    require(!layout_.empty(),
            "commpact::PowerCompressor::reduce: no tensor shapes registered; pass the layout to the constructor or "
            "call set_layout() first.");
    // The layout hash and the length are agreed at the first step (a length that differs
    // on one rank raises mismatch_error on every rank, naming it; one that differs from
    // the layout on every rank invalid_argument on every rank). Later steps carry the
    // length in the step check: a rank whose buffer does not fit runs the step's
    // collectives on its own workspaces (idle_step_, grad untouched), and finish() raises
    // alike on every rank.
    const auto n = static_cast<std::int64_t>(grad.size());
    if (!checked_) {
      const std::string problem =
          grad.size() == total_ ? std::string() : length_problem(grad.size());
      agree(comm_, "PowerCompressor",
            {{"the PowerCompressor layout (a hash of the rank, the shapes in order and the options, products "
              "included; register the same shapes and options on every rank)",
              agree_hash_},
             {"the gradient length", n}},
            problem, steps_);
      checked_ = true;
    }
    const auto e = exec();
    idle_step_ = grad.size() != total_;
    // Every step: the step count, the length and the idle flag (compress/step_check.hpp),
    // checked in finish().
    step_check_.queue(comm_, steps_, n, idle_step_);
    ops<Space>::fill(e, status_.view(), std::uint32_t{0});
    dense_step_ = steps_ < opt_.start_step;
    if (idle_step_) factors_.queue_idle(e, comm_, dense_step_);
    else if (dense_step_) factors_.queue_dense(e, comm_, total_, grad, status_.view());
    else factors_.queue_compressed(e, comm_, entries_, opt_, steps_, q_ready_, grad, ef_, status_.view());
    status_host_.resize(status_words);
    ops<Space>::to_host(e, status_.cview(), status_host_.view());
    grad_ = grad;
    phase_ = phase::started;
  }

  //! Fences once and reads the status, alike on every rank: raises mismatch_error when
  //! the ranks' step counts differ (a rank committed a step another cancelled; grad holds
  //! the step's result), numeric_error for a non-finite allreduced factor or dense part
  //! (grad untouched), or under skip_step zeroes grad and returns false.
  bool finish() {
    phase_.take_started("PowerCompressor");
    const auto e = exec();
    fence();
    step_check_.require_same("PowerCompressor", comm_.rank(), steps_, static_cast<std::int64_t>(grad_.size()));
    if (idle_step_) throw invalid_argument(length_problem(grad_.size()));  // every rank's length, the same
    const auto s = std::span<const std::uint32_t>(status_host_.view());
    for (const auto w : s) require_fenced(w, "PowerCompressor::finish");
    outcome_ = outcome::delivered;
    if (s[0] | s[1] | s[2]) {
      const char* what = dense_step_ ? "allreduced dense gradient"
                         : s[0]      ? "allreduced P factor"
                         : s[1]      ? "allreduced uncompressed part"
                                     : "allreduced Q factor";
      if (opt_.on_nonfinite == nonfinite::raise)
        detail::raise_nonfinite("PowerCompressor::reduce", what, static_cast<std::size_t>(-1), steps_);
      ops<Space>::fill(e, grad_, 0.0f);
      fence();
      // Only a bad Q (P and the dense part fine) redraws Q from the seed at the next step.
      outcome_ = !dense_step_ && !s[0] && !s[1] ? outcome::skipped_redraw : outcome::skipped;
    }
    phase_ = phase::finished;
    return outcome_ == outcome::delivered;
  }

  //! Installs a finished step: the candidate residual and the new Q swap in, the
  //! counters advance.
  void commit() {
    phase_.take_finished("PowerCompressor");
    ++steps_;
    if (outcome_ != outcome::delivered) {
      ++skipped_;
      if (outcome_ == outcome::skipped_redraw) q_ready_ = false;
      return;
    }
    if (dense_step_) return;
    ef_.commit();
    factors_.commit_q();
    q_ready_ = true;
  }

  //! Drops a started or finished step: residual, Q and counters as before start().
  void cancel() noexcept {
    phase_.drop([&] { fence(); });
    ef_.cancel();
  }

  //! Saves the counters, the residual and Q (state.hpp format, kind "commpact.PowerCompressor").
  void save_state(std::vector<std::byte>& out) const {
    phase_.require_none_in_flight("PowerCompressor", "save_state");
    state::writer w{out, "commpact.PowerCompressor"};
    w.i64s(1, std::array<std::int64_t, 4>{steps_, skipped_, q_ready_ ? 1 : 0, layout_hash_});
    ef_.save(w, exec());
    w.f32s(12, copy_to_host<Space>(exec(), std::as_const(factors_).q()));
    auto& c = const_cast<PowerCompressor&>(*this).comm();
    state::write_identity(w, {0, c.rank(), c.size()});  // section 20: this rank, the number of ranks
    w.finish();
  }

  //! Restores what save_state wrote into a compressor with the same layout and options;
  //! raises (mismatch_error for another layout, wire_error for a corrupted state) and
  //! changes nothing on failure.
  void load_state(std::span<const std::byte> in) {
    phase_.require_none_in_flight("PowerCompressor", "load_state");
    state::reader r{in, "commpact.PowerCompressor", "PowerCompressor"};
    const auto c = r.i64s(1, 4);
    r.require_that<mismatch_error>(c[3] == layout_hash_, "the state was saved with a different layout, rank or "
                                   "options (hash ", c[3], ", this compressor has ", layout_hash_,
                                   "); register the same shapes and options before loading.");
    r.require_that<wire_error>(c[0] >= 0 && c[1] >= 0 && c[1] <= c[0] && c[0] <= state::max_counter &&
                                   (c[2] == 0 || c[2] == 1),
                               "counters steps = ", c[0], ", skipped = ", c[1], ", q_ready = ", c[2],
                               " are out of range (0 <= skipped <= steps <= 2^62, q_ready 0 or 1); the state is "
                               "corrupted.");
    auto l = basic_error_feedback<Space>::load(r, state::reader::npos, false);
    r.require_that<wire_error>(l.residual.empty() || l.residual.size() == compressed_, "the residual holds ",
                               l.residual.size(), " values, this layout compresses ", compressed_, ".");
    auto q = r.f32s(12, factors_.q_floats());
    state::check_identity(r, "PowerCompressor", comm().rank(), comm().size());
    r.done();
    const auto e = exec();
    ef_.install(e, std::move(l));
    if (!q.empty()) ops<Space>::from_host(e, std::span<const float>(q), factors_.q());
    fence();
    steps_ = c[0];
    skipped_ = c[1];
    q_ready_ = c[2] != 0;
  }

  // ---- inspection -----------------------------------------------------------------
  const tensor_layout& layout() const { return layout_; }
  //! The approximation rank before clamping (options or Rank).
  int rank() const { return opt_.approximation_rank > 0 ? opt_.approximation_rank : Rank; }
  //! The rank of tensor i after clamping to min(n, m) (0 for tensors sent dense).
  std::size_t rank_of(std::size_t i) const { return entries_.at(i).compressed ? entries_.at(i).r : 0; }
  //! True when tensor i travels as low-rank factors (false: dense).
  bool is_compressed(std::size_t i) const { return entries_.at(i).compressed; }
  //! Error-feedback residual of tensor i in the space's memory (empty for dense tensors
  //! and before the first compressed step), row-major.
  span<const float> residual(std::size_t i) const {
    const auto& en = entries_.at(i);
    if (!en.compressed || ef_.size() == 0) return {};
    return ef_.residual().subspan(en.e_off, en.rows * en.cols);
  }
  //! Warm-start factor Q of tensor i (cols x r, column-major; empty for dense tensors).
  span<const float> q_factor(std::size_t i) const {
    const auto& en = entries_.at(i);
    if (!en.compressed) return {};
    return factors_.q().subspan(en.q_off, en.cols * en.r);
  }
  //! Sets tensor i's warm-start factor Q (cols x r, column-major; host memory), e.g. to
  //! start from the Q another implementation drew (commpact_hooks matches PyTorch's
  //! powerSGD_hook); the next step starts from it. Every rank must set the same Q.
  void set_q_factor(std::size_t i, std::span<const float> q) {
    phase_.require_none_in_flight("PowerCompressor", "set_q_factor");
    const auto& en = entries_.at(i);
    require(en.compressed && q.size() == en.cols * en.r, "commpact::PowerCompressor::set_q_factor: tensor ", i,
            en.compressed ? " takes " : " is not compressed and takes ", en.compressed ? en.cols * en.r : 0,
            " floats, got ", q.size(), ".");
    ops<Space>::from_host(exec(), q, factors_.q().subspan(en.q_off, q.size()));
    fence();
    q_ready_ = true;
  }
  //! Floats allreduced per compressed step: sum (n + m) r over compressed matrices plus
  //! the dense elements. Bytes = 4 x this.
  std::size_t floats_per_step() const { return p_floats() + q_floats() + dense_floats(); }
  std::size_t p_floats() const { return factors_.p_floats(); }
  std::size_t q_floats() const { return factors_.q_floats(); }
  std::size_t dense_floats() const { return factors_.dense_floats(); }
  std::size_t numel() const { return total_; }
  std::int64_t steps() const { return steps_; }
  //! The tag added to the step count in this compressor's per-step check (0 alone;
  //! Bucketed sets 1 + the bucket's index, detail/check_tag.hpp).
  void set_check_tag(std::uint32_t tag) { step_check_.set_tag(tag); }
  std::uint32_t check_tag() const { return step_check_.tag(); }
  //! True when the next start() begins with this compressor's agreement (one small
  //! allreduce: the first step, the first after set_layout). Bucketed starts no bucket
  //! during backward at such a step.
  bool needs_agreement() const { return !checked_; }
  std::int64_t skipped_steps() const { return skipped_; }
  const options& opts() const { return opt_; }
  comm_type& comm() { return comm_; }

  //! Address and capacity of every internal buffer, sorted (tests check that nothing is
  //! allocated after the first step; the residual and Q swap roles at every commit).
  std::vector<std::pair<const void*, std::size_t>> workspace_signature() const {
    std::vector<std::pair<const void*, std::size_t>> s;
    factors_.add_signature(s);
    ef_.add_signature(s);
    s.emplace_back(status_.data(), status_.capacity());
    std::sort(s.begin(), s.end());
    return s;
  }

 private:
  using phase = detail::step_phase;
  enum class outcome { delivered, skipped, skipped_redraw };
  //! Status words: [0] the allreduced P, [1] the dense part (or the dense step), [2] Q.
  static constexpr std::size_t status_words = 3;

  using entry = detail::power_entry;

  auto exec() const { return comm_exec(const_cast<comm_type&>(comm_)); }
  //! Waits for the step's queued work under the communicator's deadline.
  void fence() const { comm_fence(const_cast<comm_type&>(comm_)); }

  void check_options() const {
    require(opt_.approximation_rank >= 0, "commpact::PowerCompressor: approximation_rank = ", opt_.approximation_rank,
            " must be >= 1, or 0 to use the class's Rank.");
    require(std::isfinite(opt_.min_compression_rate) && opt_.min_compression_rate >= 0,
            "commpact::PowerCompressor: min_compression_rate = ", opt_.min_compression_rate,
            " must be a finite value >= 0 (0 compresses every matrix; 2 is PyTorch's default).");
    require(opt_.start_step >= 0, "commpact::PowerCompressor: start_step = ", opt_.start_step,
            " must be >= 0 (0 compresses from the first step).");
    require(opt_.products == power_products::exact || opt_.products == power_products::blas,
            "commpact::PowerCompressor: products = ", static_cast<int>(opt_.products),
            " is not a power_products value; pass power_products::exact or power_products::blas.");
    detail::require_nonfinite_policy(opt_.on_nonfinite, "PowerCompressor");
  }

  std::string length_problem(std::size_t n) const {
    return detail::cat("commpact::PowerCompressor::reduce: rank ", comm_.rank(), " passed a buffer of ", n,
                       " floats but the registered shapes hold ", total_, " (the buffer must be exactly the "
                       "concatenation of the registered tensors); fix the layout or the buffer.");
  }

  phase phase_;  // first: a move checks it before any other member has moved
  comm_type comm_;
  options opt_;
  tensor_layout layout_;
  std::vector<entry> entries_;
  std::size_t total_ = 0, compressed_ = 0;
  // The factors' workspaces and the error feedback's candidate (M, then M - A) are the
  // step's; Q and the residual the state, replaced by swapping at commit().
  detail::power_factors<Space> factors_;
  basic_error_feedback<Space> ef_;
  buffer<std::uint32_t> status_;
  pinned_t<Space, std::uint32_t> status_host_;  // status_words words, read after the fence
  detail::step_check<Space> step_check_;
  span<float> grad_{};
  outcome outcome_ = outcome::delivered;
  bool dense_step_ = false;
  bool q_ready_ = false;
  bool checked_ = false;
  std::int64_t layout_hash_ = 0;  // the state's (load_state compares it)
  std::int64_t agree_hash_ = 0;   // the ranks' (layout_hash_ and products)
  std::int64_t steps_ = 0, skipped_ = 0;
  bool idle_step_ = false;  // this step's buffer did not fit the layout (power_factors::queue_idle)
};

}  // namespace commpact
