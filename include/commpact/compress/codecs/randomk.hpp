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

#include "../../error.hpp"
#include "bits.hpp"
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
class randomk_codec {
 public:
  explicit randomk_codec(double density = 0.01, std::uint64_t seed = 0, bool scaled = false)
      : density_(density), seed_(seed), scaled_(scaled) {
    require(density > 0.0 && density <= 1.0, "commpact::randomk_codec: density = ", density,
            " is outside (0, 1]; pass the fraction of entries to send, such as 0.01.");
  }
  void begin_step(std::int64_t step) { step_ = step; }
  std::size_t size(std::size_t n) const {
    return static_cast<std::size_t>(detail::k_of_density(density_, static_cast<std::int64_t>(n)));
  }
  //! The indices of step `step` for length n (ascending).
  std::span<const std::int32_t> indices(std::size_t n) {
    if (n != drawn_n_ || step_ != drawn_step_) draw(n);
    return idx_;
  }
  std::span<const std::int32_t> delivered() const { return idx_; }
  void compress(std::span<const float> v, std::span<float> out) {
    const auto ix = indices(v.size());
    const float s = scaled_ ? static_cast<float>(static_cast<double>(v.size()) / static_cast<double>(ix.size())) : 1.0f;
    for (std::size_t j = 0; j < ix.size(); ++j) out[j] = s * v[static_cast<std::size_t>(ix[j])];
  }
  void decompress_add(std::span<const float> in, std::span<float> acc) const {
    require(drawn_n_ == acc.size() && in.size() == idx_.size(), "commpact::randomk_codec::decompress_add: called for n = ",
            acc.size(), " with ", in.size(), " values; compress() of the same step and length comes first.");
    for (std::size_t j = 0; j < idx_.size(); ++j) acc[static_cast<std::size_t>(idx_[j])] += in[j];
  }
  bool scaled() const { return scaled_; }
  //! Scaled random-k is unbiased and runs without error feedback; unscaled keeps a residual.
  bool keeps_residual() const { return !scaled_; }

 private:
  void draw(std::size_t n) {
    const std::size_t k = size(n);
    const random_stream rng(seed_, step_, 0);
    mark_.assign(n, 0);
    idx_.clear();
    for (std::size_t j = n - k, d = 0; j < n; ++j, ++d) {  // Floyd: a uniform k-subset
      auto t = std::min(j, static_cast<std::size_t>(rng.uniform(d) * static_cast<double>(j + 1)));
      if (mark_[t]) t = j;
      mark_[t] = 1;
      idx_.push_back(static_cast<std::int32_t>(t));
    }
    std::sort(idx_.begin(), idx_.end());
    drawn_n_ = n, drawn_step_ = step_;
  }
  double density_;
  std::uint64_t seed_;
  bool scaled_;
  std::int64_t step_ = 0, drawn_step_ = -1;
  std::size_t drawn_n_ = 0;
  std::vector<std::int32_t> idx_;
  std::vector<unsigned char> mark_;
};

}  // namespace commpact
