// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file ops.hpp
//! ops<host_space>: the reference kernel table (kernels/ops.hpp), the host kernels
//! called at once. The executor is empty; nothing is queued.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>

#include "../../error.hpp"
#include "../../space/host.hpp"
#include "../ops.hpp"
#include "../status.hpp"
#include "commit.hpp"
#include "linear_vote.hpp"
#include "sparse_tree.hpp"
#include "topk.hpp"
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
  static void clip_scale(exec, span<const float> g, float clip_norm, int P, span<float> scale) {
    double s = 0;
    for (float x : g) s += static_cast<double>(x) * x;
    const double norm = std::sqrt(s);
    const double bound = static_cast<double>(clip_norm) / std::sqrt(static_cast<double>(P));
    scale[0] = (clip_norm <= 0.0f || !std::isfinite(norm) || norm <= bound) ? 1.0f : static_cast<float>(bound / norm);
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
};

}  // namespace commpact
