// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file sparse_merge.hpp
//! Merge of two index-sorted sparse sets followed by a top-k by |value| (the merge step
//! of gTopKAllReduce).
//!
//! \code
//! commpact::host::merge_workspace ws;
//! // a: the lower rank's set, b: the higher rank's; both partners pass them in this order
//! std::size_t m = commpact::host::sparse_merge_topk(ia, va, ib, vb, k, io, vo, ws);
//! \endcode
//!
//! Semantics: the union of the indices of a and b; where an index is in both, the value
//! is va[i] + vb[j] (exactly that float addition, so both partners get the same bits);
//! then the k entries with the largest abs_key(value) are kept (ties: the smaller index;
//! order and NaN as in topk.hpp), written sorted by index. Entries whose sum is zero stay
//! in the union and are kept when fewer than k entries are non-zero (the output count is
//! min(k, |union|)). O(|a| + |b|), single thread, deterministic.

#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>

#include "../../error.hpp"
#include "topk.hpp"

namespace commpact::host {

//! Reusable scratch for sparse_merge_topk: grows to |a| + |b| on the first call of a given
//! size and never shrinks.
class merge_workspace {
 public:
  [[nodiscard]] std::size_t capacity_bytes() const noexcept {
    return idx_.capacity() * sizeof(std::int32_t) + bits_.capacity() * sizeof(std::uint32_t) +
           scratch_.capacity() * sizeof(std::uint32_t);
  }
  //! How many times the workspace has allocated since construction.
  [[nodiscard]] std::size_t allocations() const noexcept { return allocations_; }
  //! Address of the union buffer (changes only when the workspace allocates).
  [[nodiscard]] const void* data() const noexcept { return idx_.data(); }

 private:
  friend std::size_t sparse_merge_topk(std::span<const std::int32_t>, std::span<const float>,
                                       std::span<const std::int32_t>, std::span<const float>, std::size_t,
                                       std::span<std::int32_t>, std::span<float>, merge_workspace&);
  void reserve(std::size_t n) {
    bool grew = idx_.reserve(n);
    grew |= bits_.reserve(n);
    grew |= scratch_.reserve(n);
    allocations_ += grew;
  }
  detail::grow_buffer<std::int32_t> idx_;
  detail::grow_buffer<std::uint32_t> bits_;  // union values as bit patterns
  detail::grow_buffer<std::uint32_t> scratch_;
  std::size_t allocations_ = 0;
};

namespace detail {
inline void check_sparse_set(const char* name, std::span<const std::int32_t> i, std::span<const float> v) {
  require(i.size() == v.size(), "commpact::host::sparse_merge_topk: set ", name, " has ", i.size(), " indices but ",
          v.size(), " values; pass equally long index and value spans.");
  require(i.size() < max_kernel_length, "commpact::host::sparse_merge_topk: set ", name, " has ", i.size(),
          " entries; a set must have fewer than 2^31.");
  for (std::size_t j = 1; j < i.size(); ++j)
    require(i[j - 1] < i[j], "commpact::host::sparse_merge_topk: set ", name, " is not strictly sorted: index ",
            i[j - 1], " at position ", j - 1, " is followed by ", i[j],
            "; pass indices in ascending order without duplicates (as topk_abs writes them).");
}
}  // namespace detail

//! Merges two index-sorted sparse sets (no duplicate index within a set): the union of
//! the indices, values summed where indices coincide (va + vb in that order: pass the
//! lower rank's set as a), then keeps the k largest |value| (ties: the smaller index),
//! sorted by index, in io/vo. Returns the output count, min(k, |union|).
//! \throws commpact::invalid_argument when an index span and its value span differ in
//!         length, a set is not strictly ascending, or io/vo hold fewer than
//!         min(k, |a| + |b|) entries (checked before anything is written).
inline std::size_t sparse_merge_topk(std::span<const std::int32_t> ia, std::span<const float> va,
                                     std::span<const std::int32_t> ib, std::span<const float> vb, std::size_t k,
                                     std::span<std::int32_t> io, std::span<float> vo, merge_workspace& ws) {
  detail::check_sparse_set("a", ia, va);
  detail::check_sparse_set("b", ib, vb);
  const std::size_t na = ia.size(), nb = ib.size();
  const std::size_t need = std::min(k, na + nb);
  require(io.size() >= need && vo.size() >= need, "commpact::host::sparse_merge_topk: outputs hold ", io.size(),
          " indices and ", vo.size(), " values, but up to min(k, |a| + |b|) = ", need,
          " entries are written; pass output spans of at least that size.");
  if (k == 0) return 0;

  ws.reserve(na + nb);
  std::int32_t* ui = ws.idx_.data();
  std::uint32_t* ub = ws.bits_.data();
  std::size_t m = 0, p = 0, q = 0;
  while (p < na && q < nb) {
    const std::int32_t x = ia[p], y = ib[q];
    float v;
    if (x < y) {
      ui[m] = x;
      v = va[p++];
    } else if (y < x) {
      ui[m] = y;
      v = vb[q++];
    } else {
      ui[m] = x;
      v = va[p++] + vb[q++];
    }
    ub[m] = std::bit_cast<std::uint32_t>(v);
    ++m;
  }
  for (; p < na; ++p, ++m) {
    ui[m] = ia[p];
    ub[m] = std::bit_cast<std::uint32_t>(va[p]);
  }
  for (; q < nb; ++q, ++m) {
    ui[m] = ib[q];
    ub[m] = std::bit_cast<std::uint32_t>(vb[q]);
  }

  if (m <= k) {
    for (std::size_t j = 0; j < m; ++j) {
      io[j] = ui[j];
      vo[j] = std::bit_cast<float>(ub[j]);
    }
    return m;
  }
  const detail::kth_key t = detail::kth_largest_key(ub, m, k, ws.scratch_.data());
  std::size_t ties = k - t.above;
  std::size_t c = 0;
  // Branch-free: every step writes slot c (< k, so in bounds) and advances c when the
  // entry is taken; the loop ends once k are taken.
  for (std::size_t j = 0; j < m && c < k; ++j) {
    const std::uint32_t v = ub[j] & 0x7fffffffu;
    const bool eq = v == t.key;
    const bool take = (v > t.key) | (eq & (ties > 0));
    io[c] = ui[j];
    vo[c] = std::bit_cast<float>(ub[j]);
    c += take;
    ties -= eq & take;
  }
  return c;
}

}  // namespace commpact::host
