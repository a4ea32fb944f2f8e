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
//! for (...) {
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
//!
//! Every rank gets bit-identical results: A is computed from the allreduced P and Q
//! only, the orthonormalisation is a fixed-order loop (kernels/host/orthogonalize.hpp)
//! and the first Q is drawn from a seed shared by all ranks. A Q column that is exactly
//! zero after a step is redrawn at the next step, so a layer never stays stuck at zero.
//! A step that raises changes nothing (residual, Q, counters); a skipped step keeps the
//! residual and Q and counts as skipped.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#include <span>
#include <stdexcept>
#include <utility>
#include <vector>

#include "../../comm/agree.hpp"
#include "../../comm/any_comm.hpp"
#include "../../concepts.hpp"
#include "../../detail/hash.hpp"
#include "../../error.hpp"
#include "../../kernels/host/lowrank.hpp"
#include "../../kernels/host/orthogonalize.hpp"
#include "../../kernels/host/vector_ops.hpp"
#include "../../state.hpp"
#include "../error_feedback.hpp"
#include "../../comm/mean_allreduce.hpp"
#include "../../nonfinite.hpp"
#include "../codecs/tensor_layout.hpp"

namespace commpact {

struct power_options {
  //! The approximation rank; 0 takes the class's `Rank`. Clamped per tensor to min(n, m).
  int approximation_rank = 0;
  //! A matrix is compressed when (n + m) r * min_compression_rate < n m (PyTorch's
  //! rule); otherwise (and for every vector) it is allreduced uncompressed. PyTorch's
  //! hook uses 2.
  double min_compression_rate = 2.0;
  //! Steps 0 .. start_step-1 are allreduced dense (PyTorch's hook uses 1000).
  std::int64_t start_step = 0;
  //! Seed of the first Q, shared by all ranks.
  std::uint64_t seed = 0x9E3779B97F4A7C15ull;
  //! Reuse the last Q as the start of the next step (the paper's warm start). When
  //! false, Q is redrawn every step from (seed, step).
  bool warm_start = true;
  nonfinite on_nonfinite = nonfinite::raise;
};

//! PowerSGD with default approximation rank `Rank` (1, 2, 4 are usual).
template <int Rank = 1>
class PowerCompressor {
  static_assert(Rank >= 1, "commpact::PowerCompressor<Rank>: Rank must be >= 1.");

  using fvec = std::vector<float>;

 public:
  using options = power_options;
  static constexpr int default_rank = Rank;

  //! Binds to `comm` (any Communicator, wrapped in any_communicator); reduce() needs a
  //! layout (set_layout()).
  explicit PowerCompressor(any_communicator comm, options opt = {}) : comm_(std::move(comm)), opt_(opt) {
    check_options();
  }
  PowerCompressor(any_communicator comm, tensor_layout layout, options opt = {})
      : comm_(std::move(comm)), opt_(opt) {
    check_options();
    set_layout(std::move(layout));
  }

  //! Registers the tensors of the flat buffer, in order. Resets the state.
  void set_layout(tensor_layout layout) {
    const std::int64_t total = detail::check_layout(layout, "commpact::PowerCompressor::set_layout");
    std::vector<entry> entries;
    std::size_t off = 0, p = 0, q = 0, e = 0, d = 0;
    for (const auto& s : layout) {
      entry en;
      en.offset = off;
      en.rows = static_cast<std::size_t>(s.rows);
      en.cols = static_cast<std::size_t>(s.cols);
      en.r = static_cast<std::size_t>(std::min<std::int64_t>(rank(), std::min(s.rows, s.cols)));
      const double dense = static_cast<double>(s.rows) * static_cast<double>(s.cols);
      const double low = static_cast<double>(s.rows + s.cols) * static_cast<double>(en.r);
      en.compressed = !s.is_vector() && low * opt_.min_compression_rate < dense;
      if (en.compressed) {
        en.p_off = p;
        en.q_off = q;
        en.e_off = e;
        p += en.rows * en.r;
        q += en.cols * en.r;
        e += en.rows * en.cols;
      } else {
        en.d_off = d;
        d += en.rows * en.cols;
      }
      off += en.rows * en.cols;
      entries.push_back(en);
    }
    try {
      p_.assign(p, 0.0f);
      q_.assign(q, 0.0f);
      q_next_.assign(q, 0.0f);
      dense_.assign(d, 0.0f);
    } catch (const std::exception&) {
      throw invalid_argument(detail::cat("commpact::PowerCompressor::set_layout: cannot allocate the factors of a "
                                         "layout of ", total, " elements (", p + q, " factor and ", d,
                                         " dense floats); check the shapes."));
    }
    layout_ = std::move(layout);
    entries_ = std::move(entries);
    total_ = static_cast<std::size_t>(total);
    compressed_ = e;
    ef_.clear();
    q_ready_ = false;
    steps_ = skipped_ = 0;
    checked_ = false;
    std::vector<std::int64_t> words = {rank(), static_cast<std::int64_t>(layout_.size()), opt_.start_step,
                                       static_cast<std::int64_t>(opt_.seed), opt_.warm_start ? 1 : 0,
                                       static_cast<std::int64_t>(opt_.on_nonfinite)};
    std::int64_t rate_bits;
    std::memcpy(&rate_bits, &opt_.min_compression_rate, sizeof(rate_bits));
    words.push_back(rate_bits);
    for (const auto& s : layout_) {
      words.push_back(s.rows);
      words.push_back(s.cols);
    }
    layout_hash_ = detail::hash_words(words);
  }

  //! Replaces grad by the low-rank PowerSGD estimate of the mean gradient, identical on
  //! every rank. Returns false when the step was skipped (non-finite gradient with
  //! nonfinite::skip_step: grad is zeroed, the residual and Q are kept).
  bool reduce(std::span<float> grad) {
    require(!layout_.empty(),
            "commpact::PowerCompressor::reduce: no tensor shapes registered; pass the layout to the constructor or "
            "call set_layout() first.");
    require(grad.size() == total_, "commpact::PowerCompressor::reduce: rank ", comm_.rank(), " passed a buffer of ",
            grad.size(), " floats but the registered shapes hold ", total_,
            " (the buffer must be exactly the concatenation of the registered tensors); fix the layout or the "
            "buffer.");
    if (!checked_) {
      require_same(comm_, layout_hash_,
                   "the PowerCompressor layout (a hash of the rank, the shapes in order and the options; register the "
                   "same shapes and options on every rank)");
      checked_ = true;
    }
    const bool ok = steps_ < opt_.start_step ? dense_step(grad) : compressed_step(grad);
    ++steps_;
    if (!ok) ++skipped_;
    return ok;
  }

  //! Saves the counters, the residual and Q (state.hpp format, kind "commpact.PowerCompressor").
  void save_state(std::vector<std::byte>& out) const {
    state::writer w{out, "commpact.PowerCompressor"};
    w.i64s(1, std::array<std::int64_t, 4>{steps_, skipped_, q_ready_ ? 1 : 0, layout_hash_});
    ef_.save(w);
    w.f32s(12, std::span<const float>(q_.data(), q_.size()));
    w.finish();
  }

  //! Restores what save_state wrote into a compressor with the same layout and options;
  //! raises (mismatch_error for another layout, wire_error for a corrupted state) and
  //! changes nothing on failure.
  void load_state(std::span<const std::byte> in) {
    state::reader r{in, "commpact.PowerCompressor", "PowerCompressor"};
    const auto c = r.i64s(1, 4);
    r.require_that<mismatch_error>(c[3] == layout_hash_, "the state was saved with a different layout, rank or "
                                   "options (hash ", c[3], ", this compressor has ", layout_hash_,
                                   "); register the same shapes and options before loading.");
    r.require_that<wire_error>(c[0] >= 0 && c[1] >= 0 && c[1] <= c[0] && (c[2] == 0 || c[2] == 1), "counters steps = ",
                               c[0], ", skipped = ", c[1], ", q_ready = ", c[2], " are out of range; the state is "
                               "corrupted.");
    auto l = error_feedback::load(r, state::reader::npos, false);
    r.require_that<wire_error>(l.residual.empty() || l.residual.size() == compressed_, "the residual holds ",
                               l.residual.size(), " values, this layout compresses ", compressed_, ".");
    auto q = r.f32s(12, q_.size());
    r.done();
    ef_.install(std::move(l));
    std::copy(q.begin(), q.end(), q_.begin());
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
  //! Error-feedback residual of tensor i (empty for dense tensors and before the first
  //! compressed step), row-major.
  std::span<const float> residual(std::size_t i) const {
    const auto& en = entries_.at(i);
    if (!en.compressed || ef_.residual().empty()) return {};
    return ef_.residual().subspan(en.e_off, en.rows * en.cols);
  }
  //! Warm-start factor Q of tensor i (cols x r, column-major; empty for dense tensors).
  std::span<const float> q_factor(std::size_t i) const {
    const auto& en = entries_.at(i);
    if (!en.compressed) return {};
    return {q_.data() + en.q_off, en.cols * en.r};
  }
  //! Sets tensor i's warm-start factor Q (cols x r, column-major), e.g. to start from the
  //! Q another implementation drew (commpact_hooks matches PyTorch's powerSGD_hook); the
  //! next step starts from it. Every rank must set the same Q.
  void set_q_factor(std::size_t i, std::span<const float> q) {
    const auto& en = entries_.at(i);
    require(en.compressed && q.size() == en.cols * en.r, "commpact::PowerCompressor::set_q_factor: tensor ", i,
            en.compressed ? " takes " : " is not compressed and takes ", en.compressed ? en.cols * en.r : 0,
            " floats, got ", q.size(), ".");
    std::copy(q.begin(), q.end(), q_.begin() + static_cast<std::ptrdiff_t>(en.q_off));
    q_ready_ = true;
  }
  //! Floats allreduced per compressed step: sum (n + m) r over compressed matrices plus
  //! the dense elements. Bytes = 4 x this.
  std::size_t floats_per_step() const { return p_.size() + q_.size() + dense_.size(); }
  std::size_t p_floats() const { return p_.size(); }
  std::size_t q_floats() const { return q_.size(); }
  std::size_t dense_floats() const { return dense_.size(); }
  std::size_t numel() const { return total_; }
  std::int64_t steps() const { return steps_; }
  std::int64_t skipped_steps() const { return skipped_; }
  const options& opts() const { return opt_; }
  any_communicator& comm() { return comm_; }

 private:
  struct entry {
    std::size_t offset = 0, rows = 0, cols = 0, r = 0;
    bool compressed = false;
    std::size_t p_off = 0, q_off = 0, e_off = 0, d_off = 0;
  };

  void check_options() const {
    require(opt_.approximation_rank >= 0, "commpact::PowerCompressor: approximation_rank = ", opt_.approximation_rank,
            " must be >= 1, or 0 to use the class's Rank.");
    require(std::isfinite(opt_.min_compression_rate) && opt_.min_compression_rate >= 0,
            "commpact::PowerCompressor: min_compression_rate = ", opt_.min_compression_rate,
            " must be a finite value >= 0 (0 compresses every matrix; 2 is PyTorch's default).");
    require(opt_.start_step >= 0, "commpact::PowerCompressor: start_step = ", opt_.start_step,
            " must be >= 0 (0 compresses from the first step).");
  }

  //! False when v holds NaN/Inf and the step is skipped; raises under nonfinite::raise.
  bool finite_or_end(std::span<const float> v, const char* what, std::span<float> grad) {
    const std::size_t bad = detail::first_nonfinite(v);
    if (bad == v.size()) return true;
    return detail::end_nonfinite_step(opt_.on_nonfinite, "PowerCompressor::reduce", what, bad, steps_, grad);
  }

  bool dense_step(std::span<float> grad) {
    return mean_allreduce(comm_, grad, opt_.on_nonfinite, "PowerCompressor::reduce", "allreduced dense gradient",
                          steps_);
  }

  //! q_next_ = the Q this step starts from: the warm start, or drawn from the seed.
  void start_q() {
    const std::uint64_t step = static_cast<std::uint64_t>(steps_);
    for (std::size_t t = 0; t < entries_.size(); ++t) {
      const auto& en = entries_[t];
      if (!en.compressed) continue;
      float* q = q_next_.data() + en.q_off;
      if (!q_ready_ || !opt_.warm_start) {
        const std::uint64_t salt = opt_.warm_start ? ~0ull : step;
        host::fill_gaussian({q, en.cols * en.r}, host::mix_seed(opt_.seed, t, salt));
        continue;
      }
      std::copy_n(q_.data() + en.q_off, en.cols * en.r, q);
      for (std::size_t j = 0; j < en.r; ++j)
        if (host::column_is_zero(q, en.cols, j, en.cols))
          host::fill_gaussian({q + j * en.cols, en.cols}, host::mix_seed(opt_.seed, t, step, j + 1));
    }
  }

  bool compressed_step(std::span<float> grad) {
    start_q();
    // 1. M = g + e, in grad; P = M Q (one pass per matrix); pack the dense tensors.
    ef_.begin(compressed_, false);
    for (const auto& en : entries_) {
      const std::size_t nm = en.rows * en.cols;
      const std::span<float> g(grad.data() + en.offset, nm);
      if (!en.compressed) {
        std::memcpy(dense_.data() + en.d_off, g.data(), nm * sizeof(float));
        continue;
      }
      const auto e = ef_.residual_segment(en.e_off, nm);
      const std::span<float> P(p_.data() + en.p_off, en.rows * en.r);
      const std::span<const float> Q(q_next_.data() + en.q_off, en.cols * en.r);
      if (e.empty()) host::lowrank_project(g, en.rows, en.cols, Q, en.r, P);  // no residual yet: M = g
      else host::lowrank_project_ef(g, e, en.rows, en.cols, Q, en.r, P);
    }
    // 2. allreduce P (sum) and the dense part (mean).
    if (!p_.empty()) comm_.allreduce(std::span<float>(p_.data(), p_.size()), reduce_op::sum);
    if (!dense_.empty()) comm_.allreduce(std::span<float>(dense_.data(), dense_.size()), reduce_op::sum);
    if (!finite_or_end(std::span<const float>(p_.data(), p_.size()), "allreduced P factor", grad)) return false;
    if (!finite_or_end(std::span<const float>(dense_.data(), dense_.size()), "allreduced uncompressed part", grad))
      return false;
    // 3. orthonormalise P; Q = M^T P.
    for (const auto& en : entries_) {
      if (!en.compressed) continue;
      host::orthonormalize_columns(p_.data() + en.p_off, en.rows, static_cast<int>(en.r), en.rows);
      host::lowrank_back_project(std::span<const float>(grad.data() + en.offset, en.rows * en.cols), en.rows, en.cols,
                                 std::span<const float>(p_.data() + en.p_off, en.rows * en.r), en.r,
                                 std::span<float>(q_next_.data() + en.q_off, en.cols * en.r));
    }
    // 4. allreduce Q (mean).
    if (!q_next_.empty()) comm_.allreduce(std::span<float>(q_next_.data(), q_next_.size()), reduce_op::sum);
    if (!finite_or_end(std::span<const float>(q_next_.data(), q_next_.size()), "allreduced Q factor", grad)) {
      q_ready_ = false;  // redraw Q from the seed at the next step (the same on every rank)
      return false;
    }
    const int P = comm_.size();
    for (auto& q : q_next_) q = mean_of(q, P);
    // 5. g = A = P Q^T and the candidate residual M - A (one pass); dense tensors get the mean.
    for (const auto& en : entries_) {
      const std::size_t nm = en.rows * en.cols;
      const std::span<float> g(grad.data() + en.offset, nm);
      if (!en.compressed) {
        const float* d = dense_.data() + en.d_off;
        for (std::size_t i = 0; i < nm; ++i) g[i] = mean_of(d[i], P);
        continue;
      }
      host::lowrank_approx_residual(g, ef_.acc_segment(en.e_off, nm), en.rows, en.cols,
                                    std::span<const float>(p_.data() + en.p_off, en.rows * en.r),
                                    std::span<const float>(q_next_.data() + en.q_off, en.cols * en.r), en.r);
    }
    ef_.commit();
    std::swap(q_, q_next_);
    q_ready_ = true;
    return true;
  }

  any_communicator comm_;
  options opt_;
  tensor_layout layout_;
  std::vector<entry> entries_;
  std::size_t total_ = 0, compressed_ = 0;
  fvec p_, q_, q_next_, dense_;
  error_feedback ef_;
  bool q_ready_ = false;
  bool checked_ = false;
  std::int64_t layout_hash_ = 0;
  std::int64_t steps_ = 0, skipped_ = 0;
};

}  // namespace commpact
