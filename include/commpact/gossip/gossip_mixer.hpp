#pragma once
//! \file gossip_mixer.hpp
//! GossipMixer<Topology, Compressor, Comm>: decentralised training. Each rank keeps its
//! own model and, once per step, mixes it with its neighbours' in a Topology over a
//! point-to-point communicator. No allreduce on the hot path.
//!
//! The second parameter says what crosses an edge:
//!
//! | Compressor                     | algorithm | bytes per edge per step, each way |
//! |---|---|---|
//! | `exact_mixing` (default), `Dense<C>` | D-PSGD (Lian et al. 2017): x_i = sum_j w_ij x_j | 4 n |
//! | `power_gossip<R>`, `PowerCompressor<R, C>` | PowerGossip (Vogels et al. 2020) | 4 r (m or n) per matrix + 4 n per vector |
//! | `choco_gossip<choco_topk>` / `<choco_sign>` | CHOCO-SGD (Koloskova et al. 2019) | 4 + 8k / 4 + n/8 |
//!
//! \code
//! commpact::tensor_layout layout = {{64, 147}, {64}, {10, 512}, {10}};
//! commpact::GossipMixer mixer{comm, commpact::Ring(comm.size()), layout, commpact::power_gossip<1>{}};
//! for (...) {
//!   backward(grads);
//!   sgd_update(params, grads, lr);   // local step
//!   mixer.mix(std::span(params));    // gossip with the ring neighbours
//! }
//! \endcode
//!
//! PowerGossip, per matrix X (n x m) and edge (i, j): both ends hold the same factor,
//! first p (n x r) drawn from a seed of the edge (and the tensor). Each step they
//! orthonormalise it, send the projection (X^T p, m x r), compute the same difference
//! d = q_high - q_low = (X_high - X_low)^T p and apply X_i += s gamma w_ij p d^T with
//! s = +1 at the lower rank, -1 at the higher, so the pair's sum is unchanged. The next
//! step the shared factor is d (m x r) and the projection is taken from the other side
//! (X d, n x r): power iteration on X_high - X_low, warm-started across steps. A
//! factor column that is exactly zero (the two models agree on it) is redrawn from the
//! edge seed. Vectors (biases) are mixed exactly as in D-PSGD.
//!
//! Every mode preserves the average model over the ranks (up to float rounding): the
//! mixing matrix is symmetric and doubly stochastic and each PowerGossip edge applies
//! opposite updates at its two ends.
//!
//! Exchange order: a rank first sends to every neighbour, then receives from every
//! neighbour in ascending order, so no topology can deadlock as long as `Comm::send`
//! does not wait for the receiver (ThreadComm, MpiComm).
//!
//! mix() is collective over the ranks of the topology. The first call also checks, with
//! one small allreduce, that every rank registered the same layout, mode and topology.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "../comm/agree.hpp"
#include "../comm/thread_comm.hpp"
#include "../compress/dense.hpp"
#include "../compress/power.hpp"
#include "../concepts.hpp"
#include "../error.hpp"
#include "../kernels/host/orthogonalize.hpp"
#include "choco_compress.hpp"

namespace commpact {

//! D-PSGD: exchange full models, x_i = sum_j w_ij x_j.
struct exact_mixing {};

//! PowerGossip with rank-Rank factors per matrix and edge.
template <int Rank>
struct power_gossip {
  static_assert(Rank >= 1, "commpact::power_gossip<Rank>: Rank must be >= 1.");
  static constexpr int rank = Rank;
  double gamma = 1.0;          //!< consensus step size (scales w_ij)
  std::uint64_t seed = 0x51ED;  //!< mixed with the edge and tensor to seed the shared factors
};

//! CHOCO-SGD with a local compressor Q (choco_topk or choco_sign).
template <class Q>
struct choco_gossip {
  Q compressor{};
  double gamma = 0.5;  //!< consensus step size; must be tuned to the compressor (smaller for sparser Q)
};

//! Maps the GossipMixer's second parameter to its mixing policy: policies map to
//! themselves, `PowerCompressor<R, C>` to `power_gossip<R>`, `Dense<C>` to `exact_mixing`.
template <class T>
struct gossip_policy {
  using type = T;
};
template <int R, class C>
struct gossip_policy<PowerCompressor<R, C>> {
  using type = power_gossip<R>;
};
template <class C>
struct gossip_policy<Dense<C>> {
  using type = exact_mixing;
};
template <class T>
using gossip_policy_t = typename gossip_policy<T>::type;

namespace detail {
template <class T>
struct is_power_gossip : std::false_type {};
template <int R>
struct is_power_gossip<power_gossip<R>> : std::true_type {};
template <class T>
struct is_choco : std::false_type {};
template <class Q>
struct is_choco<choco_gossip<Q>> : std::true_type {};
template <class P>
struct choco_codec_for {
  using type = choco_codec<choco_sign>;  // unused outside CHOCO
};
template <class Q>
struct choco_codec_for<choco_gossip<Q>> {
  using type = choco_codec<Q>;
};
}  // namespace detail

//! Bytes and messages this mixer sent (point-to-point payload only).
struct gossip_stats {
  std::uint64_t bytes_sent = 0;
  std::uint64_t messages_sent = 0;
  std::uint64_t steps = 0;
};

template <class Topology, class Compressor = exact_mixing, class Comm = ThreadComm>
class GossipMixer {
  static_assert(diagnose_topology<Topology>());
  static_assert(diagnose_point_to_point<Comm>(),
                "commpact::GossipMixer needs a point-to-point communicator (send/recv with neighbours).");

 public:
  using policy = gossip_policy_t<Compressor>;
  static_assert(std::is_same_v<policy, exact_mixing> || detail::is_power_gossip<policy>::value ||
                    detail::is_choco<policy>::value,
                "commpact::GossipMixer: the second parameter must be exact_mixing, power_gossip<R>, "
                "choco_gossip<choco_topk or choco_sign>, Dense<C> or PowerCompressor<R, C>.");

  GossipMixer(Comm comm, Topology topo, tensor_layout layout, policy pol = {})
      : comm_(std::move(comm)), topo_(std::move(topo)), layout_(std::move(layout)), pol_(pol) {
    require(static_cast<int>(topo_.size()) == comm_.size(), "commpact::GossipMixer: the topology has ",
            static_cast<int>(topo_.size()), " ranks but the communicator has ", comm_.size(),
            "; build the topology for comm.size() ranks (e.g. Ring(comm.size())).");
    detail::check_layout(layout_, "commpact::GossipMixer");
    require(!layout_.empty(), "commpact::GossipMixer: the layout is empty; list the shapes of the tensors in the "
                              "flat parameter buffer (a single vector {n} is fine for D-PSGD and CHOCO).");
    n_ = static_cast<std::size_t>(detail::layout_numel(layout_));
    const int me = comm_.rank();
    for (int j : topo_.neighbors(me)) nb_.push_back(static_cast<int>(j));
    self_w_ = static_cast<double>(topo_.weight(me, me));
    for (int j : nb_) w_.push_back(static_cast<double>(topo_.weight(me, j)));
    send_.resize(nb_.size());
    recv_.resize(nb_.size());
    if constexpr (detail::is_power_gossip<policy>::value) setup_power();
    if constexpr (detail::is_choco<policy>::value) setup_choco();
    if constexpr (std::is_same_v<policy, exact_mixing>) acc_.assign(n_, 0.0);
    std::vector<std::int64_t> words = {mode_id(), static_cast<std::int64_t>(comm_.size())};
    if constexpr (detail::is_power_gossip<policy>::value) words.push_back(policy::rank);
    for (const auto& s : layout_) {
      words.push_back(s.rows);
      words.push_back(s.cols);
    }
    for (int r = 0; r < comm_.size(); ++r)
      for (int j : topo_.neighbors(r)) words.push_back(static_cast<std::int64_t>(r) * comm_.size() + j);
    hash_ = detail::hash_words(words);
  }

  //! One gossip round on the flat parameter buffer x (in place).
  void mix(std::span<float> x) {
    require(x.size() == n_, "commpact::GossipMixer::mix: rank ", comm_.rank(), " passed ", x.size(),
            " floats but the registered shapes hold ", n_, "; pass the whole flat parameter buffer.");
    if (!checked_) {
      require_same(comm_, hash_,
                   "the GossipMixer setup (a hash of the mode, the layout and the topology's edges; build the "
                   "same mixer on every rank)");
      checked_ = true;
    }
    if constexpr (std::is_same_v<policy, exact_mixing>) mix_exact(x);
    else if constexpr (detail::is_power_gossip<policy>::value) mix_power(x);
    else mix_choco(x);
    ++stats_.steps;
  }

  //! Appends the mixer's state: step count, PowerGossip's shared factors per edge, or
  //! CHOCO's public copies. load_state() restores it into a mixer built the same way on
  //! the same rank (a state from another setup raises mismatch_error, a truncated one
  //! wire_error).
  void save_state(std::vector<std::byte>& out) const {
    const std::int64_t head[4] = {state_magic, hash_, comm_.rank(), static_cast<std::int64_t>(stats_.steps)};
    put(out, head, sizeof(head));
    visit_state(*this, [&](const std::vector<float>& v) { put(out, v.data(), v.size() * sizeof(float)); });
  }

  void load_state(std::span<const std::byte> in) {
    std::int64_t head[4];
    std::size_t need = sizeof(head);
    visit_state(*this, [&](const std::vector<float>& v) { need += v.size() * sizeof(float); });
    require<wire_error>(in.size() >= sizeof(head), "commpact::GossipMixer::load_state: ", in.size(),
                        " bytes cannot hold the header; pass what save_state() wrote.");
    std::memcpy(head, in.data(), sizeof(head));
    require<wire_error>(head[0] == state_magic, "commpact::GossipMixer::load_state: not a GossipMixer state.");
    require<mismatch_error>(head[1] == hash_ && head[2] == comm_.rank(),
                            "commpact::GossipMixer::load_state: the state was saved by rank ", head[2],
                            " of a mixer with setup hash ", head[1], "; this is rank ", comm_.rank(),
                            " with hash ", hash_, ". Load each rank's own state into the same mode, layout and "
                            "topology.");
    require<wire_error>(in.size() == need, "commpact::GossipMixer::load_state: ", in.size(), " bytes, expected ",
                        need, "; the state is truncated or from another setup.");
    std::size_t off = sizeof(head);
    visit_state(*this, [&](std::vector<float>& v) {
      std::memcpy(v.data(), in.data() + off, v.size() * sizeof(float));
      off += v.size() * sizeof(float);
    });
    stats_.steps = static_cast<std::uint64_t>(head[3]);
  }

  const gossip_stats& stats() const { return stats_; }
  const Topology& topology() const { return topo_; }
  const tensor_layout& layout() const { return layout_; }
  const std::vector<int>& neighbors() const { return nb_; }
  Comm& comm() { return comm_; }
  //! Bytes one call of mix() sends to each neighbour (payload).
  std::size_t message_bytes() const {
    if constexpr (std::is_same_v<policy, exact_mixing>) return 4 * n_;
    else if constexpr (detail::is_power_gossip<policy>::value) return power_msg_bytes(0);
    else return pol_.compressor.max_message_bytes(n_);
  }

 private:
  static constexpr std::int64_t state_magic = 0x31505353474f5347;  // "GSOGSSP1"

  static void put(std::vector<std::byte>& out, const void* p, std::size_t n) {
    const auto* b = static_cast<const std::byte*>(p);
    out.insert(out.end(), b, b + n);
  }

  //! Calls f on every float buffer of the state, in a fixed order (const or not).
  template <class Self, class F>
  static void visit_state(Self& self, F&& f) {
    if constexpr (detail::is_power_gossip<policy>::value) {
      for (auto& edge : self.shared_)
        for (auto& v : edge) f(v);
    } else if constexpr (detail::is_choco<policy>::value) {
      f(self.hat_self_);
      for (auto& v : self.hat_nb_) f(v);
    }
  }

  static constexpr std::int64_t mode_id() {
    if constexpr (std::is_same_v<policy, exact_mixing>) return 1;
    else if constexpr (detail::is_power_gossip<policy>::value) return 2;
    else if constexpr (std::is_same_v<policy, choco_gossip<choco_topk>>) return 3;
    else return 4;
  }

  void send_all() {
    for (std::size_t k = 0; k < nb_.size(); ++k) {
      comm_.send(nb_[k], std::span<const std::byte>(send_[k]));
      stats_.bytes_sent += send_[k].size();
      ++stats_.messages_sent;
    }
  }
  void recv_all() {
    for (std::size_t k = 0; k < nb_.size(); ++k) comm_.recv(nb_[k], recv_[k]);
  }

  // ---- D-PSGD -----------------------------------------------------------------------
  void mix_exact(std::span<float> x) {
    for (std::size_t k = 0; k < nb_.size(); ++k) {
      send_[k].resize(4 * n_);
      std::memcpy(send_[k].data(), x.data(), 4 * n_);
    }
    send_all();
    recv_all();
    for (std::size_t i = 0; i < n_; ++i) acc_[i] = self_w_ * x[i];
    for (std::size_t k = 0; k < nb_.size(); ++k) {
      require<wire_error>(recv_[k].size() == 4 * n_, "commpact::GossipMixer (D-PSGD): rank ", nb_[k], " sent ",
                          recv_[k].size(), " bytes; a model of ", n_, " floats is ", 4 * n_, " bytes.");
      const auto* xj = reinterpret_cast<const float*>(recv_[k].data());
      for (std::size_t i = 0; i < n_; ++i) acc_[i] += w_[k] * static_cast<double>(xj[i]);
    }
    for (std::size_t i = 0; i < n_; ++i) x[i] = static_cast<float>(acc_[i]);
  }

  // ---- PowerGossip ------------------------------------------------------------------
  struct pg_tensor {
    std::size_t offset = 0, rows = 0, cols = 0;
    bool matrix = false;
    std::size_t v_off = 0;  // offset among the vectors (exact part)
  };

  void setup_power() {
    constexpr int R = policy::rank;
    require(std::isfinite(pol_.gamma) && pol_.gamma > 0.0 && pol_.gamma <= 1.0, "commpact::power_gossip: gamma = ",
            pol_.gamma, " must be in (0, 1].");
    std::size_t off = 0, voff = 0;
    for (std::size_t t = 0; t < layout_.size(); ++t) {
      const auto& s = layout_[t];
      pg_tensor pt;
      pt.offset = off;
      pt.rows = static_cast<std::size_t>(s.rows);
      pt.cols = static_cast<std::size_t>(s.cols);
      pt.matrix = !s.is_vector();
      if (pt.matrix) {
        require(R <= std::min(s.rows, s.cols), "commpact::GossipMixer<power_gossip<", R, ">>: tensor ", t, " (",
                s.rows, " x ", s.cols, ") has min(n, m) = ", std::min(s.rows, s.cols), " < Rank = ", R,
                "; a rank-r factor needs r <= min(n, m). Lower Rank, or describe the tensor as a vector {",
                s.numel(), "} so that it is mixed exactly.");
      } else {
        pt.v_off = voff;
        voff += pt.rows * pt.cols;
      }
      off += pt.rows * pt.cols;
      pg_.push_back(pt);
    }
    n_vec_ = voff;
    // Per edge: the shared factor of every matrix (max(n, m) x R, used as n x R or m x R).
    shared_.resize(nb_.size());
    diff_.resize(nb_.size());
    for (std::size_t k = 0; k < nb_.size(); ++k) {
      for (std::size_t t = 0; t < pg_.size(); ++t) {
        if (!pg_[t].matrix) continue;
        std::vector<float> f(std::max(pg_[t].rows, pg_[t].cols) * R, 0.0f);
        host::fill_gaussian(std::span<float>(f.data(), pg_[t].rows * R), edge_seed(k, t, ~0ull, 0));
        shared_[k].push_back(std::move(f));
        diff_[k].emplace_back(std::max(pg_[t].rows, pg_[t].cols) * R, 0.0f);
      }
    }
  }

  std::uint64_t edge_seed(std::size_t k, std::size_t t, std::uint64_t step, std::uint64_t col) const {
    const auto lo = static_cast<std::uint64_t>(std::min(comm_.rank(), nb_[k]));
    const auto hi = static_cast<std::uint64_t>(std::max(comm_.rank(), nb_[k]));
    return host::mix_seed(pol_.seed ^ (lo << 32 | hi), t, step, col);
  }

  //! Bytes of one PowerGossip message in phase `phase` (0: m x r projections, 1: n x r).
  std::size_t power_msg_bytes(int phase) const {
    std::size_t f = n_vec_;
    for (const auto& pt : pg_)
      if (pt.matrix) f += (phase == 0 ? pt.cols : pt.rows) * static_cast<std::size_t>(policy::rank);
    return 4 * f;
  }

  void mix_power(std::span<float> x) {
    constexpr std::size_t R = static_cast<std::size_t>(policy::rank);
    const int phase = static_cast<int>(stats_.steps % 2);  // 0: shared is n x r; 1: shared is m x r
    const int me = comm_.rank();
    // 1. Orthonormalise the shared factors and build each neighbour's message.
    for (std::size_t k = 0; k < nb_.size(); ++k) {
      auto& msg = send_[k];
      msg.resize(power_msg_bytes(phase));
      auto* out = reinterpret_cast<float*>(msg.data());
      std::size_t mi = 0;
      for (std::size_t t = 0; t < pg_.size(); ++t) {
        const auto& pt = pg_[t];
        if (!pt.matrix) continue;
        float* s = shared_[k][mi++].data();
        const std::size_t len = phase == 0 ? pt.rows : pt.cols;  // length of the shared columns
        orthonormalize_shared(s, len, k, t);
        const float* X = x.data() + pt.offset;  // row-major rows x cols
        if (phase == 0) {
          // q = X^T s: cols x R, column-major
          for (std::size_t c = 0; c < R; ++c) {
            float* q = out + c * pt.cols;
            std::vector<double>& acc = dacc_;
            acc.assign(pt.cols, 0.0);
            for (std::size_t i = 0; i < pt.rows; ++i) {
              const double si = s[c * len + i];
              const float* row = X + i * pt.cols;
              for (std::size_t j = 0; j < pt.cols; ++j) acc[j] += si * row[j];
            }
            for (std::size_t j = 0; j < pt.cols; ++j) q[j] = static_cast<float>(acc[j]);
          }
          out += pt.cols * R;
        } else {
          // q = X s: rows x R, column-major
          for (std::size_t c = 0; c < R; ++c) {
            float* q = out + c * pt.rows;
            const float* sc = s + c * len;
            for (std::size_t i = 0; i < pt.rows; ++i) {
              const float* row = X + i * pt.cols;
              double a = 0.0;
              for (std::size_t j = 0; j < pt.cols; ++j) a += static_cast<double>(row[j]) * sc[j];
              q[i] = static_cast<float>(a);
            }
          }
          out += pt.rows * R;
        }
      }
      for (const auto& pt : pg_)
        if (!pt.matrix) std::memcpy(out + pt.v_off, x.data() + pt.offset, 4 * pt.rows * pt.cols);
    }
    send_all();
    recv_all();
    // 2. Vectors: exact D-PSGD mixing, from the values before this step's update.
    if (n_vec_) {
      vacc_.resize(n_vec_);
      for (const auto& pt : pg_)
        if (!pt.matrix)
          for (std::size_t i = 0; i < pt.rows * pt.cols; ++i) vacc_[pt.v_off + i] = self_w_ * x[pt.offset + i];
    }
    const std::size_t bytes = power_msg_bytes(phase);
    for (std::size_t k = 0; k < nb_.size(); ++k) {
      require<wire_error>(recv_[k].size() == bytes, "commpact::GossipMixer (PowerGossip): rank ", nb_[k], " sent ",
                          recv_[k].size(), " bytes; this step's message is ", bytes, " bytes.");
      const auto* mine = reinterpret_cast<const float*>(send_[k].data());
      const auto* theirs = reinterpret_cast<const float*>(recv_[k].data());
      const bool lower = me < nb_[k];
      const float* q_low = lower ? mine : theirs;
      const float* q_high = lower ? theirs : mine;
      const double coef = (lower ? 1.0 : -1.0) * pol_.gamma * w_[k];
      std::size_t pos = 0, mi = 0;
      for (std::size_t t = 0; t < pg_.size(); ++t) {
        const auto& pt = pg_[t];
        if (!pt.matrix) continue;
        float* s = shared_[k][mi].data();
        float* d = diff_[k][mi].data();
        ++mi;
        const std::size_t dl = phase == 0 ? pt.cols : pt.rows;  // length of d's columns
        for (std::size_t i = 0; i < dl * R; ++i) d[i] = q_high[pos + i] - q_low[pos + i];
        pos += dl * R;
        // Update X += coef * (phase 0: s d^T; phase 1: d s^T), n x m row-major.
        float* X = x.data() + pt.offset;
        const float* left = phase == 0 ? s : d;   // n x R
        const float* right = phase == 0 ? d : s;  // m x R
        for (std::size_t i = 0; i < pt.rows; ++i) {
          float* row = X + i * pt.cols;
          for (std::size_t j = 0; j < pt.cols; ++j) {
            double u = 0.0;
            for (std::size_t c = 0; c < R; ++c)
              u += static_cast<double>(left[c * pt.rows + i]) * static_cast<double>(right[c * pt.cols + j]);
            row[j] = static_cast<float>(static_cast<double>(row[j]) + static_cast<float>(coef * u));
          }
        }
      }
      if (n_vec_) {
        const float* v = theirs + pos;
        for (std::size_t i = 0; i < n_vec_; ++i) vacc_[i] += w_[k] * static_cast<double>(v[i]);
      }
    }
    for (const auto& pt : pg_)
      if (!pt.matrix)
        for (std::size_t i = 0; i < pt.rows * pt.cols; ++i) x[pt.offset + i] = static_cast<float>(vacc_[pt.v_off + i]);
    // 3. The difference becomes the next shared factor (both ends hold the same d).
    for (std::size_t k = 0; k < nb_.size(); ++k) std::swap(shared_[k], diff_[k]);
  }

  //! Orthonormalises a shared factor (len x R); zero columns are redrawn from the edge
  //! seed and the step, identically at both ends.
  void orthonormalize_shared(float* s, std::size_t len, std::size_t k, std::size_t t) {
    constexpr std::size_t R = static_cast<std::size_t>(policy::rank);
    int kept = host::orthonormalize_columns(s, len, R, len);
    for (int attempt = 0; kept < static_cast<int>(R) && attempt < 2; ++attempt) {
      for (std::size_t c = 0; c < R; ++c)
        if (host::column_is_zero(s, len, c, len))
          host::fill_gaussian(std::span<float>(s + c * len, len), edge_seed(k, t, stats_.steps + 1, c + 1 + attempt * R));
      kept = host::orthonormalize_columns(s, len, R, len);
    }
  }

  // ---- CHOCO ------------------------------------------------------------------------
  void setup_choco() {
    pol_.compressor.check();
    require(std::isfinite(pol_.gamma) && pol_.gamma > 0.0 && pol_.gamma <= 1.0, "commpact::choco_gossip: gamma = ",
            pol_.gamma, " must be in (0, 1] (CHOCO's consensus step size).");
    codec_.emplace(pol_.compressor);
    hat_self_.assign(n_, 0.0f);
    hat_nb_.assign(nb_.size(), std::vector<float>(n_, 0.0f));
    diffv_.assign(n_, 0.0f);
    qself_.assign(n_, 0.0f);
    acc_.assign(n_, 0.0);
  }

  void mix_choco(std::span<float> x) {
    // q_i = Q(x_i - x_hat_i), sent to every neighbour.
    for (std::size_t i = 0; i < n_; ++i) diffv_[i] = x[i] - hat_self_[i];
    codec_->encode(std::span<const float>(diffv_), send_.empty() ? scratch_msg_ : send_[0],
                     std::span<float>(qself_));
    for (std::size_t k = 1; k < nb_.size(); ++k) send_[k] = send_[0];
    send_all();
    recv_all();
    for (std::size_t i = 0; i < n_; ++i) hat_self_[i] += qself_[i];
    for (std::size_t k = 0; k < nb_.size(); ++k)
      codec_->decode_add(std::span<const std::byte>(recv_[k]), std::span<float>(hat_nb_[k]), nb_[k]);
    // x_i += gamma sum_j w_ij (x_hat_j - x_hat_i)
    for (std::size_t i = 0; i < n_; ++i) acc_[i] = 0.0;
    for (std::size_t k = 0; k < nb_.size(); ++k) {
      const float* h = hat_nb_[k].data();
      for (std::size_t i = 0; i < n_; ++i)
        acc_[i] += w_[k] * (static_cast<double>(h[i]) - static_cast<double>(hat_self_[i]));
    }
    for (std::size_t i = 0; i < n_; ++i) x[i] = static_cast<float>(x[i] + pol_.gamma * acc_[i]);
  }

  Comm comm_;
  Topology topo_;
  tensor_layout layout_;
  policy pol_;
  std::size_t n_ = 0;
  std::vector<int> nb_;
  std::vector<double> w_;
  double self_w_ = 1.0;
  std::vector<std::vector<std::byte>> send_, recv_;
  std::vector<double> acc_;
  bool checked_ = false;
  std::int64_t hash_ = 0;
  gossip_stats stats_;
  // PowerGossip
  std::vector<pg_tensor> pg_;
  std::size_t n_vec_ = 0;
  std::vector<std::vector<std::vector<float>>> shared_, diff_;
  std::vector<double> vacc_, dacc_;
  // CHOCO
  std::optional<typename detail::choco_codec_for<policy>::type> codec_;
  std::vector<float> hat_self_, diffv_, qself_;
  std::vector<std::vector<float>> hat_nb_;
  std::vector<std::byte> scratch_msg_;
};

template <class Topology, class Policy, class Comm>
GossipMixer(Comm, Topology, tensor_layout, Policy) -> GossipMixer<Topology, Policy, Comm>;
template <class Topology, class Comm>
GossipMixer(Comm, Topology, tensor_layout) -> GossipMixer<Topology, exact_mixing, Comm>;

//! Consensus distance (1/P) sum_i ||x_i - x_bar||^2 over the ranks of comm (collective;
//! two allreduces in double). A diagnostic for tests and benchmarks.
template <Communicator C>
double consensus_distance(C& comm, std::span<const float> x) {
  std::vector<double> mean(x.begin(), x.end());
  comm.allreduce(std::span<double>(mean), reduce_op::sum);
  const double inv = 1.0 / comm.size();
  double local = 0.0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double d = static_cast<double>(x[i]) - mean[i] * inv;
    local += d * d;
  }
  comm.allreduce(std::span<double>(&local, 1), reduce_op::sum);
  return local * inv;
}

}  // namespace commpact
