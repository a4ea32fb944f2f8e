// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file cast.hpp
//! The host kernels of CastAllreduce (compress/compressors/cast_allreduce.hpp): the 16-bit
//! cast with error feedback, the per-chunk add of the ring, and the decode of the sums
//! into the mean. `Cast` is a 16-bit cast codec (fp16_codec, bf16_codec): static
//! to_code, from_code, finite_code and add. The rows cast_encode, cast_add and
//! cast_decode_mean of ops<Space> (kernels/ops.hpp) call them. For a Cast of
//! formulas/casts.hpp's fp16_format or bf16_format (fp16_codec, bf16_codec) the passes are
//! half.hpp's (F16C where the CPU has it) and bf16.hpp's (vectorised), with the same bits.

#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>

#include "../../config.hpp"
#include "../exact.hpp"
#include "../mean.hpp"
#include "bf16.hpp"
#include "half.hpp"

namespace commpact::host {

//! The code that makes every rank's sum non-finite: a NaN in fp16 and bf16 alike.
inline constexpr std::uint16_t cast_nan_code = 0x7FFFu;

//! One value of cast_encode (shared with the CUDA rows, kernels/cuda/rows_cast_vote.cuh):
//! a = g + r[i] (g when r is null); returns Cast::to_code(a) and sets cand[i] = a -
//! from_code(code) (when cand is not null); a non-finite a returns cast_nan_code and keeps
//! r[i] (0 without r) as its candidate.
template <class Cast>
COMMPACT_HOST_DEVICE inline std::uint16_t cast_encode_value(float g, const float* r, std::size_t i, float* cand) {
  const float a = r ? exact::add(g, r[i]) : g;
  if (!exact::finite(a)) {
    if (cand) cand[i] = r ? r[i] : 0.0f;
    return cast_nan_code;
  }
  const std::uint16_t c = Cast::to_code(a);
  if (cand) cand[i] = exact::sub(a, Cast::from_code(c));
  return c;
}

//! a = g + r (g when r is empty: no error feedback); codes[i] = Cast::to_code(a) and
//! cand[i] = a - from_code(codes[i]) (when cand is not empty); a non-finite a sends
//! cast_nan_code and keeps r[i] as its candidate.
template <class Cast>
void cast_encode(std::span<const float> g, std::span<const float> r, std::span<std::uint16_t> codes,
                 std::span<float> cand) {
  const float* rp = r.empty() ? nullptr : r.data();
  float* cp = cand.empty() ? nullptr : cand.data();
  const std::size_t n = g.size();
  std::size_t i = 0;
  if constexpr (std::is_base_of_v<commpact::detail::fp16_format, Cast>)
    i = half::cast_encode_prefix(g.data(), rp, codes.data(), cp, n, cast_nan_code);
  else if constexpr (std::is_base_of_v<commpact::detail::bf16_format, Cast>)
    i = bf16::cast_encode_prefix(g.data(), rp, codes.data(), cp, n, cast_nan_code);
  for (; i < n; ++i) codes[i] = cast_encode_value<Cast>(g[i], rp, i, cp);
}

//! The ring's combine of one chunk: mine[i] = Cast::add(in[i], mine[i]) (in from the
//! ring's earlier ranks).
template <class Cast>
void cast_add(std::span<const std::uint16_t> in, std::span<std::uint16_t> mine) {
  std::size_t i = 0;
  if constexpr (std::is_base_of_v<commpact::detail::fp16_format, Cast>)
    i = half::cast_add_prefix(in.data(), mine.data(), mine.size());
  else if constexpr (std::is_base_of_v<commpact::detail::bf16_format, Cast>)
    i = bf16::cast_add_prefix(in.data(), mine.data(), mine.size());
  for (; i < mine.size(); ++i) mine[i] = Cast::add(in[i], mine[i]);
}

//! When every sums[i] is finite: out[i] = mean_of(from_code(sums[i]), P) and true; else
//! out is untouched and false.
template <class Cast>
bool cast_decode_mean(std::span<const std::uint16_t> sums, std::span<float> out, int P) {
  const std::size_t n = sums.size();
  std::size_t i = 0;
  if constexpr (std::is_base_of_v<commpact::detail::fp16_format, Cast>)
    i = half::cast_decode_mean_prefix(sums.data(), out.data(), n, P);
  else if constexpr (std::is_base_of_v<commpact::detail::bf16_format, Cast>)
    i = bf16::cast_decode_mean_prefix(sums.data(), out.data(), n, P);
  if (i > n) return false;
  if (i == 0)  // no prefix ran, so no code was checked yet
    for (std::size_t j = 0; j < n; ++j)
      if (!Cast::finite_code(sums[j])) return false;
  for (; i < n; ++i) out[i] = mean_of(Cast::from_code(sums[i]), P);
  return true;
}

}  // namespace commpact::host
