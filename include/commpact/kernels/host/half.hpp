// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file half.hpp
//! IEEE binary16 conversions over spans, and CastAllreduce's fp16 passes, with the bits of
//! the scalar conversions in kernels/formulas/casts.hpp (detail::to_half, to_half_ieee,
//! from_half): round to nearest even, subnormals kept, finite values saturated at
//! +-65504 by to_half, every NaN sent as the quiet NaN sign | 0x7E00, a half NaN read as
//! sign | 0x7F800000 | mantissa << 13 (no quieting).
//!
//! <!-- snippet: codes=std::vector<std::uint16_t> -->
//! \code
//! namespace h = commpact::host::half;
//! h::to_half(x, codes);        // codes[i] = commpact::detail::to_half(x[i])
//! h::from_half(codes, y);      // y[i] = commpact::detail::from_half(codes[i])
//! \endcode
//!
//! Speed. With isa::active() at avx2 or above (a CPU with AVX2 and F16C: isa.hpp) the
//! passes convert 8 values per instruction (VCVTPS2PH with its rounding given in the
//! instruction, so MXCSR's rounding mode and FTZ do not apply; VCVTPH2PS is exact) and
//! patch the two cases where the hardware differs from the scalar code: NaN payloads
//! (the scalar code keeps one quiet NaN) and finite values above 65504 (hardware gives
//! Inf; to_half saturates). Otherwise (base, other architectures, nvcc) the scalar code.

#include <cstddef>
#include <cstdint>
#include <span>

#include "../../error.hpp"
#include "../formulas/casts.hpp"
#include "../mean.hpp"
#include "isa.hpp"

namespace commpact::host::half {

namespace detail {

#if COMMPACT_ISA_DISPATCH
//! Eight floats -> eight halves; Sat: as commpact::detail::to_half (finite values
//! saturate at +-65504), else as to_half_ieee (they overflow to Inf). NaN: sign | 0x7E00.
template <bool Sat>
COMMPACT_ALWAYS_INLINE COMMPACT_TARGET_AVX2 inline __m128i to8(__m256 x) noexcept {
  const __m256i b = _mm256_castps_si256(x), mag = _mm256_set1_epi32(0x7FFFFFFF);
  const __m256i ax = _mm256_and_si256(b, mag);
  // Above 65504 (0x477FE000): the lanes to patch (saturation, Inf, NaN); usually none.
  const __m256i over = _mm256_cmpgt_epi32(ax, _mm256_set1_epi32(0x477FE000));
  if (_mm256_testz_si256(over, over)) return _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT);
  const __m256i sign = _mm256_andnot_si256(mag, b), inf = _mm256_set1_epi32(0x7F800000);
  // A NaN becomes the float quiet NaN 0x7FC00000 (converts to 0x7E00).
  const __m256i nan = _mm256_cmpgt_epi32(ax, inf);
  __m256i fixed = _mm256_blendv_epi8(ax, _mm256_set1_epi32(0x7FC00000), nan);
  if constexpr (Sat) {
    // A finite value above 65504 becomes 65504.
    const __m256i big = _mm256_andnot_si256(_mm256_cmpgt_epi32(ax, _mm256_set1_epi32(0x7F7FFFFF)), over);
    fixed = _mm256_blendv_epi8(fixed, _mm256_set1_epi32(0x477FE000), big);
  }
  return _mm256_cvtps_ph(_mm256_castsi256_ps(_mm256_or_si256(sign, fixed)), _MM_FROUND_TO_NEAREST_INT);
}

//! Eight halves -> eight floats; a NaN keeps its payload unquieted (as from_half).
COMMPACT_ALWAYS_INLINE COMMPACT_TARGET_AVX2 inline __m256 from8(__m128i h) noexcept {
  const __m256 f = _mm256_cvtph_ps(h);
  const __m128i e16 = _mm_set1_epi16(0x7C00);
  const __m128i special16 = _mm_cmpeq_epi16(_mm_and_si128(h, e16), e16);  // Inf or NaN: usually none
  if (_mm_testz_si128(special16, special16)) return f;
  const __m256i w = _mm256_cvtepu16_epi32(h);
  const __m256i special = _mm256_cvtepi16_epi32(special16);
  const __m256i bits = _mm256_or_si256(_mm256_or_si256(_mm256_slli_epi32(_mm256_and_si256(w, _mm256_set1_epi32(0x8000)), 16),
                                                       _mm256_set1_epi32(0x7F800000)),
                                       _mm256_slli_epi32(_mm256_and_si256(w, _mm256_set1_epi32(0x3FF)), 13));
  return _mm256_castsi256_ps(_mm256_blendv_epi8(_mm256_castps_si256(f), bits, special));
}

template <bool Sat>
COMMPACT_TARGET_AVX2 inline std::size_t to_half_avx2(const float* x, std::uint16_t* h, std::size_t n) noexcept {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(h + i), to8<Sat>(_mm256_loadu_ps(x + i)));
  return i;
}

COMMPACT_TARGET_AVX2 inline std::size_t from_half_avx2(const std::uint16_t* h, float* x, std::size_t n) noexcept {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(x + i, from8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i))));
  return i;
}

//! cast_encode for fp16 over whole groups of 8 (see host::cast_encode); returns the
//! count done.
COMMPACT_TARGET_AVX2 inline std::size_t encode_avx2(const float* g, const float* r, std::uint16_t* codes, float* cand,
                                                     std::size_t n, std::uint16_t nan_code) noexcept {
  const __m256i mag = _mm256_set1_epi32(0x7FFFFFFF), top = _mm256_set1_epi32(0x7F7FFFFF);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 rv = r ? _mm256_loadu_ps(r + i) : _mm256_setzero_ps();
    const __m256 a = r ? _mm256_add_ps(_mm256_loadu_ps(g + i), rv) : _mm256_loadu_ps(g + i);
    const __m256i nf = _mm256_cmpgt_epi32(_mm256_and_si256(_mm256_castps_si256(a), mag), top);
    __m128i c = to8<true>(a);
    const bool all_finite = _mm256_testz_si256(nf, nf);
    if (cand) {
      // c is finite where a is; elsewhere the candidate is r (0 without r).
      const __m256 d = _mm256_sub_ps(a, _mm256_cvtph_ps(c));
      _mm256_storeu_ps(cand + i, all_finite ? d : _mm256_blendv_ps(d, rv, _mm256_castsi256_ps(nf)));
    }
    if (!all_finite) {
      const __m128i nf16 = _mm_packs_epi32(_mm256_castsi256_si128(nf), _mm256_extracti128_si256(nf, 1));
      c = _mm_blendv_epi8(c, _mm_set1_epi16(static_cast<short>(nan_code)), nf16);
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + i), c);
  }
  return i;
}

//! cast_add for fp16 over whole groups of 8; returns the count done.
COMMPACT_TARGET_AVX2 inline std::size_t add_avx2(const std::uint16_t* in, std::uint16_t* mine, std::size_t n) noexcept {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 s = _mm256_add_ps(from8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))),
                                   from8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(mine + i))));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(mine + i), to8<false>(s));
  }
  return i;
}

//! Non-zero iff a code of h[0, n) (n a multiple of 8) is Inf or NaN.
COMMPACT_TARGET_AVX2 inline bool any_nonfinite_avx2(const std::uint16_t* h, std::size_t n) noexcept {
  const __m256i e = _mm256_set1_epi16(0x7C00);
  __m256i any = _mm256_setzero_si256();
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i v = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h + i)), e);
    any = _mm256_or_si256(any, _mm256_cmpeq_epi16(v, e));
  }
  bool bad = !_mm256_testz_si256(any, any);
  for (; i < n; ++i) bad |= (h[i] & 0x7C00u) == 0x7C00u;
  return bad;
}

//! out = from_half(h) / d over whole groups of 8; returns the count done.
COMMPACT_TARGET_AVX2 inline std::size_t decode_mean_avx2(const std::uint16_t* h, float* out, std::size_t n,
                                                          float d) noexcept {
  const __m256 dv = _mm256_set1_ps(d);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_div_ps(from8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i))), dv));
  return i;
}
#endif

//! True when the F16C passes run.
inline bool use_f16c() noexcept {
#if COMMPACT_ISA_DISPATCH
  return isa::active() >= isa::level::avx2;
#else
  return false;
#endif
}

inline void check_lengths(const char* fn, std::size_t a, std::size_t b) {
  require(a == b, "commpact::host::half::", fn, ": the input holds ", a, " values but the output ", b,
              "; pass spans of the same length.");
}

}  // namespace detail

//! h[i] = commpact::detail::to_half(x[i]) (round to nearest even, finite values
//! saturated at +-65504). x and h have equal lengths.
inline void to_half(std::span<const float> x, std::span<std::uint16_t> h) {
  detail::check_lengths("to_half", x.size(), h.size());
  std::size_t i = 0;
#if COMMPACT_ISA_DISPATCH
  if (detail::use_f16c()) i = detail::to_half_avx2<true>(x.data(), h.data(), x.size());
#endif
  for (; i < x.size(); ++i) h[i] = commpact::detail::to_half(x[i]);
}

//! h[i] = commpact::detail::to_half_ieee(x[i]) (round to nearest even, overflow to Inf).
inline void to_half_ieee(std::span<const float> x, std::span<std::uint16_t> h) {
  detail::check_lengths("to_half_ieee", x.size(), h.size());
  std::size_t i = 0;
#if COMMPACT_ISA_DISPATCH
  if (detail::use_f16c()) i = detail::to_half_avx2<false>(x.data(), h.data(), x.size());
#endif
  for (; i < x.size(); ++i) h[i] = commpact::detail::to_half_ieee(x[i]);
}

//! x[i] = commpact::detail::from_half(h[i]) (exact).
inline void from_half(std::span<const std::uint16_t> h, std::span<float> x) {
  detail::check_lengths("from_half", h.size(), x.size());
  std::size_t i = 0;
#if COMMPACT_ISA_DISPATCH
  if (detail::use_f16c()) i = detail::from_half_avx2(h.data(), x.data(), h.size());
#endif
  for (; i < h.size(); ++i) x[i] = commpact::detail::from_half(h[i]);
}

// CastAllreduce's fp16 passes (host::cast_encode, cast_add and cast_decode_mean in
// cast.hpp) as vectorised prefixes: each returns how many leading entries it wrote (0
// without F16C), with the bits of cast.hpp's scalar loop, which does the rest.

//! cast_encode<fp16_codec>'s prefix; a non-finite g + r sends nan_code. r and cand may be null.
inline std::size_t cast_encode_prefix(const float* g, const float* r, std::uint16_t* codes, float* cand,
                                      std::size_t n, std::uint16_t nan_code) noexcept {
#if COMMPACT_ISA_DISPATCH
  if (detail::use_f16c()) return detail::encode_avx2(g, r, codes, cand, n, nan_code);
#endif
  return 0;
}

//! cast_add<fp16_codec>'s prefix: mine[i] = to_half_ieee(from_half(in[i]) + from_half(mine[i])),
//! the same bits but for the sign of the NaN that two NaNs sum to (x86 returns the first
//! operand's, and compilers may swap a float addition's operands, the scalar code's too).
inline std::size_t cast_add_prefix(const std::uint16_t* in, std::uint16_t* mine, std::size_t n) noexcept {
#if COMMPACT_ISA_DISPATCH
  if (detail::use_f16c()) return detail::add_avx2(in, mine, n);
#endif
  return 0;
}

//! cast_decode_mean<fp16_codec>'s prefix: n + 1 when a code is not finite (out untouched);
//! else out[i] = mean_of(from_half(sums[i]), P) for the returned count of leading entries,
//! every one of the n codes checked when that count is above 0.
inline std::size_t cast_decode_mean_prefix(const std::uint16_t* sums, float* out, std::size_t n, int P) noexcept {
#if COMMPACT_ISA_DISPATCH
  if (detail::use_f16c()) {
    if (detail::any_nonfinite_avx2(sums, n)) return n + 1;
    return detail::decode_mean_avx2(sums, out, n, static_cast<float>(P));
  }
#endif
  return 0;
}

}  // namespace commpact::host::half
