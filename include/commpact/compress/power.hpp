#pragma once
//! \file power.hpp
//! PowerCompressor<Rank, Comm>: PowerSGD (Vogels, Karimireddy and Jaggi, NeurIPS 2019),
//! rank-`Rank` gradient compression by one step of subspace iteration per step, with
//! error feedback and warm start, over any Communicator with allreduce.
//!
//! The user describes the flat gradient buffer as a list of tensors, each a row-major
//! matrix `rows x cols` (a conv weight is `out x in*kh*kw`; a bias is `{n}`):
//!
//! \code
//! std::vector<commpact::tensor_shape> layout = {{64, 3 * 7 * 7}, {64}, {10, 512}, {10}};
//! commpact::PowerCompressor<2, commpact::ThreadComm> psgd{comm, layout};
//! for (...) {
//!   backward(grads);                 // grads: one flat float buffer, tensors in layout order
//!   psgd.reduce(std::span(grads));   // grads = the same rank-2 estimate of the mean on every rank
//!   sgd_update(params, grads, lr);
//! }
//! \endcode
//!
//! Per step, for each compressed matrix with error-compensated gradient M = g + e
//! (n x m) and warm-start factor Q (m x r):
//!   P = M Q; allreduce-sum P; orthonormalise the columns of P; Q = M^T P;
//!   allreduce-mean Q; approximation A = P Q^T; e = M - A; g = A.
//! All P of all matrices travel in one allreduce, all Q in one; vectors (biases) and
//! matrices whose compression rate n m / ((n + m) r) is below `min_compression_rate`
//! travel uncompressed in one packed allreduce (mean). So a step costs at most three
//! allreduces, of sum (n + m) r, sum (n + m) r and the dense element count.
//! Before `start_step` the whole buffer is allreduced dense and the residual stays 0.
//!
//! Every rank gets bit-identical results: A is computed from the allreduced P and Q
//! only, the orthonormalisation is a fixed-order loop (kernels/host/orthogonalize.hpp)
//! and the first Q is drawn from a seed shared by all ranks. A Q column that is exactly
//! zero after a step (the layer's gradient was zero everywhere) is redrawn at the next
//! step, so a layer never stays stuck at zero.

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <utility>
#include <vector>

#include "../comm/agree.hpp"
#include "../comm/thread_comm.hpp"
#include "../concepts.hpp"
#include "../error.hpp"
#include "../kernels/host/orthogonalize.hpp"
#include "dense.hpp"

namespace commpact {

//! Shape of one tensor in a flat buffer: a row-major `rows x cols` matrix. A vector
//! (bias) is `{n}` (cols = 1) or `{1, n}`. Flatten conv weights as `out x in*kh*kw`.
struct tensor_shape {
  std::int64_t rows = 0;
  std::int64_t cols = 1;

  std::int64_t numel() const { return rows * cols; }
  bool is_vector() const { return rows == 1 || cols == 1; }
  bool operator==(const tensor_shape&) const = default;
};

using tensor_layout = std::vector<tensor_shape>;

namespace detail {
inline std::int64_t layout_numel(const tensor_layout& l) {
  std::int64_t n = 0;
  for (const auto& s : l) n += s.numel();
  return n;
}
//! FNV-1a over 64-bit words, folded to 62 bits (require_same negates the value).
inline std::int64_t hash_words(std::span<const std::int64_t> w) {
  std::uint64_t h = 1469598103934665603ull;
  for (auto x : w) {
    auto u = static_cast<std::uint64_t>(x);
    for (int b = 0; b < 8; ++b) {
      h ^= (u >> (8 * b)) & 0xffu;
      h *= 1099511628211ull;
    }
  }
  return static_cast<std::int64_t>(h & ((1ull << 62) - 1));
}
inline void check_layout(const tensor_layout& l, const char* who) {
  for (std::size_t i = 0; i < l.size(); ++i) {
    require(l[i].rows >= 1 && l[i].cols >= 1, who, ": tensor ", i, " has shape ", l[i].rows, " x ", l[i].cols,
            "; every dimension must be >= 1 (drop empty tensors from the layout).");
  }
}
}  // namespace detail

struct power_options {
  //! A matrix is compressed when n m / ((n + m) Rank) >= this; otherwise (and for every
  //! vector) it is allreduced uncompressed. PyTorch's hook uses 2.
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

//! PowerSGD over Comm. `Rank` is the rank r of the approximation (1, 2, 4 are usual).
template <int Rank, class Comm = ThreadComm>
class PowerCompressor {
  static_assert(Rank >= 1, "commpact::PowerCompressor<Rank>: Rank must be >= 1.");
  static_assert(diagnose_communicator<Comm>());

  using fvec = std::vector<float, Eigen::aligned_allocator<float>>;
  using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using ColMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::ColMajor>;

 public:
  using options = power_options;
  static constexpr int approximation_rank = Rank;

  //! Registers the layout; reduce() needs one (see set_layout()).
  explicit PowerCompressor(Comm comm, options opt = {}) : comm_(std::move(comm)), opt_(opt) { check_options(); }
  PowerCompressor(Comm comm, tensor_layout layout, options opt = {}) : comm_(std::move(comm)), opt_(opt) {
    check_options();
    set_layout(std::move(layout));
  }

  //! Registers the tensors of the flat buffer, in order. Resets the state.
  void set_layout(tensor_layout layout) {
    detail::check_layout(layout, "commpact::PowerCompressor::set_layout");
    require(!layout.empty(),
            "commpact::PowerCompressor::set_layout: the layout is empty; list the shapes of the tensors in the flat "
            "gradient buffer.");
    layout_ = std::move(layout);
    entries_.clear();
    std::size_t off = 0, p = 0, q = 0, e = 0, d = 0;
    for (std::size_t i = 0; i < layout_.size(); ++i) {
      const auto& s = layout_[i];
      entry en;
      en.offset = off;
      en.rows = static_cast<std::size_t>(s.rows);
      en.cols = static_cast<std::size_t>(s.cols);
      const double rate = static_cast<double>(s.rows) * static_cast<double>(s.cols) /
                          (static_cast<double>(s.rows + s.cols) * Rank);
      en.compressed = !s.is_vector() && rate >= opt_.min_compression_rate;
      if (en.compressed) {
        require(Rank <= std::min(s.rows, s.cols), "commpact::PowerCompressor<", Rank, ">: tensor ", i, " (", s.rows,
                " x ", s.cols, ") would be compressed to rank ", Rank, " > min(n, m) = ", std::min(s.rows, s.cols),
                "; a rank-r factorisation needs r <= min(n, m). Lower Rank, or raise min_compression_rate "
                "(currently ", opt_.min_compression_rate, ") so that this tensor travels uncompressed.");
        en.p_off = p;
        en.q_off = q;
        en.e_off = e;
        p += en.rows * Rank;
        q += en.cols * Rank;
        e += en.rows * en.cols;
      } else {
        en.d_off = d;
        d += en.rows * en.cols;
      }
      off += en.rows * en.cols;
      entries_.push_back(en);
    }
    total_ = off;
    p_.assign(p, 0.0f);
    q_.assign(q, 0.0f);
    residual_.assign(e, 0.0f);
    dense_.assign(d, 0.0f);
    q_ready_ = false;
    steps_ = skipped_ = 0;
    checked_ = false;
    std::vector<std::int64_t> words = {Rank, static_cast<std::int64_t>(layout_.size()), opt_.start_step,
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

  //! Replaces grad by the rank-Rank PowerSGD estimate of the mean gradient, identical
  //! on every rank. Returns false when the step was skipped (non-finite gradient with
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
                   "the PowerCompressor layout (a hash of Rank, the shapes in order and the options; register the "
                   "same shapes and options on every rank)");
      checked_ = true;
    }
    const std::int64_t step = steps_++;
    if (step < opt_.start_step) return dense_step(grad);
    return compressed_step(grad, step);
  }

  void save_state(std::vector<std::byte>& out) const {
    const std::int64_t head[8] = {magic, 1, layout_hash_, steps_, skipped_, q_ready_ ? 1 : 0,
                                  static_cast<std::int64_t>(residual_.size()), static_cast<std::int64_t>(q_.size())};
    append(out, head, sizeof(head));
    append(out, residual_.data(), residual_.size() * sizeof(float));
    append(out, q_.data(), q_.size() * sizeof(float));
  }

  void load_state(std::span<const std::byte> in) {
    std::int64_t head[8];
    require<wire_error>(in.size() >= sizeof(head), "commpact::PowerCompressor::load_state: ", in.size(),
                        " bytes cannot hold the ", sizeof(head), "-byte header; pass what save_state() wrote.");
    std::memcpy(head, in.data(), sizeof(head));
    require<wire_error>(head[0] == magic && head[1] == 1,
                        "commpact::PowerCompressor::load_state: not a PowerCompressor state (bad magic or version); "
                        "pass what save_state() wrote.");
    require<mismatch_error>(head[2] == layout_hash_,
                            "commpact::PowerCompressor::load_state: the state was saved with a different layout, "
                            "Rank or options (hash ", head[2], ", this compressor has ", layout_hash_,
                            "); register the same shapes and options before loading.");
    const auto ne = static_cast<std::size_t>(head[6]), nq = static_cast<std::size_t>(head[7]);
    require<wire_error>(head[6] >= 0 && head[7] >= 0 && ne == residual_.size() && nq == q_.size() &&
                            in.size() == sizeof(head) + (ne + nq) * sizeof(float),
                        "commpact::PowerCompressor::load_state: ", in.size(), " bytes with ", head[6],
                        " residual and ", head[7], " Q values do not match this layout (", residual_.size(), " and ",
                        q_.size(), "); the state is truncated or from another layout.");
    if (ne) std::memcpy(residual_.data(), in.data() + sizeof(head), ne * sizeof(float));
    if (nq) std::memcpy(q_.data(), in.data() + sizeof(head) + ne * sizeof(float), nq * sizeof(float));
    steps_ = head[3];
    skipped_ = head[4];
    q_ready_ = head[5] != 0;
  }

  // ---- inspection -----------------------------------------------------------------
  const tensor_layout& layout() const { return layout_; }
  //! True when tensor i travels as rank-Rank factors (false: dense).
  bool is_compressed(std::size_t i) const { return entries_.at(i).compressed; }
  //! Error-feedback residual of tensor i (empty for dense tensors), row-major.
  std::span<const float> residual(std::size_t i) const {
    const auto& en = entries_.at(i);
    if (!en.compressed) return {};
    return {residual_.data() + en.e_off, en.rows * en.cols};
  }
  //! Warm-start factor Q of tensor i (cols x Rank, column-major; empty for dense tensors).
  std::span<const float> q_factor(std::size_t i) const {
    const auto& en = entries_.at(i);
    if (!en.compressed) return {};
    return {q_.data() + en.q_off, en.cols * Rank};
  }
  //! Floats allreduced per compressed step: sum (n + m) Rank over compressed matrices
  //! plus the dense elements. Bytes = 4 x this.
  std::size_t floats_per_step() const { return p_.size() + q_.size() + dense_.size(); }
  std::size_t p_floats() const { return p_.size(); }
  std::size_t q_floats() const { return q_.size(); }
  std::size_t dense_floats() const { return dense_.size(); }
  std::size_t numel() const { return total_; }
  std::int64_t steps() const { return steps_; }
  std::int64_t skipped_steps() const { return skipped_; }
  const options& opts() const { return opt_; }
  Comm& comm() { return comm_; }

 private:
  static constexpr std::int64_t magic = 0x3144475350574f50;  // "POWPSGD1"

  struct entry {
    std::size_t offset = 0, rows = 0, cols = 0;
    bool compressed = false;
    std::size_t p_off = 0, q_off = 0, e_off = 0, d_off = 0;
  };

  static void append(std::vector<std::byte>& out, const void* p, std::size_t n) {
    if (n == 0) return;
    const auto* b = static_cast<const std::byte*>(p);
    out.insert(out.end(), b, b + n);
  }

  void check_options() const {
    require(std::isfinite(opt_.min_compression_rate) && opt_.min_compression_rate >= 0,
            "commpact::PowerCompressor: min_compression_rate = ", opt_.min_compression_rate,
            " must be a finite value >= 0 (0 compresses every matrix; 2 is PyTorch's default).");
    require(opt_.start_step >= 0, "commpact::PowerCompressor: start_step = ", opt_.start_step,
            " must be >= 0 (0 compresses from the first step).");
  }

  bool nonfinite_found(std::span<const float> v, const char* what) {
    std::size_t bad = v.size();
    for (std::size_t i = 0; i < v.size(); ++i)
      if (!std::isfinite(v[i])) {
        bad = i;
        break;
      }
    if (bad == v.size()) return false;
    if (opt_.on_nonfinite == nonfinite::raise)
      throw numeric_error(detail::cat("commpact::PowerCompressor::reduce: the allreduced ", what,
                                      " is not finite at index ", bad,
                                      " (some rank passed NaN or Inf; every rank raises this error). Fix the "
                                      "gradient, or set on_nonfinite = nonfinite::skip_step to drop such steps."));
    return true;
  }

  bool skip(std::span<float> grad) {
    std::fill(grad.begin(), grad.end(), 0.0f);
    ++skipped_;
    return false;
  }

  bool dense_step(std::span<float> grad) {
    comm_.allreduce(grad, reduce_op::sum);
    if (nonfinite_found(grad, "dense gradient")) return skip(grad);
    const float inv = 1.0f / static_cast<float>(comm_.size());
    for (auto& x : grad) x *= inv;
    return true;
  }

  void init_q(std::int64_t step) {
    for (std::size_t t = 0; t < entries_.size(); ++t) {
      const auto& en = entries_[t];
      if (!en.compressed) continue;
      float* q = q_.data() + en.q_off;
      if (!q_ready_ || !opt_.warm_start) {
        const std::uint64_t salt = opt_.warm_start ? ~0ull : static_cast<std::uint64_t>(step);
        host::fill_gaussian({q, en.cols * Rank}, host::mix_seed(opt_.seed, t, salt));
        continue;
      }
      for (std::size_t j = 0; j < static_cast<std::size_t>(Rank); ++j) {
        if (host::column_is_zero(q, en.cols, j, en.cols))
          host::fill_gaussian({q + j * en.cols, en.cols},
                              host::mix_seed(opt_.seed, t, static_cast<std::uint64_t>(step), j + 1));
      }
    }
    q_ready_ = true;
  }

  bool compressed_step(std::span<float> grad, std::int64_t step) {
    const auto r = static_cast<Eigen::Index>(Rank);
    init_q(step);
    // 1. M = g + e (in place in grad); P = M Q; pack the dense tensors.
    for (const auto& en : entries_) {
      float* g = grad.data() + en.offset;
      if (!en.compressed) {
        std::memcpy(dense_.data() + en.d_off, g, en.rows * en.cols * sizeof(float));
        continue;
      }
      const float* e = residual_.data() + en.e_off;
      for (std::size_t i = 0; i < en.rows * en.cols; ++i) g[i] += e[i];
      Eigen::Map<const RowMat> M(g, en.rows, en.cols);
      Eigen::Map<const ColMat> Q(q_.data() + en.q_off, en.cols, r);
      Eigen::Map<ColMat> P(p_.data() + en.p_off, en.rows, r);
      P.noalias() = M * Q;
    }
    // 2. allreduce P (sum) and the dense part (mean).
    if (!p_.empty()) comm_.allreduce(std::span<float>(p_), reduce_op::sum);
    if (!dense_.empty()) comm_.allreduce(std::span<float>(dense_), reduce_op::sum);
    const bool bad_p = nonfinite_found(p_, "P factor");
    const bool bad_d = nonfinite_found(dense_, "uncompressed part");
    if (bad_p || bad_d) {
      // Undo M = g + e is not needed: the gradient is dropped, e is unchanged.
      return skip(grad);
    }
    // 3. orthonormalise P; Q = M^T P.
    for (const auto& en : entries_) {
      if (!en.compressed) continue;
      host::orthonormalize_columns(p_.data() + en.p_off, en.rows, Rank, en.rows);
      Eigen::Map<const RowMat> M(grad.data() + en.offset, en.rows, en.cols);
      Eigen::Map<const ColMat> P(p_.data() + en.p_off, en.rows, r);
      Eigen::Map<ColMat> Q(q_.data() + en.q_off, en.cols, r);
      Q.noalias() = M.transpose() * P;
    }
    // 4. allreduce Q (mean).
    if (!q_.empty()) comm_.allreduce(std::span<float>(q_), reduce_op::sum);
    if (nonfinite_found(q_, "Q factor")) {
      q_ready_ = false;  // redraw Q from the seed at the next step (same on every rank)
      return skip(grad);
    }
    const float inv = 1.0f / static_cast<float>(comm_.size());
    for (auto& x : q_) x *= inv;
    // 5. e = M - P Q^T; g = P Q^T; dense tensors get the mean.
    for (const auto& en : entries_) {
      float* g = grad.data() + en.offset;
      if (!en.compressed) {
        const float* d = dense_.data() + en.d_off;
        for (std::size_t i = 0; i < en.rows * en.cols; ++i) g[i] = d[i] * inv;
        continue;
      }
      float* e = residual_.data() + en.e_off;
      std::memcpy(e, g, en.rows * en.cols * sizeof(float));  // e = M
      Eigen::Map<RowMat> A(g, en.rows, en.cols);
      Eigen::Map<const ColMat> P(p_.data() + en.p_off, en.rows, r);
      Eigen::Map<const ColMat> Q(q_.data() + en.q_off, en.cols, r);
      A.noalias() = P * Q.transpose();
      for (std::size_t i = 0; i < en.rows * en.cols; ++i) e[i] -= g[i];
    }
    return true;
  }

  Comm comm_;
  options opt_;
  tensor_layout layout_;
  std::vector<entry> entries_;
  std::size_t total_ = 0;
  fvec p_, q_, residual_, dense_;
  bool q_ready_ = false;
  bool checked_ = false;
  std::int64_t layout_hash_ = 0;
  std::int64_t steps_ = 0, skipped_ = 0;
};

}  // namespace commpact
