// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file topk_fused.hpp
//! The local phase of gTop-k in one pass: error-feedback accumulation fused with the exact
//! top-k selection by |acc|.
//!
//! \code
//! commpact::host::topk_workspace ws;                       // reused across steps
//! std::size_t bad = commpact::host::ef_accumulate_topk_abs(acc, residual, g, std::nullopt, k, idx, val, ws);
//! // acc = residual + g (bits of host::ef_accumulate); idx/val = host::topk_abs(acc, k) (bits too)
//! if (bad != acc.size()) { /* acc[bad] is the first Inf or NaN: skip or raise */ }
//! \endcode
//!
//! Result: exactly host::ef_accumulate(acc, residual, g[, *scale]) followed by
//! host::topk_abs(acc, k, idx, val, ws), bit for bit (acc, idx, val, the returned index),
//! for every input, NaN and Inf included (the selection stays exact in topk.hpp's order:
//! a NaN ranks above everything). An empty residual counts as zeros: acc[i] = 0.0f + g[i]
//! (so g[i] = -0.0f gives +0.0f, as ef_accumulate with a zero residual).
//!
//! Cost. Unfused, the two calls move 16 n bytes (read r and g, write acc, read acc again).
//! Fused (n >= 2^15 and k small enough for topk.hpp's sampled path): the sample is taken
//! from residual + g computed at the sample positions, the bound L derived as topk.hpp
//! does, then ONE pass computes acc, stores it (non-temporal stores for n >= 2^21 into a
//! buffer of its own, as ef_accumulate does) and collects, from the values still in
//! registers, the index and bits of every acc with key >= L (the vectorised 16-key test of
//! topk.hpp); the selection finishes among the candidates exactly as topk.hpp does. So
//! 12 n bytes. When the bound misses (too few or too many candidates, e.g. massively
//! tied data) it falls back to host::topk_abs over the now-written acc: correct, one to a
//! few passes slower. Small n or large k: ef pass, then topk_abs (the same as unfused).

#include <bit>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>

#include "../../error.hpp"
#include "simd.hpp"
#include "topk.hpp"
#include "vector_ops.hpp"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace commpact::host {

namespace detail {

//! Where the fused pass puts its candidates: entries with key > lom1 (as int32) go to
//! idx/bits while c <= cap (room: cap + filter_block). lom1 = INT32_MAX collects nothing.
struct fused_sink {
  std::int32_t* idx;
  std::uint32_t* bits;
  std::size_t cap;
  std::int32_t lom1;
  std::size_t c = 0;

  void take(std::size_t i, float a) noexcept {
    idx[c] = static_cast<std::int32_t>(i);
    bits[c] = std::bit_cast<std::uint32_t>(a);
    ++c;
  }
};

//! The scalar ef body: (HasR ? r[i] : 0.0f) + (Scaled ? g[i] * s : g[i]), as ef_body.
template <bool HasR, bool Scaled>
inline float fused_ef_at(const float* r, const float* g, float s, std::size_t i) noexcept {
  float a;
  ef_body<Scaled ? 1 : 0, float>(a, HasR ? r[i] : 0.0f, g[i], nullptr, nullptr, s, 0.0f);
  return a;
}

#if COMMPACT_HOST_SIMD && defined(__SSE2__)
typedef std::int32_t fused_vi __attribute__((vector_size(simd::vector_bytes)));

//! Bit l set iff lane l of v (all ones or zero) is set.
inline unsigned fused_lane_mask(fused_vi v) noexcept {
#if defined(__AVX__)
  return static_cast<unsigned>(_mm256_movemask_ps((__m256)v));
#else
  return static_cast<unsigned>(_mm_movemask_ps((__m128)v));
#endif
}
#endif

//! acc[i] = residual[i] + g[i] (see fused_ef_at) for i in [0, n), collecting into sk
//! every i with abs_key(acc[i]) > sk.lom1 in index order; returns the first index with a
//! non-finite acc, or n. Stream: non-temporal stores in the block loop (acc aligned to a
//! vector, in a buffer of its own).
template <bool HasR, bool Scaled, bool Stream>
inline std::size_t fused_ef_collect(float* acc, const float* r, const float* g, float s, std::size_t n,
                                    fused_sink& sk) noexcept {
  std::size_t bad = n, i = 0;
#if COMMPACT_HOST_SIMD && defined(__SSE2__)
  using simd::vf;
  using simd::vu;
  using vi = fused_vi;
  constexpr std::size_t L = simd::lanes, G = filter_block / L;
  static_assert(filter_block % L == 0 && vec_block % filter_block == 0);
  constexpr int K = Scaled ? 1 : 0;
  const vu mag = vu{} + simd::magnitude_mask, carry = vu{} + simd::exponent_carry;
  const vi lom1 = vi{} + sk.lom1;
  for (; i + vec_block <= n; i += vec_block) {
    vu nf{};
    for (std::size_t j = i; j < i + vec_block; j += filter_block) {
      vf a[G];
      vi hit[G];
      vi any{};
      COMMPACT_UNROLL
      for (std::size_t q = 0; q < G; ++q) {
        vf rv{};
        if constexpr (HasR) rv = simd::load<vf>(r + j + q * L);
        ef_body<K, vf>(a[q], rv, simd::load<vf>(g + j + q * L), nullptr, nullptr, s, 0.0f);
#if COMMPACT_HOST_STREAM
        if constexpr (Stream)
          simd::stream_store(acc + j + q * L, a[q]);
        else
#endif
          simd::store(acc + j + q * L, a[q]);
        const vu key = (vu)a[q] & mag;
        nf |= key + carry;
        hit[q] = (vi)key > lom1;
        any |= hit[q];
      }
      if (fused_lane_mask(any) == 0 || sk.c > sk.cap) continue;
      unsigned m = 0;
      alignas(simd::vector_bytes) float vals[filter_block];
      COMMPACT_UNROLL
      for (std::size_t q = 0; q < G; ++q) {
        m |= fused_lane_mask(hit[q]) << (q * L);
        simd::store(vals + q * L, a[q]);
      }
      do {
        const auto b = static_cast<std::size_t>(std::countr_zero(m));
        sk.take(j + b, vals[b]);
        m &= m - 1;
      } while (m != 0);
    }
    std::uint32_t any = 0;
    for (std::size_t l = 0; l < L; ++l) any |= nf[l];
    if ((any >> 31) && bad == n) bad = i + scan_nonfinite(acc + i, vec_block);
  }
#if COMMPACT_HOST_STREAM
  if constexpr (Stream) simd::stream_fence();
#endif
#endif
  // The tail (and the whole span without SSE2): scalar, the same operations.
  for (; i < n; ++i) {
    const float a = fused_ef_at<HasR, Scaled>(r, g, s, i);
    acc[i] = a;
    if (simd::nonfinite_bit(a) && bad == n) bad = i;
    if (static_cast<std::int32_t>(abs_key(a)) > sk.lom1 && sk.c <= sk.cap) sk.take(i, a);
  }
  return bad;
}

template <bool HasR, bool Scaled>
inline std::size_t fused_ef_dispatch(float* acc, const float* r, const float* g, float s, std::size_t n,
                                     fused_sink& sk) noexcept {
#if COMMPACT_HOST_STREAM
  // acc in a buffer of its own (not residual or g): skip the read-for-ownership.
  if (n >= stream_min && acc != r && acc != g && reinterpret_cast<std::uintptr_t>(acc) % simd::vector_bytes == 0)
    return fused_ef_collect<HasR, Scaled, true>(acc, r, g, s, n, sk);
#endif
  return fused_ef_collect<HasR, Scaled, false>(acc, r, g, s, n, sk);
}

}  // namespace detail

//! acc[i] = residual[i] + g[i] (with a scale s: residual[i] + (g[i] * s), the product
//! rounded, then added; an empty residual counts as zeros), then the top k of |acc| into
//! idx[0, k) / val[0, k), index-sorted, exactly as host::topk_abs(acc, k, idx, val, ws)
//! writes them. Returns the index of the first non-finite acc, or acc.size(); acc and the
//! selection are written in full either way (the selection is exact in topk.hpp's order,
//! where a NaN ranks above every number). acc may be the same span as residual or g (in
//! place); no other overlap. O(n), one pass over residual and g in the common case; no
//! allocation after the first call of a given (n, k) on ws (the same buffers as topk_abs).
//! \throws commpact::invalid_argument when g and acc (or a non-empty residual and acc)
//!         differ in length, spans overlap partially, n >= 2^31, k > n, or idx/val hold
//!         fewer than k entries; nothing is written then.
[[nodiscard]] inline std::size_t ef_accumulate_topk_abs(std::span<float> acc, std::span<const float> residual,
                                                        std::span<const float> g, std::optional<float> scale,
                                                        std::size_t k, std::span<std::int32_t> idx,
                                                        std::span<float> val, topk_workspace& ws) {
  constexpr const char* fn = "ef_accumulate_topk_abs";
  const std::size_t n = acc.size();
  detail::check_same_length(fn, "acc", n, "g", g.size());
  simd::check_no_partial_overlap(fn, "acc", acc.data(), n, "g", g.data(), n);
  const bool has_r = !residual.empty();
  if (has_r) {
    detail::check_same_length(fn, "acc", n, "residual", residual.size());
    simd::check_no_partial_overlap(fn, "acc", acc.data(), n, "residual", residual.data(), n);
  }
  detail::check_topk_args(acc, k, idx.size(), val.size(), true);

  using impl = detail::topk_impl;
  const float* r = residual.data();
  const float* gp = g.data();
  const float s = scale.value_or(1.0f);
  impl::sample_plan plan{};
  const bool sampled = k > 0 && k < n && impl::plan_sampled(n, k, plan);
  detail::fused_sink sk{nullptr, nullptr, 0, std::numeric_limits<std::int32_t>::max()};
  if (sampled) {
    auto key_at = [&](std::size_t i) {
      if (has_r)
        return abs_key(scale ? detail::fused_ef_at<true, true>(r, gp, s, i) : detail::fused_ef_at<true, false>(r, gp, s, i));
      return abs_key(scale ? detail::fused_ef_at<false, true>(r, gp, s, i) : detail::fused_ef_at<false, false>(r, gp, s, i));
    };
    const std::uint32_t lo = impl::sample_bound(ws, n, plan, key_at);  // a key: < 2^31
    sk = {impl::cand_idx(ws), impl::cand_bits(ws), plan.cap, static_cast<std::int32_t>(lo) - 1};
  }
  float* a = acc.data();
  std::size_t bad;
  if (has_r)
    bad = scale ? detail::fused_ef_dispatch<true, true>(a, r, gp, s, n, sk)
                : detail::fused_ef_dispatch<true, false>(a, r, gp, s, n, sk);
  else
    bad = scale ? detail::fused_ef_dispatch<false, true>(a, r, gp, s, n, sk)
                : detail::fused_ef_dispatch<false, false>(a, r, gp, s, n, sk);
  if (sampled && sk.c >= k && sk.c <= plan.cap) {
    impl::set_path(ws, topk_path::sampled);
    impl::finish_from_candidates(ws, sk.c, k, idx.data(), val.data());
  } else {
    impl::run(acc, k, ws, idx.data(), val.data());
  }
  return bad;
}

}  // namespace commpact::host
