// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file power_gossip.hpp
//! PowerGossip (Vogels, Karimireddy and Jaggi, NeurIPS 2020): low-rank compression of
//! the model differences between neighbours.
//!
//! Per matrix X (n x m) and edge (i, j), both ends hold the same factor, first p
//! (n x r) drawn from a seed of the edge and the tensor. Each round they orthonormalise
//! it, send the projection (X^T p, m x r), compute the same difference
//! d = q_high - q_low = (X_high - X_low)^T p and apply X_i += s gamma w_ij p d^T with
//! s = +1 at the lower rank, -1 at the higher, so the pair's sum is unchanged. The next
//! round the shared factor is d (m x r) and the projection is taken from the other side
//! (X d, n x r): power iteration on X_high - X_low, warm-started across rounds. A factor
//! column that is exactly zero (the models agree on it) is redrawn from the edge seed.
//! Vectors (biases) are mixed exactly as in D-PSGD. Bytes per edge per round, each way:
//! 4 r (m or n) per matrix plus 4 n per vector. The rank is clamped per matrix to
//! min(n, m).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <utility>
#include <vector>

#include "../compress/codecs/tensor_layout.hpp"
#include "../error.hpp"
#include "../kernels/host/lowrank.hpp"
#include "../kernels/host/orthogonalize.hpp"
#include "../state.hpp"
#include "exchange.hpp"

namespace commpact {

//! GossipMixer's codec for PowerGossip with rank-`Rank` factors per matrix and edge.
template <int Rank>
struct power_gossip {
  static_assert(Rank >= 1, "commpact::power_gossip<Rank>: Rank must be >= 1.");
  static constexpr int rank = Rank;
  double gamma = 1.0;           //!< consensus step size (scales w_ij)
  std::uint64_t seed = 0x51ED;  //!< mixed with the edge and tensor to seed the shared factors
};

namespace detail {

template <int R, class Comm>
class power_gossip_algorithm {
  struct tensor {
    std::size_t offset = 0, rows = 0, cols = 0, r = 0;
    bool matrix = false;
    std::size_t v_off = 0;  // offset among the vectors (exact part)
  };

 public:
  static constexpr std::int64_t id = 2;
  static constexpr const char* name = "PowerGossip";

  power_gossip_algorithm(const tensor_layout& layout, std::size_t, power_gossip<R> pol, neighbor_exchange<Comm>& ex)
      : pol_(pol), me_(ex.rank()) {
    require(std::isfinite(pol_.gamma) && pol_.gamma > 0.0 && pol_.gamma <= 1.0, "commpact::power_gossip: gamma = ",
            pol_.gamma, " must be in (0, 1].");
    std::size_t off = 0, voff = 0;
    for (const auto& s : layout) {
      tensor t;
      t.offset = off;
      t.rows = static_cast<std::size_t>(s.rows);
      t.cols = static_cast<std::size_t>(s.cols);
      t.matrix = !s.is_vector();
      t.r = static_cast<std::size_t>(std::min<std::int64_t>(R, std::min(s.rows, s.cols)));
      if (!t.matrix) {
        t.v_off = voff;
        voff += t.rows * t.cols;
      }
      off += t.rows * t.cols;
      t_.push_back(t);
    }
    n_vec_ = voff;
    nb_.assign(ex.neighbors().begin(), ex.neighbors().end());
    shared_.resize(nb_.size());
    for (std::size_t k = 0; k < nb_.size(); ++k)
      for (std::size_t i = 0; i < t_.size(); ++i) {
        if (!t_[i].matrix) continue;
        std::vector<float> f(std::max(t_[i].rows, t_[i].cols) * t_[i].r, 0.0f);
        host::fill_gaussian(std::span<float>(f.data(), t_[i].rows * t_[i].r), edge_seed(k, i, ~0ull, 0));
        shared_[k].push_back(std::move(f));
      }
    ortho_ = shared_;
    diff_ = shared_;
  }

  //! Bytes of one message in the current phase (0: m x r projections, 1: n x r).
  std::size_t message_bytes(int phase = 0) const {
    std::size_t f = n_vec_;
    for (const auto& t : t_)
      if (t.matrix) f += (phase == 0 ? t.cols : t.rows) * t.r;
    return 4 * f;
  }

  void mix(std::span<float> x, neighbor_exchange<Comm>& ex) {
    const int phase = static_cast<int>(round_ % 2);  // 0: shared is n x r; 1: shared is m x r
    const std::size_t bytes = message_bytes(phase);
    // 1. Orthonormalise (a copy of) the shared factors and build each neighbour's message.
    for (std::size_t k = 0; k < nb_.size(); ++k) {
      auto& msg = ex.send_buffer(k);
      msg.resize(bytes);
      auto* out = reinterpret_cast<float*>(msg.data());
      std::size_t mi = 0;
      for (std::size_t i = 0; i < t_.size(); ++i) {
        const auto& t = t_[i];
        if (!t.matrix) continue;
        const std::size_t len = phase == 0 ? t.rows : t.cols;  // length of the shared columns
        float* s = ortho_[k][mi].data();
        std::copy_n(shared_[k][mi].data(), len * t.r, s);
        ++mi;
        orthonormalize_shared(s, len, t.r, k, i);
        const std::span<const float> X(x.data() + t.offset, t.rows * t.cols);
        const std::span<const float> S(s, len * t.r);
        const std::size_t ql = phase == 0 ? t.cols : t.rows;
        if (phase == 0) host::lowrank_back_project(X, t.rows, t.cols, S, t.r, {out, ql * t.r});  // X^T s: m x r
        else host::lowrank_project(X, t.rows, t.cols, S, t.r, {out, ql * t.r});                 // X s: n x r
        out += ql * t.r;
      }
      for (const auto& t : t_)
        if (!t.matrix) std::memcpy(out + t.v_off, x.data() + t.offset, 4 * t.rows * t.cols);
    }
    ex.exchange();
    for (std::size_t k = 0; k < nb_.size(); ++k)
      require<wire_error>(ex.received(k).size() == bytes, "commpact::GossipMixer (PowerGossip): rank ", nb_[k],
                          " sent ", ex.received(k).size(), " bytes; this round's message is ", bytes, " bytes.");
    // 2. Vectors: exact D-PSGD mixing, from the values before this round's update.
    vacc_.resize(n_vec_);
    for (const auto& t : t_)
      if (!t.matrix)
        for (std::size_t i = 0; i < t.rows * t.cols; ++i) vacc_[t.v_off + i] = ex.self_weight() * x[t.offset + i];
    for (std::size_t k = 0; k < nb_.size(); ++k) {
      const auto* mine = reinterpret_cast<const float*>(ex.send_buffer(k).data());
      const auto* theirs = reinterpret_cast<const float*>(ex.received(k).data());
      const bool lower = me_ < nb_[k];
      const float* q_low = lower ? mine : theirs;
      const float* q_high = lower ? theirs : mine;
      const auto coef = static_cast<float>((lower ? 1.0 : -1.0) * pol_.gamma * ex.weight(k));
      std::size_t pos = 0, mi = 0;
      for (const auto& t : t_) {
        if (!t.matrix) continue;
        const float* s = ortho_[k][mi].data();
        float* d = diff_[k][mi].data();
        ++mi;
        const std::size_t dl = phase == 0 ? t.cols : t.rows;  // length of d's columns
        for (std::size_t i = 0; i < dl * t.r; ++i) d[i] = q_high[pos + i] - q_low[pos + i];
        pos += dl * t.r;
        // X += coef * (phase 0: s d^T; phase 1: d s^T), n x m row-major. Both ends
        // compute the same product U and add it with opposite signs, so the pair's sum is kept.
        const std::size_t nm = t.rows * t.cols;
        upd_.resize(nm);
        host::lowrank_approx(upd_, t.rows, t.cols, {phase == 0 ? s : d, t.rows * t.r},
                             {phase == 0 ? d : s, t.cols * t.r}, t.r);
        float* X = x.data() + t.offset;
        for (std::size_t i = 0; i < nm; ++i) X[i] += coef * upd_[i];
      }
      if (n_vec_) {
        const float* v = theirs + pos;
        const double w = ex.weight(k);
        for (std::size_t i = 0; i < n_vec_; ++i) vacc_[i] += w * static_cast<double>(v[i]);
      }
    }
    for (const auto& t : t_)
      if (!t.matrix)
        for (std::size_t i = 0; i < t.rows * t.cols; ++i) x[t.offset + i] = static_cast<float>(vacc_[t.v_off + i]);
    // 3. The difference becomes the next shared factor (both ends hold the same d).
    std::swap(shared_, diff_);
    ++round_;
  }

  void save(state::writer& w) const {
    w.i64(20, static_cast<std::int64_t>(round_));
    for (const auto& edge : shared_)
      for (const auto& f : edge) w.f32s(21, f);
  }
  struct staged {
    std::uint64_t round = 0;
    std::vector<std::vector<std::vector<float>>> shared;
  };
  staged read(state::reader& r) const {
    staged s;
    const auto round = r.i64(20);
    r.require_that<wire_error>(round >= 0, "the PowerGossip round ", round, " is negative; the state is corrupted.");
    s.round = static_cast<std::uint64_t>(round);
    s.shared = shared_;
    for (auto& edge : s.shared)
      for (auto& f : edge) f = r.f32s(21, f.size());
    return s;
  }
  void install(staged&& s) {
    round_ = s.round;
    shared_ = std::move(s.shared);
  }

 private:
  std::uint64_t edge_seed(std::size_t k, std::size_t t, std::uint64_t step, std::uint64_t col) const {
    const auto lo = static_cast<std::uint64_t>(std::min(me_, nb_[k]));
    const auto hi = static_cast<std::uint64_t>(std::max(me_, nb_[k]));
    return host::mix_seed(pol_.seed ^ (lo << 32 | hi), t, step, col);
  }

  //! Orthonormalises a shared factor (len x r); zero columns are redrawn from the edge
  //! seed and the round, identically at both ends.
  void orthonormalize_shared(float* s, std::size_t len, std::size_t r, std::size_t k, std::size_t t) {
    int kept = host::orthonormalize_columns(s, len, static_cast<int>(r), len);
    for (int attempt = 0; kept < static_cast<int>(r) && attempt < 2; ++attempt) {
      for (std::size_t c = 0; c < r; ++c)
        if (host::column_is_zero(s, len, c, len))
          host::fill_gaussian(std::span<float>(s + c * len, len), edge_seed(k, t, round_ + 1, c + 1 + attempt * r));
      kept = host::orthonormalize_columns(s, len, static_cast<int>(r), len);
    }
  }

  power_gossip<R> pol_;
  int me_;
  std::vector<tensor> t_;
  std::size_t n_vec_ = 0;
  std::vector<int> nb_;
  std::vector<std::vector<std::vector<float>>> shared_, ortho_, diff_;
  std::vector<double> vacc_;
  std::vector<float> upd_;
  std::uint64_t round_ = 0;
};

}  // namespace detail
}  // namespace commpact
