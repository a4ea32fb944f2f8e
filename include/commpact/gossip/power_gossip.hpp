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
//! Vectors (biases) are mixed exactly as in D-PSGD. With check_finite on, the round's
//! flag (agreed by every rank before any model changes) also covers headroom: a model
//! or projection value at or above FLT_MAX / 2^k (2^k >= 2 (1 + 2 Rank)) fails the round
//! like a non-finite one (numeric_error alike, or a skipped round), so a round never
//! overflows into Inf or NaN. Bytes per edge per round, each way:
//! 4 r (m or n) per matrix plus 4 n per vector. The rank is clamped per matrix to
//! min(n, m).
//!
//! Runs in the communicator's space (comm_space_t<Comm>): the shared factors, their
//! orthonormalised copies, the differences and the messages are the space's buffers;
//! each round queues, per edge and matrix, the orthonormalisation
//! (ops::power_gossip_orthonormalize) and the projection (ops::lowrank_back_project or
//! lowrank_project), the exchange of a different message per edge (known size), and
//! the updates (ops::power_gossip_update, power_gossip_vectors), which change nothing
//! when the round failed; commit() then makes the differences the shared factors.

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../compress/codecs/tensor_layout.hpp"
#include "../error.hpp"
#include "../kernels/deferred/ops.hpp"
#include "../kernels/host/ops.hpp"
#include "../kernels/host/orthogonalize.hpp"
#include "../state.hpp"
#include "exchange.hpp"

namespace commpact {

//! GossipMixer's codec for PowerGossip with rank-`Rank` factors per matrix and edge.
template <int Rank>
struct power_gossip {
  static_assert(Rank >= 1, "commpact::power_gossip<Rank>: Rank must be >= 1.");
  static constexpr int rank = Rank;
  //! consensus step size: scales w_ij in the matrices' increments (vectors mix exactly, as in D-PSGD)
  double gamma = 1.0;
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
  //! Runs in the communicator's space (GossipMixer drives round_bytes(), queue(), commit()).
  static constexpr bool over_space = true;
  //! The messages (one per neighbour) live in the algorithm's buffer, not the exchange's.
  static constexpr bool own_message = false;
  using exchange_type = neighbor_exchange<Comm>;  // the space, spans and buffers are the exchange's
  using space_type = typename exchange_type::space_type;
  template <class T>
  using span = typename exchange_type::template span<T>;
  template <class T>
  using buffer = typename exchange_type::template buffer<T>;
  using K = typename exchange_type::K;

  power_gossip_algorithm(const tensor_layout& layout, std::size_t, power_gossip<R> pol, neighbor_exchange<Comm>& ex)
      : pol_(pol), me_(ex.rank()), self_w_(ex.self_weight()), exec_(ex.exec()), timeout_(ex.timeout()) {
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
      } else {
        t.v_off = slot_floats_;  // the matrix's slot in an edge's factors
        slot_floats_ += std::max(t.rows, t.cols) * t.r;
        max_nm_ = std::max(max_nm_, t.rows * t.cols);
      }
      off += t.rows * t.cols;
      t_.push_back(t);
    }
    n_vec_ = voff;
    n_ = off;
    nb_.assign(ex.neighbors().begin(), ex.neighbors().end());
    for (std::size_t k = 0; k < nb_.size(); ++k) w_.push_back(ex.weight(k));
    // The first shared factors: n x r Gaussian from the edge's seed, the rest of each slot 0.
    std::vector<float> init(nb_.size() * slot_floats_, 0.0f);
    for (std::size_t k = 0; k < nb_.size(); ++k)
      for (std::size_t i = 0; i < t_.size(); ++i)
        if (t_[i].matrix)
          host::fill_gaussian(std::span<float>(init.data() + k * slot_floats_ + t_[i].v_off, t_[i].rows * t_[i].r),
                              host::mix_seed(edge_seed(k), i, ~0ull, 0));
    const std::size_t max_bytes = std::max(message_bytes(0), message_bytes(1));
    for (auto* b : {&shared_, &ortho_, &diff_}) {
      b->resize(init.size(), exec_);
      if (!init.empty()) K::from_host(exec_, std::span<const float>(init), b->view());
    }
    send_.resize(nb_.size() * (max_bytes / 4), exec_);
    upd_.resize(max_nm_, exec_);
    vacc_.resize(n_vec_, exec_);
    chk_.resize(n_ + nb_.size() * (max_bytes / 4), exec_);
    ex.reserve_messages(max_bytes);
    space_type::fence(exec_, deadline_after(timeout_));
  }

  //! Bytes of one message in the current phase (0: m x r projections, 1: n x r).
  std::size_t message_bytes(int phase = 0) const {
    std::size_t f = n_vec_;
    for (const auto& t : t_)
      if (t.matrix) f += (phase == 0 ? t.cols : t.rows) * t.r;
    return 4 * f;
  }
  //! The bytes of this round's message to each neighbour.
  std::size_t round_bytes() { return message_bytes(phase()); }

  //! Queues the round after the exchange's check: per edge, the orthonormalised shared
  //! factors and the projections of x (this edge's message, then the vectors), the
  //! flag's agreement, the exchange, then the vectors' exact mix and, per edge and
  //! matrix, the update (nothing when the round failed).
  void queue(span<float> x, neighbor_exchange<Comm>& ex, const gossip_options& opt) {
    const auto e = exec_;
    const int ph = phase();
    const std::size_t bytes = message_bytes(ph), floats = bytes / 4;
    const span<const float> xc(x);
    for (std::size_t k = 0; k < nb_.size(); ++k) {
      const auto msg = send_.view().subspan(k * floats, floats);
      std::size_t pos = 0;
      for (std::size_t i = 0; i < t_.size(); ++i) {
        const auto& t = t_[i];
        if (!t.matrix) continue;
        const std::size_t len = ph == 0 ? t.rows : t.cols, ql = ph == 0 ? t.cols : t.rows;
        const auto S = ortho_.view().subspan(k * slot_floats_ + t.v_off, len * t.r);
        K::copy(e, shared_.cview().subspan(k * slot_floats_ + t.v_off, len * t.r), S);
        K::power_gossip_orthonormalize(e, S, len, t.r, edge_seed(k), static_cast<std::uint64_t>(i), round_ + 1);
        const auto out = msg.subspan(pos, ql * t.r);
        const std::size_t nm = t.rows * t.cols;
        if (ph == 0) K::lowrank_back_project(e, xc.subspan(t.offset, nm), t.rows, t.cols, span<const float>(S), t.r, out);
        else K::lowrank_project(e, xc.subspan(t.offset, nm), span<const float>(), x.subspan(t.offset, nm), t.rows,
                                t.cols, span<const float>(S), t.r, out);
        pos += ql * t.r;
      }
      for (const auto& t : t_)
        if (!t.matrix) K::copy(e, xc.subspan(t.offset, t.rows * t.cols), msg.subspan(pos + t.v_off, t.rows * t.cols));
    }
    // Headroom: the round's flag also holds when some |x| or |projection| reaches
    // FLT_MAX / 2^headroom_doublings (gossip_check of the scaled copies in chk_), so that
    // no difference, product or sum of the updates can overflow on any rank.
    checked_ = opt.check_finite ? n_ + nb_.size() * floats : n_;
    if (opt.check_finite) {
      const auto c = chk_.view().first(checked_);
      K::copy(e, xc, c.first(n_));
      K::copy(e, send_.cview().first(nb_.size() * floats), c.subspan(n_, nb_.size() * floats));
      for (int i = 0; i < headroom_doublings; ++i) K::add(e, c, span<const float>(c));
      K::gossip_check(e, span<const float>(c), true, ex.words());
    }
    ex.agree_flag(opt);
    using std::as_bytes;
    ex.exchange_each_known(as_bytes(send_.cview().first(nb_.size() * floats)));
    const auto recv = ex.received_all();
    const auto words = span<const std::int64_t>(ex.words());
    // The vectors: exact D-PSGD mixing (the matrices' updates below do not touch them).
    const std::size_t vec_pos = floats - n_vec_;
    for (const auto& t : t_)
      if (!t.matrix)
        K::power_gossip_vectors(e, x.subspan(t.offset, t.rows * t.cols), recv, bytes, 4 * (vec_pos + t.v_off),
                                ex.weights(), self_w_, vacc_.view().first(t.rows * t.cols), words);
    // The matrices: per edge (ascending) the same product at both ends, added with opposite signs.
    for (std::size_t k = 0; k < nb_.size(); ++k) {
      const bool lower = me_ < nb_[k];
      const auto coef = static_cast<float>((lower ? 1.0 : -1.0) * pol_.gamma * w_[k]);
      std::size_t pos = 0;
      for (const auto& t : t_) {
        if (!t.matrix) continue;
        const std::size_t len = ph == 0 ? t.rows : t.cols, dl = ph == 0 ? t.cols : t.rows;
        const std::size_t slot = k * slot_floats_ + t.v_off, nm = t.rows * t.cols;
        K::power_gossip_update(e, x.subspan(t.offset, nm), t.rows, t.cols, ortho_.cview().subspan(slot, len * t.r),
                               send_.cview().subspan(k * floats + pos, dl * t.r),
                               recv.subspan(k * bytes + 4 * pos, 4 * dl * t.r), diff_.view().subspan(slot, dl * t.r),
                               t.r, ph, lower, coef, upd_.view().first(nm), words);
        pos += dl * t.r;
      }
    }
  }
  //! The length of the values the last round checked (x, then the messages): its first
  //! non-finite index, or this length when none.
  std::size_t checked_length() const { return checked_; }
  //! PowerGossip's messages are never malformed (the size is known).
  const std::string& why() const { return why_; }
  [[noreturn]] void raise_short() const { throw wire_error("commpact::GossipMixer (PowerGossip): unreachable"); }
  //! A round that mixed: the differences become the next shared factors (both ends hold the same d).
  void commit() {
    shared_.swap(diff_);
    ++round_;
  }

  void save(state::writer& w) const {
    w.i64(20, static_cast<std::int64_t>(round_));
    std::vector<float> h(shared_.size());
    if (!h.empty()) {
      K::to_host(exec_, shared_.cview(), std::span<float>(h));
      space_type::fence(exec_, deadline_after(timeout_));
    }
    for (std::size_t k = 0; k < nb_.size(); ++k)
      for (const auto& t : t_)
        if (t.matrix) w.f32s(21, std::span<const float>(h).subspan(k * slot_floats_ + t.v_off, slot_of(t)));
  }
  struct staged {
    std::uint64_t round = 0;
    std::vector<float> shared;
  };
  staged read(state::reader& r) const {
    staged s;
    const auto round = r.i64(20);
    r.require_that<wire_error>(round >= 0, "the PowerGossip round ", round, " is negative; the state is corrupted.");
    s.round = static_cast<std::uint64_t>(round);
    s.shared.reserve(shared_.size());
    for (std::size_t k = 0; k < nb_.size(); ++k)
      for (const auto& t : t_)
        if (t.matrix) {
          const auto f = r.f32s(21, slot_of(t));
          s.shared.insert(s.shared.end(), f.begin(), f.end());
        }
    return s;
  }
  void install(staged&& s) {
    round_ = s.round;
    if (!s.shared.empty()) K::from_host(exec_, std::span<const float>(s.shared), shared_.view());
    space_type::fence(exec_, deadline_after(timeout_));
  }

  template <class Out>
  void add_signature(Out& s) const {
    for (const auto* b : {&shared_, &ortho_, &diff_, &send_, &upd_, &chk_}) s.emplace_back(b->data(), b->capacity());
    s.emplace_back(vacc_.data(), vacc_.capacity());
  }
  //! The parameters every rank must share (GossipMixer's setup hash): the rank, gamma's
  //! bits and the seed of the shared factors.
  void add_setup(std::vector<std::int64_t>& w) const {
    w.push_back(R);
    w.push_back(std::bit_cast<std::int64_t>(pol_.gamma));
    w.push_back(static_cast<std::int64_t>(pol_.seed));
  }

 private:
  //! Doublings of the headroom check: 2^k >= 2 (1 + 2 Rank). With |x|, |q| < B =
  //! FLT_MAX / 2^k on every rank, |d| = |q_high - q_low| < 2B, each entry of an edge's
  //! product S d^T (orthonormal S) below about 2 Rank B, and the weights of the edges sum
  //! to at most 1: every model value stays below B (1 + 2 Rank) <= FLT_MAX / 2.
  static constexpr int headroom_doublings = [] {
    int k = 0;
    while ((1L << k) < 2L * (1 + 2L * R)) ++k;
    return k;
  }();
  int phase() const { return static_cast<int>(round_ % 2); }  // 0: shared is n x r; 1: shared is m x r
  static std::size_t slot_of(const tensor& t) { return std::max(t.rows, t.cols) * t.r; }

  //! The seed both ends of edge k share (mixed with the tensor, the round and the column).
  std::uint64_t edge_seed(std::size_t k) const {
    const auto lo = static_cast<std::uint64_t>(std::min(me_, nb_[k]));
    const auto hi = static_cast<std::uint64_t>(std::max(me_, nb_[k]));
    return pol_.seed ^ (lo << 32 | hi);
  }

  power_gossip<R> pol_;
  int me_;
  double self_w_;
  typename space_type::exec exec_;
  std::chrono::milliseconds timeout_;  // the communicator's: every fence's deadline
  std::vector<tensor> t_;
  std::size_t n_ = 0, n_vec_ = 0, slot_floats_ = 0, max_nm_ = 0, checked_ = 0;
  std::vector<int> nb_;
  std::vector<double> w_;
  // Per edge k, one slot of max(n, m) r floats per matrix at k slot_floats_ + its offset.
  buffer<float> shared_, ortho_, diff_, send_, upd_;
  buffer<float> chk_;  // the headroom check's scaled copies of x and of the messages
  buffer<double> vacc_;
  std::string why_;
  std::uint64_t round_ = 0;
};

}  // namespace detail
}  // namespace commpact
