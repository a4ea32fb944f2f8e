// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file bf16.hpp
//! CastAllreduce's bfloat16 passes over spans, vectorised, with the bits of the scalar
//! conversions in kernels/formulas/casts.hpp (detail::to_bf16, to_bf16_ieee, from_bf16):
//! round to nearest even on the float's bits, finite values saturated by to_bf16, a NaN
//! sent as its top half with the quiet bit set. The conversions are integer operations
//! on the bits, so they run at the vector width of isa::active() (vector_ops.hpp's
//! dispatch: SSE2, AVX2 or AVX-512F), the same bits at every width.

#include <cstddef>
#include <cstdint>

#include "../formulas/casts.hpp"
#include "../mean.hpp"
#include "simd.hpp"
#include "vector_ops.hpp"

namespace commpact::host::bf16 {

namespace detail {

#if COMMPACT_HOST_SIMD
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
//! 16-bit codes, as many lanes as vf_w<W>.
template <std::size_t W>
struct codes_of {
  typedef std::uint16_t h __attribute__((vector_size(W / 2)));
};
template <std::size_t W>
using vh_w = typename codes_of<W>::h;

//! to_bf16 (Sat) or to_bf16_ieee of the floats with bits x, in 32-bit lanes.
template <bool Sat, class VU>
COMMPACT_ALWAYS_INLINE inline void to_code(VU& out, const VU& x) noexcept {
  const VU ax = x & 0x7FFFFFFFu;
  const VU nan = (VU)(ax > 0x7F800000u), inf = (VU)(ax == 0x7F800000u);
  VU r = (x + 0x7FFFu + ((x >> 16) & 1u)) >> 16;
  if constexpr (Sat) {
    const VU over = (VU)((r & 0x7FFFu) == 0x7F80u);
    r = (over & ((r & 0x8000u) | 0x7F7Fu)) | (~over & r);
  }
  const VU top = x >> 16;
  out = (nan & (top | 0x40u)) | (inf & top) | (~(nan | inf) & r);
}

struct encode_kernel {
  template <std::size_t W>
  COMMPACT_ALWAYS_INLINE static std::size_t run(const float* g, const float* r, std::uint16_t* codes, float* cand,
                                                std::size_t n, std::uint16_t nan_code) noexcept {
    using vf = simd::vf_w<W>;
    using vu = simd::vu_w<W>;
    using vh = vh_w<W>;
    constexpr std::size_t L = W / sizeof(float);
    std::size_t i = 0;
    for (; i + L <= n; i += L) {
      const vf gv = simd::load<vf>(g + i);
      vf rv{};
      if (r) rv = simd::load<vf>(r + i);
      const vf a = r ? gv + rv : gv;
      const vu x = (vu)a;
      const vu nf = (vu)((x & 0x7FFFFFFFu) >= 0x7F800000u);
      vu c;
      to_code<true>(c, x);
      if (cand) {
        const vf d = a - (vf)(c << 16);
        simd::store(cand + i, (vf)((nf & (vu)rv) | (~nf & (vu)d)));
      }
      c = (nf & static_cast<std::uint32_t>(nan_code)) | (~nf & c);
      simd::store(codes + i, __builtin_convertvector(c, vh));
    }
    return i;
  }
};

struct add_kernel {
  template <std::size_t W>
  COMMPACT_ALWAYS_INLINE static std::size_t run(const std::uint16_t* in, std::uint16_t* mine, std::size_t n) noexcept {
    using vf = simd::vf_w<W>;
    using vu = simd::vu_w<W>;
    using vh = vh_w<W>;
    constexpr std::size_t L = W / sizeof(float);
    std::size_t i = 0;
    for (; i + L <= n; i += L) {
      const vf a = (vf)(__builtin_convertvector(simd::load<vh>(in + i), vu) << 16);
      const vf b = (vf)(__builtin_convertvector(simd::load<vh>(mine + i), vu) << 16);
      vu c;
      to_code<false>(c, (vu)(a + b));
      simd::store(mine + i, __builtin_convertvector(c, vh));
    }
    return i;
  }
};

struct decode_mean_kernel {
  //! out = from_bf16(h) / d for whole vectors when every code is finite; returns the
  //! count done, or n + 1 when a code is Inf or NaN (out untouched).
  template <std::size_t W>
  COMMPACT_ALWAYS_INLINE static std::size_t run(const std::uint16_t* h, float* out, std::size_t n, float d) noexcept {
    using vf = simd::vf_w<W>;
    using vu = simd::vu_w<W>;
    using vh = vh_w<W>;
    constexpr std::size_t L = W / sizeof(float);
    vh bad{};
    std::size_t i = 0;
    for (; i + L <= n; i += L) bad |= (vh)((simd::load<vh>(h + i) & 0x7F80u) == 0x7F80u);
    std::uint32_t any = 0;
    for (std::size_t l = 0; l < L; ++l) any |= bad[l];
    for (std::size_t j = i; j < n; ++j) any |= (h[j] & 0x7F80u) == 0x7F80u;
    if (any) return n + 1;
    for (i = 0; i + L <= n; i += L)
      simd::store(out + i, (vf)(__builtin_convertvector(simd::load<vh>(h + i), vu) << 16) / d);
    return i;
  }
};
#pragma GCC diagnostic pop
#endif

}  // namespace detail

// CastAllreduce's bf16 passes (host::cast_encode, cast_add and cast_decode_mean in
// cast.hpp) as vectorised prefixes: each returns how many leading entries it wrote (0
// without the vector path), with the bits of cast.hpp's scalar loop, which does the rest.

//! cast_encode<bf16_codec>'s prefix; a non-finite g + r sends nan_code and keeps r (0
//! without r) as its candidate. r and cand may be null.
inline std::size_t cast_encode_prefix(const float* g, const float* r, std::uint16_t* codes, float* cand,
                                      std::size_t n, std::uint16_t nan_code) noexcept {
#if COMMPACT_HOST_SIMD
  return host::detail::dispatch<detail::encode_kernel>(g, r, codes, cand, n, nan_code);
#else
  return 0;
#endif
}

//! cast_add<bf16_codec>'s prefix: mine[i] = to_bf16_ieee(from_bf16(in[i]) + from_bf16(mine[i])),
//! the same bits but for the sign of the NaN that two NaNs sum to (see half.hpp).
inline std::size_t cast_add_prefix(const std::uint16_t* in, std::uint16_t* mine, std::size_t n) noexcept {
#if COMMPACT_HOST_SIMD
  return host::detail::dispatch<detail::add_kernel>(in, mine, n);
#else
  return 0;
#endif
}

//! cast_decode_mean<bf16_codec>'s prefix: n + 1 when a code is not finite (out untouched);
//! else out[i] = mean_of(from_bf16(sums[i]), P) for the returned count of leading entries,
//! every one of the n codes checked when that count is above 0.
inline std::size_t cast_decode_mean_prefix(const std::uint16_t* sums, float* out, std::size_t n, int P) noexcept {
#if COMMPACT_HOST_SIMD
  return host::detail::dispatch<detail::decode_mean_kernel>(sums, out, n, static_cast<float>(P));
#else
  return 0;
#endif
}

}  // namespace commpact::host::bf16
