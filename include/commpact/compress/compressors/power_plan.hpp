// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file power_plan.hpp
//! PowerCompressor's options and its layout plan (compressors/power.hpp): which tensors
//! travel as low-rank factors, where each one's P, Q, residual or dense part lives in the
//! packed buffers, and the hash every rank compares on its first step.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "../../detail/hash.hpp"
#include "../../kernels/power_products.hpp"
#include "../../nonfinite.hpp"
#include "../codecs/tensor_layout.hpp"

namespace commpact {

struct power_options {
  //! The approximation rank; 0 takes the class's `Rank`. Clamped per tensor to min(n, m).
  int approximation_rank = 0;
  //! A matrix is compressed when (n + m) r * min_compression_rate < n m (PyTorch's
  //! rule); otherwise (and for every vector) it is allreduced uncompressed. PyTorch's
  //! hook uses 2.
  double min_compression_rate = 2.0;
  //! Steps 0 .. start_step-1 are allreduced dense (PyTorch's hook uses 1000).
  std::int64_t start_step = 0;
  //! Seed of the first Q, shared by all ranks.
  std::uint64_t seed = 0x9E3779B97F4A7C15ull;
  //! Reuse the last Q as the start of the next step (the paper's warm start). When
  //! false, Q is redrawn every step from (seed, step).
  bool warm_start = true;
  nonfinite on_nonfinite = nonfinite::raise;
  //! How the products P = M Q, Q = M^T P and A = P Q^T run (kernels/power_products.hpp):
  //! `exact` (the default) in the host's summation order in every space, so that a
  //! cuda_space compressor gives the host's bits; `blas` on cuda_space as cuBLAS SGEMMs
  //! (faster; deterministic and bit-identical across ranks on the same GPU model and
  //! cuBLAS version; within docs/cuda.md's bound of the exact result). host_space and
  //! deferred_space always run the exact order, whatever this says. Every rank must pass
  //! the same value (checked on the first step); it is not part of the saved state, so
  //! a state saved with one value loads into a compressor with the other.
  power_products products = power_products::exact;
};

namespace detail {

//! One tensor of the flat buffer: its shape and clamped rank, and its offsets in the
//! packed P, Q and residual buffers (compressed) or in the dense part (not compressed).
struct power_entry {
  std::size_t offset = 0, rows = 0, cols = 0, r = 0;
  bool compressed = false;
  std::size_t p_off = 0, q_off = 0, e_off = 0, d_off = 0;
};

//! The plan of a layout: its entries, the packed sizes (P, Q, residual, dense floats),
//! the total length and the hash of the rank, the shapes in order and the options
//! (all but `products`, which the compressor adds to the hash the ranks compare only).
struct power_plan {
  std::vector<power_entry> entries;
  std::size_t p = 0, q = 0, e = 0, d = 0;
  std::int64_t total = 0, hash = 0;
};

//! PyTorch's rule (powerSGD_hook's _should_compress): a rows x cols matrix at rank
//! r = min(rank, rows, cols) is worth compressing when (rows + cols) r rate < rows cols,
//! strictly. PyTorch applies it to vectors too; plan_power does not compress them.
inline bool pytorch_compresses(std::int64_t rows, std::int64_t cols, std::int64_t rank, double rate) {
  const std::int64_t r = std::min(rank, std::min(rows, cols));
  const double dense = static_cast<double>(rows) * static_cast<double>(cols);
  const double low = static_cast<double>(rows + cols) * static_cast<double>(r);
  return low * rate < dense;
}

//! Plans `layout` at approximation rank `rank` (PyTorch's rule: compressed when
//! (n + m) r * min_compression_rate < n m, strictly; vectors never). Raises on a bad layout.
inline power_plan plan_power(const tensor_layout& layout, int rank, const power_options& opt) {
  power_plan pl;
  pl.total = check_layout(layout, "commpact::PowerCompressor::set_layout");
  std::size_t off = 0;
  for (const auto& s : layout) {
    power_entry en;
    en.offset = off;
    en.rows = static_cast<std::size_t>(s.rows);
    en.cols = static_cast<std::size_t>(s.cols);
    en.r = static_cast<std::size_t>(std::min<std::int64_t>(rank, std::min(s.rows, s.cols)));
    en.compressed = !s.is_vector() && pytorch_compresses(s.rows, s.cols, rank, opt.min_compression_rate);
    if (en.compressed) {
      en.p_off = pl.p;
      en.q_off = pl.q;
      en.e_off = pl.e;
      pl.p += en.rows * en.r;
      pl.q += en.cols * en.r;
      pl.e += en.rows * en.cols;
    } else {
      en.d_off = pl.d;
      pl.d += en.rows * en.cols;
    }
    off += en.rows * en.cols;
    pl.entries.push_back(en);
  }
  std::vector<std::int64_t> words = {rank, static_cast<std::int64_t>(layout.size()), opt.start_step,
                                     static_cast<std::int64_t>(opt.seed), opt.warm_start ? 1 : 0,
                                     static_cast<std::int64_t>(opt.on_nonfinite)};
  std::int64_t rate_bits;
  std::memcpy(&rate_bits, &opt.min_compression_rate, sizeof(rate_bits));
  words.push_back(rate_bits);
  for (const auto& s : layout) {
    words.push_back(s.rows);
    words.push_back(s.cols);
  }
  pl.hash = hash_words(words);
  return pl;
}

}  // namespace detail

}  // namespace commpact
