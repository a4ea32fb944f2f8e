// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file oktopk.hpp
//! The host kernels of OkTopK (compress/compressors/oktopk.hpp), one per row of ops<Space>
//! (kernels/ops.hpp). They read and write the step's frames in the space's memory:
//! - reduce-scatter, per peer slot j of P: a 40-byte header (u32 magic "CPOK", u32 flags:
//!   bit 0 non-finite input, bit 1 rejected input, bit 2 an estimation step, bit 3
//!   on_nonfinite = skip_step; u64 count; i64 n, k, step, with the check tag of
//!   detail/check_tag.hpp) and a
//!   payload of 8k bytes' capacity: count int32 indices (ascending, in region j), then
//!   count float32 values;
//! - allgather, per origin slot o of P: 8 + 8 cap bytes: u32 origin, u32 count, count
//!   int32 indices (ascending, in region o), count float32 values.
//! `bounds` holds the P + 1 region boundaries of the step. `status[0]` takes the status
//! bits (kernels/status.hpp), `status[1]` the peer of a malformed frame.

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <span>

#include "../../config.hpp"
#include "../../error.hpp"
#include "../../wire/sparse_frame.hpp"
#include "../mean.hpp"
#include "../status.hpp"
#include "topk.hpp"

namespace commpact::host::oktopk {

inline constexpr std::uint32_t magic = 0x4B4F5043u;  // "CPOK"
//! The flags of a reduce-scatter header: bits 0 and 1 flag the step (its frames carry no
//! entries), bit 2 marks an estimation step (the entries go as usual), bit 3 a rank built
//! with on_nonfinite = skip_step (compared, so that ranks never decide a non-finite step
//! differently).
inline constexpr std::uint32_t stop_flags = 3u;
inline constexpr std::uint32_t flag_estimate = 4u;
inline constexpr std::uint32_t flag_skips = 8u;
inline constexpr std::size_t header_bytes = 40;
inline constexpr std::size_t block_header_bytes = 8;

template <class T>
T get(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}
template <class T>
void put(std::byte* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}

//! The header of a reduce-scatter frame.
struct header {
  std::uint32_t magic, flags;
  std::uint64_t count;
  std::int64_t n, k, step;
};
inline header read_header(const std::byte* p) {
  return {get<std::uint32_t>(p), get<std::uint32_t>(p + 4), get<std::uint64_t>(p + 8),
          get<std::int64_t>(p + 16), get<std::int64_t>(p + 24), get<std::int64_t>(p + 32)};
}

//! The local top-k of acc (host::topk_abs), unless status shows a non-finite acc.
inline void local(std::span<const float> acc, std::size_t k, std::span<const std::uint32_t> status,
                  std::span<std::int32_t> idx, std::span<float> val, topk_workspace& ws) {
  if (status[0] & status_nonfinite) return;
  topk_abs(acc, k, idx, val, ws);
}

//! The index of begin's unused slots: past every region, so no frame and no residual
//! clear ever uses them.
inline constexpr std::int32_t unused_index = std::numeric_limits<std::int32_t>::max();
//! The status bits of a flagged block (begin; kernels/cuda/oktopk_begin.cuh's twin).
COMMPACT_HOST_DEVICE constexpr std::uint32_t flagged_status(std::uint32_t flags) {
  return (flags & sparse_wire::flag_nonfinite) ? status_nonfinite : status_rejected;
}

//! This rank's set from a codec's block (SparseReduceScatter's block path): a sparse_wire
//! frame with n_min = n_max = n, k_min = k_max = k and no mask. Its count entries go to
//! idx/val (k slots) and the other slots get index unused_index (INT32_MAX) and value 0.
//! A flagged frame sets flagged_status: status_nonfinite (flag_nonfinite) or
//! status_rejected (flag_failed); a malformed one sets status_rejected; either way
//! idx/val are left as they were.
inline void begin(std::span<const std::byte> block, std::int64_t n, std::int64_t k, std::span<std::int32_t> idx,
                  std::span<float> val, std::span<std::uint32_t> status) {
  sparse_wire::header h;
  try {
    h = sparse_wire::decode_header(block, true);
    if (h.n_min != n || h.n_max != n || h.k_min != k || h.k_max != k || h.mask_bits != 0) {
      status[0] |= status_rejected;
      return;
    }
    if (h.flags) {
      status[0] |= flagged_status(h.flags);
      return;
    }
    h = sparse_wire::decode(block, {n, idx.size(), 0}, idx, val, {}, true);
  } catch (const wire_error&) {
    status[0] |= status_rejected;
    return;
  }
  std::fill(idx.begin() + static_cast<std::ptrdiff_t>(h.count), idx.end(), unused_index);
  std::fill(val.begin() + static_cast<std::ptrdiff_t>(h.count), val.end(), 0.0f);
}

//! Splits the local entries (idx ascending) by the regions and writes every slot's frame:
//! flags = `flags` | (bit 0 when status shows a non-finite acc) | (bit 1 when status shows
//! a rejected input); a frame flagged by stop_flags (bits 0, 1) has no entries.
inline void frames(std::span<const std::int32_t> idx, std::span<const float> val,
                   std::span<const std::int64_t> bounds, std::span<const std::uint32_t> status, std::uint32_t flags,
                   std::int64_t n, std::int64_t k, std::int64_t step, std::span<std::byte> hdr,
                   std::span<std::byte> pay) {
  const std::size_t P = bounds.size() - 1, stride = pay.size() / P;
  if (status[0] & status_nonfinite) flags |= 1u;
  if (status[0] & status_rejected) flags |= 2u;
  std::size_t at = 0;
  for (std::size_t j = 0; j < P; ++j) {
    std::size_t end = at;
    if (!(flags & stop_flags))
      while (end < idx.size() && idx[end] < bounds[j + 1]) ++end;
    const std::size_t c = end - at;
    std::byte* h = hdr.data() + j * header_bytes;
    put(h, magic), put(h + 4, flags), put(h + 8, std::uint64_t{c});
    put(h + 16, n), put(h + 24, k), put(h + 32, step);
    if (c) {
      std::memcpy(pay.data() + j * stride, idx.data() + at, 4 * c);
      std::memcpy(pay.data() + j * stride + 4 * c, val.data() + at, 4 * c);
    }
    at = end;
  }
}

//! Whether the entry (index i after the index prev, value v) of a frame or block is
//! well formed: strictly ascending, below hi, finite. The one formula of entries_ok and
//! of the CUDA rows' checks (kernels/cuda/oktopk.cuh).
COMMPACT_HOST_DEVICE inline bool entry_ok(std::int32_t i, std::int64_t prev, std::int64_t hi, float v) {
  return i > prev && i < hi && std::isfinite(v);
}

//! Whether select keeps position r: touched, a nonzero sum and |sum| >= theta (host and
//! CUDA rows).
COMMPACT_HOST_DEVICE inline bool selectable(std::uint8_t touched, float sum, float theta) {
  return touched && sum != 0.0f && std::abs(sum) >= theta;
}

//! The rank in G (the selected indices, ascending) of clear_selected's boundary j of P
//! (host and CUDA rows).
COMMPACT_HOST_DEVICE inline std::size_t rebalance_rank(std::size_t total, std::size_t j, std::size_t P) {
  return total * j / P;
}

//! count indices at p: strictly ascending in [lo, hi) (the values are not read).
inline bool indices_ok(const std::byte* p, std::size_t c, std::int64_t lo, std::int64_t hi) {
  std::int64_t prev = lo - 1;
  for (std::size_t e = 0; e < c; ++e) {
    const auto i = get<std::int32_t>(p + 4 * e);
    if (!entry_ok(i, prev, hi, 0.0f)) return false;
    prev = i;
  }
  return true;
}

//! count entries at p (indices, then values): strictly ascending indices in [lo, hi)
//! and finite values.
inline bool entries_ok(const std::byte* p, std::size_t c, std::int64_t lo, std::int64_t hi) {
  std::int64_t prev = lo - 1;
  for (std::size_t e = 0; e < c; ++e) {
    const auto i = get<std::int32_t>(p + 4 * e);
    const auto v = get<float>(p + 4 * (c + e));
    if (!entry_ok(i, prev, hi, v)) return false;
    prev = i;
  }
  return true;
}

//! Checks every peer's entries (else status wire, status[1] = the peer, reg untouched),
//! then reg = the sum over ranks in rank order of the entries in [lo, hi) (rank `me`'s
//! own from hdr_out/pay_out), touched = 1 where some rank sent an entry.
inline void region_sum(std::span<const std::byte> hdr_out, std::span<const std::byte> pay_out,
                       std::span<const std::byte> hdr_in, std::span<const std::byte> pay_in, int me, std::int64_t lo,
                       std::int64_t hi, std::span<float> reg, std::span<std::uint8_t> touched,
                       std::span<std::uint32_t> status) {
  const std::size_t P = hdr_out.size() / header_bytes, stride = pay_out.size() / P;
  auto slot = [&](std::size_t j) {
    const bool own = j == static_cast<std::size_t>(me);
    const std::byte* h = (own ? hdr_out : hdr_in).data() + j * header_bytes;
    return std::pair{(own ? pay_out : pay_in).data() + j * stride, static_cast<std::size_t>(get<std::uint64_t>(h + 8))};
  };
  for (std::size_t j = 0; j < P; ++j) {
    if (j == static_cast<std::size_t>(me)) continue;
    const auto [p, c] = slot(j);
    if (!entries_ok(p, c, lo, hi)) {
      status[0] |= status_wire;
      status[1] = static_cast<std::uint32_t>(j);
      return;
    }
  }
  const auto len = static_cast<std::size_t>(hi - lo);
  std::fill(reg.begin(), reg.begin() + static_cast<std::ptrdiff_t>(len), 0.0f);
  std::fill(touched.begin(), touched.begin() + static_cast<std::ptrdiff_t>(len), std::uint8_t{0});
  for (std::size_t j = 0; j < P; ++j) {
    const auto [p, c] = slot(j);
    for (std::size_t e = 0; e < c; ++e) {
      const auto r = static_cast<std::size_t>(get<std::int32_t>(p + 4 * e) - lo);
      reg[r] += get<float>(p + 4 * (c + e));
      touched[r] = 1;
    }
  }
}

//! mags = the mags.size() largest |reg[r]| over touched r, descending, padded with 0.
inline void mags(std::span<const float> reg, std::span<const std::uint8_t> touched, std::span<float> mags,
                 std::span<float> ws) {
  std::size_t m = 0;
  for (std::size_t r = 0; r < reg.size(); ++r)
    if (touched[r]) ws[m++] = std::abs(reg[r]);
  const std::size_t top = std::min(mags.size(), m);
  std::partial_sort(ws.begin(), ws.begin() + static_cast<std::ptrdiff_t>(top),
                    ws.begin() + static_cast<std::ptrdiff_t>(m), std::greater<>());
  std::copy(ws.begin(), ws.begin() + static_cast<std::ptrdiff_t>(top), mags.begin());
  std::fill(mags.begin() + static_cast<std::ptrdiff_t>(top), mags.end(), 0.0f);
}

//! The number of values >= t (or_equal) or > t among the m values at b, descending (a
//! binary search; host and CUDA rows).
COMMPACT_HOST_DEVICE inline std::size_t count_from_top(const float* b, std::size_t m, float t, bool or_equal) {
  std::size_t lo = 0, hi = m;  // b[0, lo) pass, b[hi, m) do not
  while (lo < hi) {
    const std::size_t mid = lo + (hi - lo) / 2;
    if (or_equal ? b[mid] >= t : b[mid] > t) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

//! How many entries region `me` selects of the global top-k (host and CUDA rows): all its
//! above_me values above T, and of its ties_me values equal to T those the global order
//! takes after the `above` values above T everywhere and the `before` ties of the regions
//! before it (ties to the smaller index: regions in order).
COMMPACT_HOST_DEVICE inline std::uint32_t region_limit(std::size_t k, std::size_t above, std::size_t before,
                                                       std::size_t above_me, std::size_t ties_me) {
  const std::size_t need = k > above ? k - above : 0, left = need > before ? need - before : 0;
  return static_cast<std::uint32_t>(above_me + (ties_me < left ? ties_me : left));
}

//! The step's exact global top-k, from `all`: P blocks of k values, block j the k largest
//! |sum| of region j, descending, zero-padded (oktopk_mags of every owner, allgathered).
//! theta[0] = T, the k-th largest of all (the global k-th largest |sum|: no region holds
//! more than k of the top k); limit[0] = region_limit: how many region `me` selects. select
//! with this theta and limit keeps exactly the global top-k of the nonzero sums (all of
//! them when fewer than k are nonzero), ties to the smaller index.
inline void theta(std::span<const float> all, std::size_t k, int me, std::span<float> theta,
                  std::span<std::uint32_t> limit) {
  const std::size_t P = all.size() / k;
  auto count = [&](std::size_t j, float t, bool or_equal) {
    return count_from_top(all.data() + j * k, k, t, or_equal);
  };
  auto count_ge = [&](float t) {
    std::size_t c = 0;
    for (std::size_t j = 0; j < P; ++j) c += count(j, t, true);
    return c;
  };
  // T: the largest t with at least k values >= t (non-negative floats order as their bit
  // patterns; count_ge(+0) = P k >= k), found by bisection on the bits.
  std::uint32_t lo = 0, hi = 0x7f800000u;  // count_ge(lo) >= k, and T lies in [lo, hi]
  while (lo < hi) {
    const std::uint32_t mid = lo + (hi - lo + 1) / 2;
    if (count_ge(std::bit_cast<float>(mid)) >= k) lo = mid;
    else hi = mid - 1;
  }
  const float T = std::bit_cast<float>(lo);
  std::size_t above = 0, before = 0;
  for (std::size_t j = 0; j < P; ++j) {
    const std::size_t gt = count(j, T, false);
    above += gt;
    if (j < static_cast<std::size_t>(me)) before += count(j, T, true) - gt;
  }
  const auto m = static_cast<std::size_t>(me);
  theta[0] = T;
  limit[0] = region_limit(k, above, before, count(m, T, false), count(m, T, true) - count(m, T, false));
}

//! Writes rank me's allgather block: the touched r with reg[r] != 0 and |reg[r]| >=
//! theta[0], at most min(cap, limit[0]) (the largest |reg|, ties to the smaller index),
//! as indices lo + r ascending and their sums; cap = what the block holds. ws holds
//! reg.size() int32.
inline void select(std::span<const float> reg, std::span<const std::uint8_t> touched, std::span<const float> theta,
                   std::span<const std::uint32_t> limit, std::int64_t lo, int me, std::span<std::byte> block,
                   std::span<std::int32_t> ws) {
  const std::size_t cap = std::min<std::size_t>((block.size() - block_header_bytes) / 8, limit[0]);
  const float t = theta[0];
  std::size_t m = 0;
  for (std::size_t r = 0; r < reg.size(); ++r)
    if (selectable(touched[r], reg[r], t)) ws[m++] = static_cast<std::int32_t>(r);
  auto b = ws.begin(), e = ws.begin() + static_cast<std::ptrdiff_t>(m);
  if (m > cap) {
    std::stable_sort(b, e, [&](auto x, auto y) { return std::abs(reg[x]) > std::abs(reg[y]); });
    m = cap;
    std::sort(b, b + static_cast<std::ptrdiff_t>(m));
  }
  std::byte* p = block.data();
  put(p, static_cast<std::uint32_t>(me)), put(p + 4, static_cast<std::uint32_t>(m));
  for (std::size_t i = 0; i < m; ++i) {
    put(p + 8 + 4 * i, static_cast<std::int32_t>(ws[i] + lo));
    put(p + 8 + 4 * (m + i), reg[static_cast<std::size_t>(ws[i])]);
  }
}

//! The count of the block in slot o.
inline std::size_t block_count(std::span<const std::byte> blocks, std::size_t stride, std::size_t o) {
  return get<std::uint32_t>(blocks.data() + o * stride + 4);
}

//! Whether every one of the count values after the count indices at p is finite.
inline bool values_finite(const std::byte* p, std::size_t c) {
  for (std::size_t e = 0; e < c; ++e)
    if (!std::isfinite(get<float>(p + 4 * (c + e)))) return false;
  return true;
}

//! Checks every other origin's block (entries in its region; else status wire and
//! status[1] = the origin, grad untouched); then, when some block (this rank's own
//! included) holds a non-finite sum (finite inputs whose sum overflowed: every rank
//! holds the same blocks, so every rank sees it), status nonfinite, grad untouched;
//! else grad = 0 except grad[i] = mean_of(sum, P) at every selected entry.
inline void output(std::span<const std::byte> blocks, std::span<const std::int64_t> bounds, int me,
                   std::span<float> grad, std::span<std::uint32_t> status) {
  const std::size_t P = bounds.size() - 1, stride = blocks.size() / P;
  bool finite = true;
  for (std::size_t o = 0; o < P; ++o) {
    const std::byte* p = blocks.data() + o * stride + 8;
    const std::size_t c = block_count(blocks, stride, o);
    if (o != static_cast<std::size_t>(me) && !indices_ok(p, c, bounds[o], bounds[o + 1])) {
      status[0] |= status_wire;
      status[1] = static_cast<std::uint32_t>(o);
      return;
    }
    finite = finite && values_finite(p, c);
  }
  if (!finite) {
    status[0] |= status_nonfinite;
    return;
  }
  std::fill(grad.begin(), grad.end(), 0.0f);
  for (std::size_t o = 0; o < P; ++o) {
    const std::byte* p = blocks.data() + o * stride;
    const std::size_t c = block_count(blocks, stride, o);
    for (std::size_t e = 0; e < c; ++e)
      grad[static_cast<std::size_t>(get<std::int32_t>(p + 8 + 4 * e))] =
          mean_of(get<float>(p + 8 + 4 * (c + e)), static_cast<int>(P));
  }
}

//! Unless status is set: acc[idx[e]] = 0 for the local entries whose index was selected
//! (G, the blocks in origin order: ascending), and next = bounds rebalanced by G (when
//! |G| >= P: next[j] = max(next[j - 1], G[|G| j / P]) for j = 1 .. P - 1; else bounds).
inline void clear_selected(std::span<float> acc, std::span<const std::int32_t> idx, std::span<const std::byte> blocks,
                           std::span<const std::int64_t> bounds, std::span<const std::uint32_t> status,
                           std::span<std::int64_t> next) {
  if (status[0]) return;
  const std::size_t P = bounds.size() - 1, stride = blocks.size() / P;
  std::size_t total = 0;
  for (std::size_t o = 0; o < P; ++o) total += block_count(blocks, stride, o);
  // G[g] for g ascending, walking the blocks once.
  std::size_t o = 0, in = 0, g = 0;
  auto at = [&](std::size_t want) {
    while (g + (block_count(blocks, stride, o) - in) <= want) g += block_count(blocks, stride, o) - in, ++o, in = 0;
    in += want - g;
    g = want;
    return get<std::int32_t>(blocks.data() + o * stride + 8 + 4 * in);
  };
  for (std::size_t e = 0, pos = 0; e < idx.size() && pos < total; ++e) {  // both ascending
    while (pos < total && at(pos) < idx[e]) ++pos;
    if (pos < total && at(pos) == idx[e]) acc[static_cast<std::size_t>(idx[e])] = 0.0f;
  }
  std::copy(bounds.begin(), bounds.end(), next.begin());
  if (total >= P) {
    o = 0, in = 0, g = 0;
    for (std::size_t j = 1; j < P; ++j)
      next[j] = std::max(next[j - 1], static_cast<std::int64_t>(at(rebalance_rank(total, j, P))));
  }
}

}  // namespace commpact::host::oktopk
