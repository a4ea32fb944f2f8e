// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file scatter.hpp
//! Moving sparse (index, value) sets in and out of dense vectors.
//!
//! <!-- snippet: dense=std::vector<float>; s=float -->
//! \code
//! commpact::host::scatter(dense, idx, val);          // dense[idx[i]] = val[i]
//! commpact::host::scatter_add(dense, idx, val);      // dense[idx[i]] += val[i]
//! commpact::host::scatter_add(dense, idx, val, s);   // dense[idx[i]] += s * val[i]
//! commpact::host::gather(dense, idx, val);           // val[i] = dense[idx[i]]
//! commpact::host::zero_at(dense, idx);               // dense[idx[i]] = 0
//! \endcode
//!
//! Every index is checked against the dense length before anything is written, so a bad
//! index raises commpact::invalid_argument and leaves the dense vector untouched. Entries
//! are applied in the order given (duplicate indices are allowed; later entries win for
//! scatter, accumulate in order for scatter_add), so results are deterministic.

#include <cstddef>
#include <cstdint>
#include <span>

#include "../../error.hpp"

namespace commpact::host {

namespace detail {
inline void check_indices(const char* fn, std::size_t n, std::span<const std::int32_t> idx, std::size_t nval) {
  require(idx.size() == nval, "commpact::host::", fn, ": ", idx.size(), " indices but ", nval,
          " values; pass equally long index and value spans.");
  for (std::size_t i = 0; i < idx.size(); ++i)
    require(idx[i] >= 0 && static_cast<std::size_t>(idx[i]) < n, "commpact::host::", fn, ": index ", idx[i],
            " at position ", i, " is outside the dense vector of length ", n,
            "; indices must be in [0, n): check the set came from a vector of this length.");
}
}  // namespace detail

//! dense[idx[i]] = val[i] for each i in order.
inline void scatter(std::span<float> dense, std::span<const std::int32_t> idx, std::span<const float> val) {
  detail::check_indices("scatter", dense.size(), idx, val.size());
  for (std::size_t i = 0; i < idx.size(); ++i) dense[static_cast<std::size_t>(idx[i])] = val[i];
}

//! dense[idx[i]] += val[i] for each i in order.
inline void scatter_add(std::span<float> dense, std::span<const std::int32_t> idx, std::span<const float> val) {
  detail::check_indices("scatter_add", dense.size(), idx, val.size());
  for (std::size_t i = 0; i < idx.size(); ++i) dense[static_cast<std::size_t>(idx[i])] += val[i];
}

//! dense[idx[i]] += scale * val[i] for each i in order (the product is rounded, then added).
inline void scatter_add(std::span<float> dense, std::span<const std::int32_t> idx, std::span<const float> val,
                        float scale) {
  detail::check_indices("scatter_add", dense.size(), idx, val.size());
  for (std::size_t i = 0; i < idx.size(); ++i) {
    const float p = scale * val[i];
    dense[static_cast<std::size_t>(idx[i])] += p;
  }
}

//! val[i] = dense[idx[i]].
inline void gather(std::span<const float> dense, std::span<const std::int32_t> idx, std::span<float> val) {
  detail::check_indices("gather", dense.size(), idx, val.size());
  for (std::size_t i = 0; i < idx.size(); ++i) val[i] = dense[static_cast<std::size_t>(idx[i])];
}

//! dense[idx[i]] = 0 for each i.
inline void zero_at(std::span<float> dense, std::span<const std::int32_t> idx) {
  detail::check_indices("zero_at", dense.size(), idx, idx.size());
  for (std::int32_t i : idx) dense[static_cast<std::size_t>(i)] = 0.0f;
}

}  // namespace commpact::host
