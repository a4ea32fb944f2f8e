// Sparse sets for the tests of sparse aggregations (TreeMerge, SparseReduceScatter): a
// random set per rank whose values tie in |v| and cancel in sums, and the block a codec
// would write for it (a sparse_wire frame, zero-padded).
#pragma once

#include <commpact/wire/sparse_frame.hpp>

#include <algorithm>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace commpact_test {

struct sparse_set {
  std::vector<std::int32_t> idx;  // strictly increasing
  std::vector<float> val;
};

//! A random set of at most k entries in [0, n); values often tie in |v| and cancel in sums.
inline sparse_set random_set(std::uint64_t seed, std::int64_t n, std::size_t k) {
  std::mt19937_64 g(seed);
  const std::size_t c = std::uniform_int_distribution<std::size_t>(0, k)(g);
  std::vector<std::int32_t> all(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<std::int32_t>(i);
  std::shuffle(all.begin(), all.end(), g);
  sparse_set s;
  s.idx.assign(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(c));
  std::sort(s.idx.begin(), s.idx.end());
  std::normal_distribution<float> nd;
  const float few[] = {1.0f, -1.0f, 2.0f, -0.5f, 0.5f};
  for (std::size_t e = 0; e < c; ++e) s.val.push_back(g() % 2 ? few[g() % 5] : nd(g));
  return s;
}

//! A block holding the sparse_wire frame of s (n_min = n_max = n, k_min = k_max = k, the
//! given flags; a flagged frame is empty), zero-padded to 48 + 8 kcap bytes.
inline std::vector<float> sparse_block(const sparse_set& s, std::int64_t n, std::int64_t k, std::size_t kcap,
                                       std::uint16_t flags = 0) {
  namespace sw = commpact::sparse_wire;
  std::vector<float> b((sw::header_bytes + sw::entry_bytes * kcap) / 4);
  sw::header h;
  h.flags = flags;
  h.n_min = h.n_max = n;
  h.k_min = h.k_max = k;
  const bool empty = flags != 0;
  sw::encode_frame(std::as_writable_bytes(std::span<float>(b)), h,
                   empty ? std::span<const std::int32_t>{} : std::span<const std::int32_t>(s.idx),
                   empty ? std::span<const float>{} : std::span<const float>(s.val));
  return b;
}

}  // namespace commpact_test
