// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file sparse_tree.hpp
//! The data-plane kernels of gTop-k's tree reduction (compress/compressors/gtopk.hpp), on host
//! memory: the local phase (error-feedback accumulate + top-k), the frame a rank sends
//! at a tree step, the merge of a received frame, and the commit (scatter of the global
//! set as a mean, removal of the delivered entries from the residual). Every decision
//! that depends on data (a non-finite value, a malformed frame, a rank that rejected
//! its input, ranks that disagree on n or k) is recorded in `sparse_tree_meta`, which
//! lives in the space's memory next to the buffers; nothing here throws on data, so the
//! same specification runs as a queued kernel (deferred space) or on a GPU stream.
//! ops<host_space> and ops<deferred_space> (kernels/ops.hpp) call these functions.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>

#include "../../error.hpp"
#include "../../concepts/tree_schedule.hpp"
#include "../../wire/sparse_frame.hpp"
#include "../status.hpp"
#include "commit.hpp"
#include "sparse_merge.hpp"
#include "topk.hpp"
#include "topk_fused.hpp"
#include "vector_ops.hpp"

namespace commpact {

//! The state of one gTop-k step that the data decides (trivially copyable: it lives in
//! the space's memory and the host reads it once, at the step's fence).
struct sparse_tree_meta {
  sparse_wire::header cur{};       //!< flags and n, k ranges of the current (subtree) set
  std::uint32_t cur_count = 0;     //!< entries of the current set
  std::uint32_t mine_count = 0;    //!< this rank's original entries
  std::uint32_t extra_count = 0;   //!< the extra rank's original entries (a core rank with a fold partner)
  std::uint32_t status = 0;        //!< step_status bits (status.hpp)
  std::int32_t wire_peer = -1;     //!< the peer whose frame was malformed (status_wire)
  std::int64_t n = 0, k = 0;       //!< this rank's n and k
  bool healthy() const { return cur.healthy_for(n, k); }
};

//! The buffers of the tree reduction, each at least k entries, as spans of one space.
template <template <class> class Span>
struct sparse_tree_views {
  Span<std::int32_t> mine_idx, cur_idx, oth_idx, out_idx, extra_idx;
  Span<float> cur_val, oth_val, out_val;
  Span<std::uint8_t> mine_alive, extra_alive, mask_in;
  //! The same views through f (a deferred span to its host storage, say).
  template <template <class> class To, class F>
  sparse_tree_views<To> map(F f) const {
    return {f(mine_idx), f(cur_idx), f(oth_idx), f(out_idx), f(extra_idx), f(cur_val), f(oth_val),
            f(out_val),  f(mine_alive), f(extra_alive), f(mask_in)};
  }
};
//! std::span with one template parameter (std::span itself has two, which clang 14 does not
//! accept as a `template <class> class` argument).
template <class T>
using host_span = std::span<T>;
using host_tree_views = sparse_tree_views<host_span>;

//! Bytes of a tree frame for k entries: the sparse set and, on an unfold, the mask.
constexpr std::size_t sparse_tree_frame_bytes(std::size_t k, bool unfold) {
  return sparse_wire::encoded_size(k, unfold ? k : 0);
}

namespace host::tree {

//! Starts a step: meta for (n, k) with `flags` (sparse_wire::flag_failed for a rank
//! that rejected its input). With no flag: acc = residual + g (ef_accumulate; the scale
//! and momentum as error_feedback does), then this rank's top k of |acc|, index-sorted,
//! as its original and current set; a non-finite acc sets flag_nonfinite instead.
inline void local(sparse_tree_meta& m, std::int64_t n, std::int64_t k, std::uint16_t flags, std::span<float> acc,
                  std::span<float> u_next, std::span<const float> residual, std::span<const float> velocity,
                  std::span<const float> g, float momentum, std::span<const float> scale, const host_tree_views& b,
                  topk_workspace& ws) {
  m = {};
  m.n = n, m.k = k;
  m.cur.n_min = m.cur.n_max = n;
  m.cur.k_min = m.cur.k_max = k;
  m.cur.flags = flags;
  if (flags & ~sparse_wire::step_bits) return;
  const float s = scale.empty() ? 1.0f : scale[0];
  const bool have_r = residual.size() == acc.size(), have_u = velocity.size() == acc.size();
  const auto kk = static_cast<std::size_t>(k);
  std::size_t bad;
  if (u_next.empty()) {
    // The fused local phase (topk_fused.hpp): acc = residual + g and the top k of |acc|
    // in one pass over residual and g (an empty residual counts as zeros).
    bad = host::ef_accumulate_topk_abs(acc, have_r ? residual : std::span<const float>{}, g,
                                       s == 1.0f ? std::optional<float>{} : std::optional<float>{s}, kk,
                                       b.mine_idx.first(kk), b.cur_val.first(kk), ws);
    if (bad != acc.size()) {
      m.cur.flags |= sparse_wire::flag_nonfinite;
      m.status |= status_nonfinite;
      return;
    }
    std::copy_n(b.mine_idx.begin(), kk, b.cur_idx.begin());
    std::fill_n(b.mine_alive.begin(), kk, std::uint8_t{1});
    m.mine_count = m.cur_count = static_cast<std::uint32_t>(kk);
    return;
  } else if (have_r && have_u) {
    bad = s == 1.0f ? host::ef_accumulate_momentum(acc, u_next, velocity, residual, g, momentum)
                    : host::ef_accumulate_momentum(acc, u_next, velocity, residual, g, momentum, s);
  } else {  // the first step with momentum: no residual or velocity yet
    for (std::size_t i = 0; i < g.size(); ++i) {
      const float gi = s == 1.0f ? g[i] : g[i] * s;
      u_next[i] = (have_u ? momentum * velocity[i] : momentum * 0.0f) + gi;
      acc[i] = (have_r ? residual[i] : 0.0f) + u_next[i];
    }
    bad = host::first_nonfinite(acc);
  }
  if (bad != acc.size()) {
    m.cur.flags |= sparse_wire::flag_nonfinite;
    m.status |= status_nonfinite;
    return;
  }
  host::topk_abs(acc, kk, b.mine_idx.first(kk), b.cur_val.first(kk), ws);
  std::copy_n(b.mine_idx.begin(), kk, b.cur_idx.begin());
  std::fill_n(b.mine_alive.begin(), kk, std::uint8_t{1});
  m.mine_count = m.cur_count = static_cast<std::uint32_t>(kk);
}

//! The frame this rank sends at step s: its current set (none when the step is no
//! longer healthy), and on an unfold the extra rank's survival mask; zero padding up
//! to the frame's size.
inline void payload(const sparse_tree_meta& m, tree_stage stage, std::span<std::byte> frame, const host_tree_views& b) {
  sparse_wire::header h = m.cur;
  const bool ok = m.healthy();
  const std::size_t c = ok ? m.cur_count : 0;
  std::span<const std::uint8_t> mask{};
  if (stage == tree_stage::unfold_send && ok) mask = std::span<const std::uint8_t>(b.extra_alive).first(m.extra_count);
  h.mask_bits = static_cast<std::uint32_t>(mask.size());
  sparse_wire::encode_frame(frame, h, std::span<const std::int32_t>(b.cur_idx).first(c),
                            std::span<const float>(b.cur_val).first(c), mask);
}

namespace detail {
inline void keep_alive(const sparse_tree_meta& m, std::span<const std::int32_t> cur, std::span<const std::int32_t> orig,
                       std::span<std::uint8_t> alive) {
  std::size_t q = 0;
  for (std::size_t j = 0; j < orig.size(); ++j) {
    while (q < m.cur_count && cur[q] < orig[j]) ++q;
    if (!(q < m.cur_count && cur[q] == orig[j])) alive[j] = 0;
  }
}
inline void poison(sparse_tree_meta& m) { m.cur_count = m.mine_count = m.extra_count = 0; }
}  // namespace detail

//! Merges the frame received from `peer` at step `stage` into the current set. A
//! malformed frame sets status_wire (and wire_peer) and the `failed` flag, so that the
//! frames this rank still sends tell its later partners to abandon the step (they raise
//! peer_failure); this rank raises wire_error after the fence.
inline void absorb(sparse_tree_meta& m, tree_stage stage, bool lower, int peer, std::span<const std::byte> frame,
                   const host_tree_views& b, merge_workspace& mws) {
  if (m.status & status_wire) return;
  sparse_wire::header h;
  try {
    h = sparse_wire::decode_header(frame, true);
  } catch (const wire_error&) {
    m.status |= status_wire, m.wire_peer = peer, m.cur.flags |= sparse_wire::flag_failed, detail::poison(m);
    return;
  }
  m.cur.merge_meta(h);  // at unfold_recv: the final, global flags and ranges
  if (!m.healthy()) {
    detail::poison(m);
    return;
  }
  const auto k = static_cast<std::size_t>(m.k);
  const std::size_t want_mask = stage == tree_stage::unfold_recv ? m.mine_count : 0;
  sparse_wire::header got;
  try {
    got = sparse_wire::decode(frame, {m.n, k, want_mask}, b.oth_idx, b.oth_val, b.mask_in, true);
  } catch (const wire_error&) {
    m.status |= status_wire, m.wire_peer = peer, m.cur.flags |= sparse_wire::flag_failed, detail::poison(m);
    return;
  }
  const std::size_t c = got.count;
  auto oi = std::span<const std::int32_t>(b.oth_idx).first(c);
  auto ov = std::span<const float>(b.oth_val).first(c);
  auto ci = std::span<const std::int32_t>(b.cur_idx).first(m.cur_count);
  auto cv = std::span<const float>(b.cur_val).first(m.cur_count);
  std::size_t merged = 0;
  switch (stage) {
    case tree_stage::unfold_recv:
      std::copy(oi.begin(), oi.end(), b.cur_idx.begin());
      std::copy(ov.begin(), ov.end(), b.cur_val.begin());
      m.cur_count = static_cast<std::uint32_t>(c);
      std::copy_n(b.mask_in.begin(), m.mine_count, b.mine_alive.begin());
      return;
    case tree_stage::fold_recv:  // the extra rank is the higher one
      std::copy(oi.begin(), oi.end(), b.extra_idx.begin());
      std::fill_n(b.extra_alive.begin(), c, std::uint8_t{1});
      m.extra_count = static_cast<std::uint32_t>(c);
      merged = host::sparse_merge_topk(ci, cv, oi, ov, k, b.out_idx, b.out_val, mws);
      break;
    case tree_stage::exchange:
      merged = lower ? host::sparse_merge_topk(ci, cv, oi, ov, k, b.out_idx, b.out_val, mws)
                     : host::sparse_merge_topk(oi, ov, ci, cv, k, b.out_idx, b.out_val, mws);
      break;
    default: return;
  }
  std::copy_n(b.out_idx.begin(), merged, b.cur_idx.begin());
  std::copy_n(b.out_val.begin(), merged, b.cur_val.begin());
  m.cur_count = static_cast<std::uint32_t>(merged);
  // Alive tracking: an original entry stays alive while its index is in the merged set.
  const auto cur = std::span<const std::int32_t>(b.cur_idx).first(merged);
  detail::keep_alive(m, cur, std::span<const std::int32_t>(b.mine_idx).first(m.mine_count), b.mine_alive);
  detail::keep_alive(m, cur, std::span<const std::int32_t>(b.extra_idx).first(m.extra_count), b.extra_alive);
  // Both partners (and their whole block) hold this merged set, so a sum that
  // overflowed is seen by all of them and spreads to every rank with the flags.
  if (host::first_nonfinite(std::span<const float>(b.cur_val).first(merged)) != merged) {
    m.cur.flags |= sparse_wire::flag_nonfinite;
    m.status |= status_nonfinite;
    detail::poison(m);
  }
}

//! A healthy step's result: out = 0 except out[i] = mean_of(G[i], P) at G's indices.
//! Leaves out untouched when the step is not healthy (the host decides after the fence).
inline void scatter(const sparse_tree_meta& m, std::span<float> out, const host_tree_views& b, int P) {
  if (!m.healthy() || (m.status & status_wire)) return;
  host::scatter_into_zeroed(out, std::span<const std::int32_t>(b.cur_idx).first(m.cur_count),
                            std::span<const float>(b.cur_val).first(m.cur_count), static_cast<float>(P));
}

//! After the commit: the entries this rank delivered (alive at the end) leave the
//! installed residual and velocity.
inline void zero_delivered(const sparse_tree_meta& m, std::span<float> residual, std::span<float> velocity,
                           const host_tree_views& b) {
  host::zero_delivered(residual, velocity, std::span<const std::int32_t>(b.mine_idx).first(m.mine_count),
                       std::span<const std::uint8_t>(b.mine_alive).first(m.mine_count));
}

}  // namespace host::tree
}  // namespace commpact
