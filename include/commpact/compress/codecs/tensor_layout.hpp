// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file tensor_layout.hpp
//! The shapes of the tensors in one flat buffer, as PowerSGD and the gossip mixers see
//! a model: each tensor a row-major matrix `rows x cols` (a conv weight is
//! `out x in*kh*kw`; a bias is `{n}`).
//!
//! \code
//! commpact::tensor_layout layout = {{64, 3 * 7 * 7}, {64}, {10, 512}, {10}};
//! \endcode

#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "../../error.hpp"

namespace commpact {

//! Shape of one tensor in a flat buffer: a row-major `rows x cols` matrix. A vector
//! (bias) is `{n}` (cols = 1) or `{1, n}`.
struct tensor_shape {
  std::int64_t rows = 0;
  std::int64_t cols = 1;

  //! rows * cols; valid once check_layout() accepted the shape (no overflow).
  std::int64_t numel() const { return rows * cols; }
  bool is_vector() const { return rows == 1 || cols == 1; }
  bool operator==(const tensor_shape&) const = default;
};

using tensor_layout = std::vector<tensor_shape>;

namespace detail {

//! The most floats one buffer may hold: what std::vector<float> and int32-free index
//! arithmetic allow on this platform.
inline constexpr std::int64_t max_buffer_floats = std::numeric_limits<std::int64_t>::max() / 8;

//! Checks every shape (dimensions >= 1, no overflow of the element counts) and returns
//! the total element count. Raises invalid_argument before anything is allocated.
inline std::int64_t check_layout(const tensor_layout& l, const char* who) {
  require(!l.empty(), who, ": the layout is empty; list the shapes of the tensors in the flat buffer.");
  std::int64_t total = 0;
  for (std::size_t i = 0; i < l.size(); ++i) {
    const auto r = l[i].rows, c = l[i].cols;
    require(r >= 1 && c >= 1, who, ": tensor ", i, " has shape ", r, " x ", c,
            "; every dimension must be >= 1 (drop empty tensors from the layout).");
    require(r <= max_buffer_floats / c, who, ": tensor ", i, " has shape ", r, " x ", c,
            ", more elements than one buffer can hold (", max_buffer_floats,
            "); check the shape (is it the number of elements rather than a dimension?).");
    require(r * c <= max_buffer_floats - total, who, ": the tensors up to ", i, " hold more than ", max_buffer_floats,
            " elements together; one flat buffer cannot hold them.");
    total += r * c;
  }
  return total;
}

}  // namespace detail
}  // namespace commpact
