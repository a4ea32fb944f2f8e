// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file vector_ops.hpp
//! The O(n) passes of the compressors (error feedback, scaling, finiteness checks, the
//! commit of a sparse result), written to run at memory speed at the user's flags.
//!
//! <!-- snippet: s=float; delivered=std::vector<std::int32_t> -->
//! \code
//! namespace h = commpact::host;
//! if (h::first_nonfinite(g) != g.size()) { /* ... */ }  // branch-free check, index on demand
//! std::size_t bad = h::scale_checked(g, 1.0f / P);      // g *= 1/P, reports bad input
//! bad = h::ef_accumulate(acc, residual, g, s);          // acc = residual + s * g
//! h::commit_sparse(grad, idx, val, float(P), residual, {}, delivered);
//! \endcode
//!
//! Every function gives the bits of the plain scalar loop written in its comment: the same
//! float operations per element in the same order, each product and sum rounded on its
//! own (never fused into an FMA, see simd.hpp), no reassociation. The finiteness tests
//! are an OR of exponent bits (order-free) over blocks of 1024 values; only a block that
//! holds a non-finite value is scanned again for its first index. Functions that return
//! an index return the span's length when every value is finite.
//!
//! Each pass runs at the widest vectors of isa::active() (isa.hpp: SSE2 at the user's
//! flags, AVX2 or AVX-512F chosen at run time); the bits are the same at every level.
//!
//! In-place use is allowed where a comment says so (the same span as input and output);
//! spans that overlap otherwise raise invalid_argument, as do spans of unequal length.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "../../error.hpp"
#include "commit.hpp"
#include "../mean.hpp"
#include "simd.hpp"

namespace commpact::host {

namespace detail {

//! Values per finiteness block: 4 KB, so that a block scanned twice is still in L1.
inline constexpr std::size_t vec_block = 1024;

//! Index of the first non-finite value of p[0, n), or n (scalar scan).
inline std::size_t scan_nonfinite(const float* p, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i)
    if (simd::nonfinite_bit(p[i])) return i;
  return n;
}

#if COMMPACT_HOST_SIMD
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

//! Non-zero iff p[0, vec_block) holds a non-finite value (vectors of W bytes).
template <std::size_t W = simd::vector_bytes>
COMMPACT_ALWAYS_INLINE inline std::uint32_t block_has_nonfinite(const float* p) noexcept {
#if COMMPACT_HOST_SIMD
  using vu = simd::vu_w<W>;
  constexpr std::size_t L = W / sizeof(float);
  const vu mag = vu{} + simd::magnitude_mask, carry = vu{} + simd::exponent_carry;
  vu a0{}, a1{};
  for (std::size_t j = 0; j < vec_block; j += 2 * L) {
    a0 |= (simd::load<vu>(p + j) & mag) + carry;
    a1 |= (simd::load<vu>(p + j + L) & mag) + carry;
  }
  return simd::or_lanes<W>(a0 | a1) >> 31;
#else
  std::uint32_t r = 0;
  for (std::size_t j = 0; j < vec_block; ++j) r |= simd::nonfinite_bit(p[j]);
  return r;
#endif
}

//! p[j] = p[j] * s for j in [0, vec_block).
template <std::size_t W = simd::vector_bytes>
COMMPACT_ALWAYS_INLINE inline void scale_block(float* p, float s) noexcept {
#if COMMPACT_HOST_SIMD
  using vf = simd::vf_w<W>;
  for (std::size_t j = 0; j < vec_block; j += W / sizeof(float)) simd::store(p + j, simd::load<vf>(p + j) * s);
#else
  for (std::size_t j = 0; j < vec_block; ++j) p[j] = p[j] * s;
#endif
}

using simd::dispatch;

inline void check_same_length(const char* fn, const char* an, std::size_t a, const char* bn, std::size_t b) {
  require(a == b, "commpact::host::", fn, ": ", an, " holds ", a, " values but ", bn, " holds ", b,
          "; pass spans of the same length.");
}

//! The per-element body of the error-feedback accumulation. Kind: 0 acc = r + g,
//! 1 acc = r + s g, 2 u' = m u + g, acc = r + u', 3 u' = m u + s g, acc = r + u'.
//! Writes acc (vectors pass by reference: see simd.hpp).
template <int Kind, class V>
COMMPACT_ALWAYS_INLINE inline void ef_body(V& acc, const V& r, const V& g0, const V* u, V* un, float s,
                                           float m) noexcept {
#if defined(__clang__)
#pragma clang fp contract(off)
#endif
  V g = g0;
  if constexpr (Kind == 1 || Kind == 3) {
    g = g * s;
    simd::opaque(g);
  }
  if constexpr (Kind >= 2) {
    V mu = *u * m;
    simd::opaque(mu);
    g = mu + g;
    *un = g;
  }
  acc = r + g;
}

//! Outputs at least this long, in a buffer of their own, are written with non-temporal
//! stores (8 MB: beyond most L2s and a good part of L3; measured in
//! bench/bench_vector_ops.cpp).
inline constexpr std::size_t stream_min = std::size_t{1} << 21;

//! The accumulation over n values with vectors of W bytes (Stream: acc written with
//! non-temporal stores, acc 16-byte aligned); returns the first index with a non-finite acc.
template <int Kind, std::size_t W, bool Stream>
COMMPACT_ALWAYS_INLINE inline std::size_t ef_loop(float* acc, float* un, const float* u, const float* r,
                                                  const float* g, float s, float m, std::size_t n) noexcept {
  std::size_t bad = n, i = 0;
#if COMMPACT_HOST_SIMD
  using vf = simd::vf_w<W>;
  using vu = simd::vu_w<W>;
  constexpr std::size_t L = W / sizeof(float);
  const vu mag = vu{} + simd::magnitude_mask, carry = vu{} + simd::exponent_carry;
  for (; i + vec_block <= n; i += vec_block) {
    vu bits{};
    for (std::size_t j = i; j < i + vec_block; j += L) {
      vf uv{}, unv;
      if constexpr (Kind >= 2) uv = simd::load<vf>(u + j);
      vf a;
      ef_body<Kind>(a, simd::load<vf>(r + j), simd::load<vf>(g + j), &uv, &unv, s, m);
      if constexpr (Kind >= 2) simd::store(un + j, unv);
#if COMMPACT_HOST_STREAM
      if constexpr (Stream)
        simd::stream_store_w<W>(acc + j, a);
      else
#endif
        simd::store(acc + j, a);
      bits |= ((vu)a & mag) + carry;
    }
    if ((simd::or_lanes<W>(bits) >> 31) && bad == n) bad = i + scan_nonfinite(acc + i, vec_block);
  }
#endif
  for (; i < n; ++i) {
    float uv = 0.0f, unv;
    if constexpr (Kind >= 2) uv = u[i];
    float a;
    ef_body<Kind>(a, r[i], g[i], &uv, &unv, s, m);
    if constexpr (Kind >= 2) un[i] = unv;
    acc[i] = a;
    if (simd::nonfinite_bit(a) && bad == n) bad = i;
  }
  return bad;
}

//! ef_loop over n values: acc in a buffer of its own (not residual or g), at least
//! stream_min long, skips the read-for-ownership (non-temporal stores over whole blocks).
template <int Kind>
struct ef_kernel {
  template <std::size_t W>
  COMMPACT_ALWAYS_INLINE static std::size_t run(float* acc, float* un, const float* u, const float* r, const float* g,
                                                float s, float m, std::size_t n) noexcept {
#if COMMPACT_HOST_STREAM
    if (n >= stream_min && acc != r && acc != g && reinterpret_cast<std::uintptr_t>(acc) % 16 == 0) {
      const std::size_t body = n - n % vec_block;
      const std::size_t first = ef_loop<Kind, W, true>(acc, un, u, r, g, s, m, body);
      simd::stream_fence();
      const std::size_t off = Kind >= 2 ? body : 0;
      const std::size_t tail =
          ef_loop<Kind, W, false>(acc + body, un + off, u + off, r + body, g + body, s, m, n - body);
      return first != body ? first : body + tail;
    }
#endif
    return ef_loop<Kind, W, false>(acc, un, u, r, g, s, m, n);
  }
};

template <int Kind>
inline std::size_t ef_checked(const char* fn, std::span<float> acc, std::span<float> un, std::span<const float> u,
                              std::span<const float> r, std::span<const float> g, float s, float m) {
  const std::size_t n = acc.size();
  check_same_length(fn, "acc", n, "residual", r.size());
  check_same_length(fn, "acc", n, "g", g.size());
  simd::check_no_partial_overlap(fn, "acc", acc.data(), n, "residual", r.data(), n);
  simd::check_no_partial_overlap(fn, "acc", acc.data(), n, "g", g.data(), n);
  if constexpr (Kind >= 2) {
    check_same_length(fn, "acc", n, "u_next", un.size());
    check_same_length(fn, "acc", n, "u", u.size());
    simd::check_no_partial_overlap(fn, "u_next", un.data(), n, "u", u.data(), n);
    const float* ins[3] = {r.data(), g.data(), acc.data()};
    const char* names[3] = {"residual", "g", "acc"};
    for (int k = 0; k < 3; ++k) {
      require(un.data() != ins[k] || n == 0, "commpact::host::", fn, ": u_next is the same buffer as ", names[k],
              "; u_next may only share storage with u.");
      simd::check_no_partial_overlap(fn, "u_next", un.data(), n, names[k], ins[k], n);
    }
    require(acc.data() != u.data() || n == 0, "commpact::host::", fn,
            ": acc is the same buffer as u; acc may share storage with residual or g only.");
    simd::check_no_partial_overlap(fn, "acc", acc.data(), n, "u", u.data(), n);
  }
  return dispatch<ef_kernel<Kind>>(acc.data(), un.data(), u.data(), r.data(), g.data(), s, m, n);
}

}  // namespace detail

namespace detail {
struct first_nonfinite_kernel {
  template <std::size_t W>
  COMMPACT_ALWAYS_INLINE static std::size_t run(const float* p, std::size_t n) noexcept {
    std::size_t i = 0;
    for (; i + vec_block <= n; i += vec_block)
      if (block_has_nonfinite<W>(p + i)) return i + scan_nonfinite(p + i, vec_block);
    return i + scan_nonfinite(p + i, n - i);
  }
};
struct scale_kernel {
  template <std::size_t W>
  COMMPACT_ALWAYS_INLINE static int run(float* p, std::size_t n, float s) noexcept {
    std::size_t i = 0;
#if COMMPACT_HOST_SIMD
    using vf = simd::vf_w<W>;
    constexpr std::size_t L = W / sizeof(float);
    for (; i + 2 * L <= n; i += 2 * L) {
      simd::store(p + i, simd::load<vf>(p + i) * s);
      simd::store(p + i + L, simd::load<vf>(p + i + L) * s);
    }
#endif
    for (; i < n; ++i) p[i] = p[i] * s;
    return 0;
  }
};
struct scale_checked_kernel {
  template <std::size_t W>
  COMMPACT_ALWAYS_INLINE static std::size_t run(float* p, std::size_t n, float s) noexcept {
    std::size_t bad = n, i = 0;
    const bool shrinks = s <= 1.0f && s >= -1.0f;
    for (; i + vec_block <= n; i += vec_block) {
#if COMMPACT_HOST_SIMD
      if (shrinks) {
        using vf = simd::vf_w<W>;
        using vu = simd::vu_w<W>;
        const vu mag = vu{} + simd::magnitude_mask, carry = vu{} + simd::exponent_carry;
        vu bits{};
        for (std::size_t j = i; j < i + vec_block; j += W / sizeof(float)) {
          const vf v = simd::load<vf>(p + j) * s;
          simd::store(p + j, v);
          bits |= ((vu)v & mag) + carry;
        }
        if ((simd::or_lanes<W>(bits) >> 31) && bad == n) bad = i + scan_nonfinite(p + i, vec_block);
        continue;
      }
#endif
      if (bad == n && block_has_nonfinite<W>(p + i)) bad = i + scan_nonfinite(p + i, vec_block);
      scale_block<W>(p + i, s);
    }
    if (bad == n) {
      const std::size_t t = scan_nonfinite(p + i, n - i);
      if (t != n - i) bad = i + t;
    }
    for (; i < n; ++i) p[i] = p[i] * s;
    return bad;
  }
};
}  // namespace detail

//! Index of the first Inf or NaN in x, or x.size() when every value is finite. Never
//! raises, also under -ffast-math (a test of bits, not std::isfinite).
[[nodiscard]] inline std::size_t first_nonfinite(std::span<const float> x) noexcept {
  return detail::dispatch<detail::first_nonfinite_kernel>(x.data(), x.size());
}

//! x[i] = x[i] * s.
inline void scale(std::span<float> x, float s) noexcept { detail::dispatch<detail::scale_kernel>(x.data(), x.size(), s); }

//! x[i] = x[i] * s for every i, in one pass; returns the index of the first non-finite
//! value of x as it was before scaling, or x.size(). When |s| <= 1 (e.g. 1 / P), a
//! finite value stays finite, so the bits of each product are tested as it is stored
//! (one pass); otherwise each block of 1024 values is tested, then scaled, in L1.
[[nodiscard]] inline std::size_t scale_checked(std::span<float> x, float s) noexcept {
  return detail::dispatch<detail::scale_checked_kernel>(x.data(), x.size(), s);
}

namespace detail {
//! mean_checked's pass: q[i] / d, or q[i] * inv when P is a power of two (inv = 1/P is
//! then exact, and x * 2^-k and x / 2^k are the same correctly rounded number, subnormal
//! results included: the bits of the division at the speed of a product).
template <bool Pow2>
struct mean_kernel {
  template <std::size_t W>
  COMMPACT_ALWAYS_INLINE static std::size_t run(const float* q, float* p, std::size_t n, float d, float inv,
                                                int P) noexcept {
    std::size_t bad = n, i = 0;
#if COMMPACT_HOST_SIMD
    using vf = simd::vf_w<W>;
    using vu = simd::vu_w<W>;
    const vu mag = vu{} + simd::magnitude_mask, carry = vu{} + simd::exponent_carry;
    for (; i + vec_block <= n; i += vec_block) {
      vu bits{};
      for (std::size_t j = i; j < i + vec_block; j += W / sizeof(float)) {
        vf v;
        if constexpr (Pow2) v = simd::load<vf>(q + j) * inv;
        else v = simd::load<vf>(q + j) / d;
        simd::store(p + j, v);
        bits |= ((vu)v & mag) + carry;
      }
      if ((simd::or_lanes<W>(bits) >> 31) && bad == n) bad = i + scan_nonfinite(p + i, vec_block);
    }
#else
    (void)d;
#endif
    for (; i < n; ++i) {
      if constexpr (Pow2) p[i] = q[i] * inv;
      else p[i] = mean_of(q[i], P);
      if (simd::nonfinite_bit(p[i]) && bad == n) bad = i;
    }
    return bad;
  }
};
}  // namespace detail

//! dst[i] = mean_of(src[i], P) (kernels/mean.hpp: src[i] / float(P)) for every i, in
//! one pass (src and dst equally long; the same span or disjoint); returns the index of
//! the first non-finite result, or dst.size(). Dividing by P >= 1 keeps a finite value
//! finite, so the bits of each quotient are tested as it is stored. For P a power of two
//! the pass multiplies by the exact 1/P (the same bits, about 1.5x faster at n = 2^20).
[[nodiscard]] inline std::size_t mean_checked(std::span<const float> src, std::span<float> dst, int P) {
  detail::check_same_length("mean_checked", "src", src.size(), "dst", dst.size());
  const float d = static_cast<float>(P);
  if (P > 0 && (P & (P - 1)) == 0) {
    if (src.data() == dst.data()) return scale_checked(dst, 1.0f / d);  // in place: the scaling kernel
    return detail::dispatch<detail::mean_kernel<true>>(src.data(), dst.data(), dst.size(), d, 1.0f / d, P);
  }
  return detail::dispatch<detail::mean_kernel<false>>(src.data(), dst.data(), dst.size(), d, 0.0f, P);
}
//! x[i] = mean_of(x[i], P) in place (see above).
[[nodiscard]] inline std::size_t mean_checked(std::span<float> x, int P) {
  return mean_checked(std::span<const float>(x), x, P);
}

namespace detail {
//! y[i] = y[i] + x[i] (Sub: y[i] - x[i]) over n values.
template <bool Sub>
struct update_kernel {
  template <std::size_t W>
  COMMPACT_ALWAYS_INLINE static int run(float* py, const float* px, std::size_t n) noexcept {
    std::size_t i = 0;
#if COMMPACT_HOST_SIMD
    using vf = simd::vf_w<W>;
    constexpr std::size_t L = W / sizeof(float);
    for (; i + L <= n; i += L) {
      const vf a = simd::load<vf>(py + i), b = simd::load<vf>(px + i);
      if constexpr (Sub) simd::store(py + i, a - b);
      else simd::store(py + i, a + b);
    }
#endif
    for (; i < n; ++i) py[i] = Sub ? py[i] - px[i] : py[i] + px[i];
    return 0;
  }
};
template <bool Sub>
inline void update_with(const char* who, std::span<float> y, std::span<const float> x) {
  check_same_length(who, "y", y.size(), "x", x.size());
  simd::check_no_partial_overlap(who, "y", y.data(), y.size(), "x", x.data(), x.size());
  dispatch<update_kernel<Sub>>(y.data(), x.data(), y.size());
}
}  // namespace detail

//! y[i] = y[i] + x[i]. y and x have equal lengths; they may be the same span.
inline void add(std::span<float> y, std::span<const float> x) { detail::update_with<false>("add", y, x); }

//! y[i] = y[i] - x[i]. y and x have equal lengths; they may be the same span.
inline void sub(std::span<float> y, std::span<const float> x) { detail::update_with<true>("sub", y, x); }

//! Error-feedback accumulation: acc[i] = residual[i] + g[i]. Returns the index of the
//! first non-finite acc, or acc.size(); acc is written in full either way. acc may be the
//! same span as residual or g (in place).
[[nodiscard]] inline std::size_t ef_accumulate(std::span<float> acc, std::span<const float> residual,
                                               std::span<const float> g) {
  return detail::ef_checked<0>("ef_accumulate", acc, {}, {}, residual, g, 0.0f, 0.0f);
}

//! acc[i] = residual[i] + (s * g[i]) (the product rounded, then added; s is e.g. a
//! clipping scale). Otherwise as above.
[[nodiscard]] inline std::size_t ef_accumulate(std::span<float> acc, std::span<const float> residual,
                                               std::span<const float> g, float s) {
  return detail::ef_checked<1>("ef_accumulate", acc, {}, {}, residual, g, s, 0.0f);
}

//! With momentum correction (DGC): u_next[i] = (m * u[i]) + g[i];
//! acc[i] = residual[i] + u_next[i]. Returns the first index with a non-finite acc, or
//! acc.size(). u_next may be the same span as u; acc may be the same span as residual or
//! g; no other sharing.
[[nodiscard]] inline std::size_t ef_accumulate_momentum(std::span<float> acc, std::span<float> u_next,
                                                        std::span<const float> u, std::span<const float> residual,
                                                        std::span<const float> g, float m) {
  return detail::ef_checked<2>("ef_accumulate_momentum", acc, u_next, u, residual, g, 0.0f, m);
}

//! u_next[i] = (m * u[i]) + (s * g[i]); acc[i] = residual[i] + u_next[i]. As above.
[[nodiscard]] inline std::size_t ef_accumulate_momentum(std::span<float> acc, std::span<float> u_next,
                                                        std::span<const float> u, std::span<const float> residual,
                                                        std::span<const float> g, float m, float s) {
  return detail::ef_checked<3>("ef_accumulate_momentum", acc, u_next, u, residual, g, s, m);
}

#if COMMPACT_HOST_SIMD
#pragma GCC diagnostic pop
#endif

}  // namespace commpact::host

