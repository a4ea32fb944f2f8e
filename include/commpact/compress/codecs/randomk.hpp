// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file randomk.hpp
//! The random-k LinearCodec (see concepts/codec.hpp's LinearCodec and
//! compressors/linear.hpp's LinearCompressor, which reduces it by an allreduce).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "../../detail/hash.hpp"
#include "../../error.hpp"
#include "../../kernels/formulas/randomk.hpp"
#include "sparse_options.hpp"

namespace commpact {

//! Random-k (Stich et al., NeurIPS 2018; GRACE's `randomk`): the k =
//! detail::k_of_density(density, n) = clamp(floor(density n), 1, n) indices drawn
//! without replacement (Floyd's algorithm on random_stream{seed, step, 0}), the same on
//! every rank. Two modes, never mixed (ALGORITHMS.md):
//! - unscaled (default, GRACE's randomk): the kept values as they are, with error
//!   feedback (LinearCompressor keeps acc minus the sent entries);
//! - `scaled`: the kept values times n / k, an unbiased estimate (E = v), and no error
//!   feedback: keeps_residual() is false, so LinearCompressor keeps no residual.
class randomk_codec : public detail::randomk_draw {
 public:
  explicit randomk_codec(double density = 0.01, std::uint64_t seed = 0, bool scaled = false)
      : randomk_draw(density, seed, scaled) {
    require(density > 0.0 && density <= 1.0, "commpact::randomk_codec: density = ", density,
            " is outside (0, 1]; pass the fraction of entries to send, such as 0.01.");
  }
  void compress(std::span<const float> v, std::span<float> out) {
    const auto ix = indices(v.size());
    const float s = factor(v.size(), ix.size());
    for (std::size_t j = 0; j < ix.size(); ++j) out[j] = s * v[static_cast<std::size_t>(ix[j])];
  }
  void decompress_add(std::span<const float> in, std::span<float> acc) const {
    const auto ix = delivered();
    require(drawn_length() == acc.size() && in.size() == ix.size(),
            "commpact::randomk_codec::decompress_add: called for n = ", acc.size(), " with ", in.size(),
            " values; compress() of the same step and length comes first.");
    for (std::size_t j = 0; j < ix.size(); ++j) acc[static_cast<std::size_t>(ix[j])] += in[j];
  }
  //! Scaled random-k is unbiased and runs without error feedback; unscaled keeps a residual.
  bool keeps_residual() const { return !scaled(); }
  //! What every rank must share (LinearCompressor agrees on it with the length): a hash
  //! (62 bits) of the seed, the scaling and k for length n. Ranks with other seeds would
  //! each decode the sum onto their own indices.
  std::int64_t agreement(std::size_t n) const {
    const std::int64_t w[] = {static_cast<std::int64_t>(seed()), scaled() ? 1 : 0, static_cast<std::int64_t>(size(n))};
    return detail::hash_words(w);
  }
};

namespace detail {
template <>
inline constexpr bool gathers_randomk_draw<randomk_codec> = true;
}  // namespace detail

}  // namespace commpact
