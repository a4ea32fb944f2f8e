// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file randomk.hpp
//! Random-k's index draw: k = detail::k_of_density(density, n) indices drawn without
//! replacement (Floyd's algorithm on random_stream{seed, step, 0}), ascending, the same on
//! every rank. randomk_codec (compress/codecs/randomk.hpp) is built on it, and the CUDA
//! rows of LinearCompressor (kernels/cuda/rows_cast_vote.cuh) copy its indices to the
//! device.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../../error.hpp"
#include "bits.hpp"
#include "density.hpp"

namespace commpact {
namespace detail {

//! The indices random-k keeps at a step, and whether the kept values are scaled by n / k.
class randomk_draw {
 public:
  randomk_draw(double density, std::uint64_t seed, bool scaled) : density_(density), seed_(seed), scaled_(scaled) {}
  void begin_step(std::int64_t step) { step_ = step; }
  std::size_t size(std::size_t n) const {
    return static_cast<std::size_t>(k_of_density(density_, static_cast<std::int64_t>(n)));
  }
  //! The lengths random-k cannot serve (empty: none): its indices are int32 (the codec's
  //! check(n), which LinearCompressor's first-step agreement asks).
  std::string check(std::size_t n) const {
    if (n <= static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max())) return {};
    return cat("commpact::randomk_codec: the gradient has n = ", n,
               " entries; random-k's indices are int32, so n must be below 2^31: split the gradient into buckets.");
  }
  //! The indices of step `step` for length n (ascending).
  std::span<const std::int32_t> indices(std::size_t n) {
    if (n != drawn_n_ || step_ != drawn_step_) draw(n);
    return idx_;
  }
  //! The indices of the last draw.
  std::span<const std::int32_t> delivered() const { return idx_; }
  //! The length of the last draw (0 before the first).
  std::size_t drawn_length() const { return drawn_n_; }
  bool scaled() const { return scaled_; }
  std::uint64_t seed() const { return seed_; }
  //! The factor of the kept values for length n: n / k when scaled, else 1 (as a float).
  float factor(std::size_t n, std::size_t k) const {
    return scaled_ ? static_cast<float>(static_cast<double>(n) / static_cast<double>(k)) : 1.0f;
  }

 private:
  void draw(std::size_t n) {
    if (auto problem = check(n); !problem.empty()) throw invalid_argument(std::move(problem));
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

//! True for the LinearCodecs whose compress is a gather of randomk_draw's indices times
//! its factor and whose decompress_add is the matching scatter: the ones the CUDA rows of
//! LinearCompressor run on the device. compress/codecs/randomk.hpp sets it for
//! randomk_codec.
template <class K>
inline constexpr bool gathers_randomk_draw = false;

}  // namespace detail
}  // namespace commpact
