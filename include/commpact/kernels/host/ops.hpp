// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file ops.hpp
//! ops<host_space>: the reference kernel table (kernels/ops.hpp), the host kernels
//! called at once. The executor is empty; nothing is queued.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <type_traits>

#include "../../concepts/codec.hpp"
#include "../../error.hpp"
#include "../../space/host.hpp"
#include "../../wire/codec_frame.hpp"
#include "../clip.hpp"
#include "../ops.hpp"
#include "../power_products.hpp"
#include "../status.hpp"
#include "cast.hpp"
#include "choco.hpp"
#include "commit.hpp"
#include "sgd.hpp"
#include "lowrank.hpp"
#include "orthogonalize.hpp"
#include "gossip.hpp"
#include "oktopk.hpp"
#include "linear_vote.hpp"
#include "power_gossip.hpp"  // PowerGossip
#include "sparse_tree.hpp"
#include "topk.hpp"
#include "tree_block.hpp"
#include "vector_ops.hpp"

namespace commpact {

template <>
struct ops<host_space> {
  using exec = host_space::exec;
  template <class T>
  using span = std::span<T>;
  using tree_views = host_tree_views;
  using topk_workspace = host::topk_workspace;
  using merge_workspace = host::merge_workspace;
  //! What the codec rows keep between calls: nothing on the host (the codec itself knows
  //! where its last encode put its indices).
  template <class Codec>
  struct codec_workspace {};
  //! What CHOCO's codec rows keep between calls: nothing on the host.
  template <class Codec>
  struct choco_workspace {};

  template <class T>
  static void fill(exec, span<T> v, T x) {
    std::fill(v.begin(), v.end(), x);
  }
  template <class U, class T>
    requires std::is_same_v<std::remove_const_t<U>, T>
  static void copy(exec, span<U> src, span<T> dst) {
    require(src.size() == dst.size(), "commpact::ops::copy: ", src.size(), " values into ", dst.size(),
            "; pass spans of equal length.");
    std::copy(src.begin(), src.end(), dst.begin());
  }
  template <class U, class T>
  static void to_host(exec e, span<U> src, std::span<T> host) {
    copy(e, src, host);
  }
  template <class U, class T>
  static void from_host(exec e, std::span<U> host, span<T> dst) {
    copy(e, host, dst);
  }
  static void mean(exec, span<float> v, int P, span<std::uint32_t> status) {
    if (host::mean_checked(v, P) != v.size()) status[0] |= status_nonfinite;
  }
  static void mean_into(exec, span<const float> src, span<float> dst, int P, span<std::uint32_t> status) {
    if (host::first_nonfinite(src) != src.size()) status[0] |= status_nonfinite;
    else (void)host::mean_checked(src, dst, P);
  }
  static void frame_gate(exec, span<const float> blocks, std::size_t block_floats, span<float> sum,
                         span<std::uint32_t> status) {
    const std::size_t P = block_floats ? blocks.size() / block_floats : 0;
    // A named reader marked for both sides, not a host lambda: nvcc warns (#20013, #20014)
    // in a user's .cu file where headers_clean's __host__ __device__ body calls a host one.
    struct word_at {
      const float* p;
      COMMPACT_HOST_DEVICE std::uint32_t operator()(std::size_t i) const {
        std::uint32_t w;
        std::memcpy(&w, p + i, 4);
        return w;
      }
    };
    if (frame::headers_clean(word_at{blocks.data()}, block_floats, P)) return;
    status[0] |= status_wire;
    if (!sum.empty()) sum[0] = std::numeric_limits<float>::quiet_NaN();
  }
  static void ef_accumulate(exec, span<float> acc, span<float> u_next, span<const float> u, span<const float> r,
                            span<const float> g, float m, span<const float> scale, span<std::uint32_t> status) {
    std::size_t bad;
    if (m > 0.0f)
      bad = scale.empty() ? host::ef_accumulate_momentum(acc, u_next, u, r, g, m)
                          : host::ef_accumulate_momentum(acc, u_next, u, r, g, m, scale[0]);
    else
      bad = scale.empty() ? host::ef_accumulate(acc, r, g) : host::ef_accumulate(acc, r, g, scale[0]);
    if (bad != acc.size()) status[0] |= status_nonfinite;
  }
  static void sub(exec, span<float> y, span<const float> x) { host::sub(y, x); }
  //! DGC's local gradient clipping: scale[0] = bound / ||g|| when ||g|| > bound =
  //! clip_norm / sqrt(P), else 1 (also when the norm is not finite: the accumulate's
  //! finiteness check reports that).
  //! ||g||^2 in double in kernels/fixed_sum.hpp's shape (kernels/clip.hpp, the device's order).
  static void clip_scale(exec, span<const float> g, float clip_norm, int P, span<float> scale) {
    scale[0] = clip::factor(clip_norm > 0.0f ? clip::host_sumsq(g) : 0.0, clip_norm, P);
  }
  static void topk_abs(exec, span<const float> v, std::size_t k, span<std::int32_t> idx, span<float> val,
                       host::topk_workspace& ws) {
    host::topk_abs(v, k, idx, val, ws);
  }
  static void scatter_mean(exec, span<float> out, span<const std::int32_t> idx, span<const float> val, int P) {
    host::scatter_into_zeroed(out, idx, val, static_cast<float>(P));
  }
  static void zero_delivered(exec, span<float> residual, span<float> velocity, span<const std::int32_t> idx,
                             span<const std::uint8_t> alive) {
    host::zero_delivered(residual, velocity, idx, alive);
  }

  // ---- gTop-k's tree (kernels/host/sparse_tree.hpp); meta is one element ------------
  static void tree_local(exec, span<sparse_tree_meta> m, std::int64_t n, std::int64_t k, std::uint16_t flags,
                         span<float> acc, span<float> u_next, span<const float> residual, span<const float> velocity,
                         span<const float> g, float momentum, span<const float> scale, const tree_views& b,
                         host::topk_workspace& ws) {
    host::tree::local(m[0], n, k, flags, acc, u_next, residual, velocity, g, momentum, scale, b, ws);
  }
  static void tree_payload(exec, span<const sparse_tree_meta> m, tree_stage s, span<std::byte> frame,
                           const tree_views& b) {
    host::tree::payload(m[0], s, frame, b);
  }
  static void tree_absorb(exec, span<sparse_tree_meta> m, tree_stage s, bool lower, int peer,
                          span<const std::byte> frame, const tree_views& b, host::merge_workspace& mws) {
    host::tree::absorb(m[0], s, lower, peer, frame, b, mws);
  }
  static void tree_scatter(exec, span<const sparse_tree_meta> m, span<float> out, const tree_views& b, int P) {
    host::tree::scatter(m[0], out, b, P);
  }
  static void tree_zero_delivered(exec, span<const sparse_tree_meta> m, span<float> residual, span<float> velocity,
                                  const tree_views& b) {
    host::tree::zero_delivered(m[0], residual, velocity, b);
  }

  // ---- training (DataParallel, Sgd) -------------------------------------------------
  static void add(exec, span<float> y, span<const float> x) { host::add(y, x); }
  static void sgd_step(exec, span<float> x, span<float> v, span<const float> g, float lr, float mu, float wd) {
    host::sgd_step(x, v, g, lr, mu, wd);
  }

  // ---- PowerCompressor (PowerSGD; kernels/host/lowrank.hpp, orthogonalize.hpp) -------
  static void check_finite(exec, span<const float> v, span<std::uint32_t> status) {
    if (host::first_nonfinite(v) != v.size()) status[0] |= status_nonfinite;
  }
  static void copy_if_clear(exec, span<const float> src, span<float> dst, span<const std::uint32_t> status) {
    for (std::uint32_t w : status)
      if (w != 0) return;
    copy(exec{}, src, dst);
  }
  // The host always runs lowrank.hpp's exact order: `products` (power_products.hpp)
  // changes nothing here.
  static void lowrank_prepare(exec, std::size_t, std::size_t, std::size_t, power_products) {}
  static void lowrank_project(exec, span<const float> g, span<const float> res, span<float> M, std::size_t n,
                              std::size_t m, span<const float> Q, std::size_t r, span<float> P,
                              power_products = power_products::exact) {
    host::lowrank_project_into(g, res, M, n, m, Q, r, P);
  }
  static void lowrank_back_project(exec, span<const float> M, std::size_t n, std::size_t m, span<const float> P,
                                   std::size_t r, span<float> Q, power_products = power_products::exact) {
    host::lowrank_back_project(M, n, m, P, r, Q);
  }
  static void lowrank_approx_residual(exec, span<float> g, span<float> M, std::size_t n, std::size_t m,
                                      span<const float> P, span<const float> Q, std::size_t r,
                                      span<const std::uint32_t> status, power_products = power_products::exact) {
    for (std::uint32_t w : status)
      if (w != 0) return;
    host::lowrank_approx_residual_inplace(g, M, n, m, P, Q, r);
  }
  static void orthonormalize(exec, span<float> a, std::size_t rows, std::size_t cols) {
    (void)host::orthonormalize_columns(a, rows, cols);
  }
  static void gaussian(exec, span<float> v, std::uint64_t seed) { host::fill_gaussian(v, seed); }
  static void redraw_zero_columns(exec, span<float> q, std::size_t rows, std::size_t cols, std::uint64_t seed,
                                  std::uint64_t tensor, std::uint64_t step) {
    for (std::size_t j = 0; j < cols; ++j)
      if (host::column_is_zero(q.data(), rows, j, rows))
        host::fill_gaussian(q.subspan(j * rows, rows), host::mix_seed(seed, tensor, step, j + 1));
  }

  // ---- GossipMixer (kernels/host/gossip.hpp); words: the round's 3 status words (6 with
  // the agreement's) --------------------------------------------------------------------
  static void gossip_check(exec, span<const float> x, bool on, span<std::int64_t> words) {
    host::gossip::check(x, on, words);
  }
  //! words: status_words + agreement_words.
  static void gossip_agree_begin(exec, std::int64_t round, span<std::int64_t> words) {
    require_agreement_words(words.size(), "gossip_agree_begin");
    host::gossip::agree_begin(round, words);
  }
  static void gossip_agree_end(exec, span<std::int64_t> words) {
    require_agreement_words(words.size(), "gossip_agree_end");
    host::gossip::agree_end(words);
  }
  static void require_agreement_words(std::size_t got, const char* row) {
    constexpr std::size_t need = host::gossip::status_words + host::gossip::agreement_words;
    require(got >= need, "commpact::ops::", row, ": ", got, " words; pass ", need, ".");
  }
  static void gossip_pack(exec, span<const float> x, span<std::byte> msg) { host::gossip::pack(x, msg); }
  static void gossip_mix(exec, span<float> x, span<const std::byte> recv, span<const double> w, double self_w,
                         span<double> acc, span<const std::int64_t> words) {
    host::gossip::mix_exact(x, recv, w, self_w, acc, words);
  }
  static void choco_update(exec, span<float> x, span<float> hat_self, span<const float> q_self, span<float> hat_nb,
                           span<const float> q_nb, span<const double> w, double gamma, span<double> acc,
                           span<const std::int64_t> words) {
    host::gossip::choco_update(x, hat_self, q_self, hat_nb, q_nb, w, gamma, acc, words);
  }

  // ---- CastAllreduce (kernels/host/cast.hpp) ----------------------------------------
  template <class Cast>
  static void cast_encode(exec, span<const float> g, span<const float> r, span<std::uint16_t> codes,
                          span<float> cand) {
    host::cast_encode<Cast>(g, r, codes, cand);
  }
  template <class Cast>
  static void cast_add(exec, span<const std::uint16_t> in, span<std::uint16_t> mine) {
    host::cast_add<Cast>(in, mine);
  }
  template <class Cast>
  static void cast_decode_mean(exec, span<const std::uint16_t> sums, span<float> out, int P,
                               span<std::uint32_t> status) {
    if (!host::cast_decode_mean<Cast>(sums, out, P)) status[0] |= status_nonfinite;
  }

  // ---- OkTopK (kernels/host/oktopk.hpp) ------------------------------------------------
  static void oktopk_local(exec, span<const float> acc, std::size_t k, span<const std::uint32_t> status,
                           span<std::int32_t> idx, span<float> val, host::topk_workspace& ws) {
    host::oktopk::local(acc, k, status, idx, val, ws);
  }
  static void oktopk_begin(exec, span<const std::byte> block, std::int64_t n, std::int64_t k, span<std::int32_t> idx,
                           span<float> val, span<std::uint32_t> status) {  // SparseReduceScatter
    host::oktopk::begin(block, n, k, idx, val, status);
  }
  static void oktopk_frames(exec, span<const std::int32_t> idx, span<const float> val,
                            span<const std::int64_t> bounds, span<const std::uint32_t> status, std::uint32_t flags,
                            std::int64_t n, std::int64_t k, std::int64_t step, span<std::byte> hdr,
                            span<std::byte> pay) {
    host::oktopk::frames(idx, val, bounds, status, flags, n, k, step, hdr, pay);
  }
  static void oktopk_region_sum(exec, span<const std::byte> hdr_out, span<const std::byte> pay_out,
                                span<const std::byte> hdr_in, span<const std::byte> pay_in, int me, std::int64_t lo,
                                std::int64_t hi, span<float> reg, span<std::uint8_t> touched,
                                span<std::uint32_t> status) {
    host::oktopk::region_sum(hdr_out, pay_out, hdr_in, pay_in, me, lo, hi, reg, touched, status);
  }
  static void oktopk_mags(exec, span<const float> reg, span<const std::uint8_t> touched, span<float> mags,
                          span<float> ws) {
    host::oktopk::mags(reg, touched, mags, ws);
  }
  static void oktopk_theta(exec, span<const float> all, std::size_t k, int me, span<float> theta,
                           span<std::uint32_t> limit) {
    require(k >= 1 && all.size() % k == 0 && me >= 0 && static_cast<std::size_t>(me) < all.size() / k &&
                !theta.empty() && !limit.empty(),
            "commpact::ops::oktopk_theta: k = ", k, ", ", all.size(), " values, rank ", me, ", theta ", theta.size(),
            ", limit ", limit.size(), "; pass P blocks of k >= 1 values, 0 <= me < P, one theta and one limit.");
    host::oktopk::theta(all, k, me, theta, limit);
  }
  static void oktopk_select(exec, span<const float> reg, span<const std::uint8_t> touched, span<const float> theta,
                            span<const std::uint32_t> limit, std::int64_t lo, int me, span<std::byte> block,
                            span<std::int32_t> ws) {
    host::oktopk::select(reg, touched, theta, limit, lo, me, block, ws);
  }
  static void oktopk_output(exec, span<const std::byte> blocks, span<const std::int64_t> bounds, int me,
                            span<float> grad, span<std::uint32_t> status) {
    host::oktopk::output(blocks, bounds, me, grad, status);
  }
  static void oktopk_clear_selected(exec, span<float> acc, span<const std::int32_t> idx, span<const std::byte> blocks,
                                    span<const std::int64_t> bounds, span<const std::uint32_t> status,
                                    span<std::int64_t> next) {
    host::oktopk::clear_selected(acc, idx, blocks, bounds, status, next);
  }

  // ---- LinearCompressor (Allreduce<C>) and MajorityVote (Vote<C>): kernels/host/linear_vote.hpp
  template <class K>
  static void linear_encode(exec, K& codec, span<const float> acc, span<float> block,
                            span<const std::uint32_t> status) {
    host::linear_encode(codec, acc, block, status);
  }
  template <class K>
  static void linear_decode(exec, const K& codec, span<float> block, span<float> out, int P,
                            span<std::uint32_t> status) {
    host::linear_decode(codec, block, out, P, status);
  }
  template <class K>
  static void linear_feedback(exec, K& codec, span<float> acc, span<float> approx, span<float> dense) {
    host::linear_feedback(codec, acc, approx, dense);
  }
  static void signum_update(exec, span<float> next, span<const float> m, span<const float> g, float beta,
                            span<std::uint32_t> status) {
    host::signum_update(next, m, g, beta, status);
  }
  static void sign_vote(exec, span<const float> blocks, std::size_t block_floats, bool scaled, span<float> out,
                        span<std::uint32_t> status) {
    host::sign_vote(blocks, block_floats, scaled, out, status);
  }

  // ---- a Codec's frame (CodecCompressor, MajorityVote, Allgather<C>; wire/codec_frame.hpp) ----
  template <class Codec>
  static void codec_encode_frame(exec, codec_workspace<Codec>&, Codec& codec, span<const float> acc,
                                 span<float> block, frame::header h, span<float> approx,
                                 span<const std::uint32_t> status) {
    const auto b = std::as_writable_bytes(block);
    const auto payload = b.subspan(frame::header_bytes);
    h.payload = 0;
    if (status[0] & status_nonfinite) h.flags = static_cast<std::uint16_t>(h.flags | frame::nonfinite_input);
    if (h.flags == 0) {
      const std::size_t len = codec.encode(acc, payload, approx);
      require(len <= payload.size(), "commpact::CodecCompressor: the codec wrote ", len,
              " bytes, above its max_encoded_bytes; fix the codec's max_encoded_bytes().");
      h.payload = static_cast<std::uint32_t>(len);
    }
    std::fill(payload.begin() + h.payload, payload.end(), std::byte{0});
    frame::write(b, h);
  }
  template <class Codec>
  static void codec_decode_sum(exec, const Codec& codec, span<const float> blocks, std::size_t block_floats,
                               span<float> sum, span<std::uint32_t> status = {}) {
    std::fill(sum.begin(), sum.end(), 0.0f);
    const std::size_t P = block_floats == 0 ? 0 : blocks.size() / block_floats;
    try {
      for (std::size_t r = 0; r < P; ++r) {  // rank order: the same float additions on every rank
        const auto b = std::as_bytes(blocks.subspan(r * block_floats, block_floats));
        // The headers may not have been checked yet (CodecCompressor decodes before the
        // host reads them): read_header bounds the payload by the block, or raises.
        const std::uint32_t len = frame::read(b, static_cast<int>(r)).payload;
        codec.decode_add(b.subspan(frame::header_bytes, len), sum);
      }
    } catch (const error&) {
      if (status.empty()) throw;  // a caller without a status word gets the decoder's error
      // As on the CUDA space: the status says it, and a NaN in the sum keeps the mean
      // from writing the caller's output.
      status[0] |= status_wire;
      if (!sum.empty()) sum[0] = std::numeric_limits<float>::quiet_NaN();
    }
  }
  template <class Codec>
  static void codec_clear_delivered(exec, const codec_workspace<Codec>&, const Codec& codec, span<float> residual,
                                    span<float> velocity) {
    if constexpr (req::codec_has_delivered<Codec>) host::zero_delivered(residual, velocity, codec.delivered(), {});
  }

  // ---- CHOCO-SGD's codec (GossipMixer; kernels/host/choco.hpp) ------------------------
  template <class Codec>
  static void choco_encode(exec, choco_workspace<Codec>&, Codec& codec, span<const float> x, span<const float> hat,
                           span<float> diff, span<std::byte> msg, span<float> q, span<std::int64_t> words,
                           bool framed) {
    host::choco::encode(codec, x, hat, diff, msg, q, words, framed);
  }
  template <class Codec>
  static void choco_decode(exec, choco_workspace<Codec>&, const Codec& codec, span<const std::byte> recv,
                           std::size_t msg_bytes, bool framed, span<float> q_nb, span<std::int64_t> words,
                           std::string& why) {
    host::choco::decode(codec, recv, msg_bytes, framed, q_nb, words, why);
  }

  // ---- PowerGossip (kernels/host/power_gossip.hpp); words: the round's 3 status words ----
  static void power_gossip_orthonormalize(exec, span<float> s, std::size_t len, std::size_t r, std::uint64_t seed,
                                          std::uint64_t tensor, std::uint64_t step) {  // PowerGossip
    host::power_gossip::orthonormalize_shared(s, len, r, seed, tensor, step);
  }
  static void power_gossip_update(exec, span<float> X, std::size_t n, std::size_t m, span<const float> S,
                                  span<const float> mine, span<const std::byte> theirs, span<float> d, std::size_t r,
                                  int phase, bool lower, float coef, span<float> upd,
                                  span<const std::int64_t> words) {  // PowerGossip
    host::power_gossip::update(X, n, m, S, mine, theirs, d, r, phase, lower, coef, upd, words);
  }
  static void power_gossip_vectors(exec, span<float> x, span<const std::byte> recv, std::size_t stride,
                                   std::size_t offset, span<const double> w, double self_w, span<double> acc,
                                   span<const std::int64_t> words) {  // PowerGossip
    host::power_gossip::vectors(x, recv, stride, offset, w, self_w, acc, words);
  }

  // ---- TreeMerge<Tree> (kernels/host/tree_block.hpp) ------------------------------------
  static void tree_begin(exec, span<sparse_tree_meta> m, span<const std::byte> block, int self,
                         const tree_views& b) {  // TreeMerge
    host::tree::begin(m[0], block, self, b);
  }
  static void tree_status(exec, span<const sparse_tree_meta> m, span<std::uint32_t> status) {  // TreeMerge
    host::tree::status(m[0], status);
  }
};

}  // namespace commpact
