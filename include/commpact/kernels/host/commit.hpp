#pragma once
//! \file commit.hpp
//! The commit of a sparse step: the sparse result written into a zeroed dense gradient,
//! and the delivered entries removed from the error-feedback residual.
//!
//! \code
//! // grad = 0 except grad[idx[j]] = val[j] / P; residual[d] = 0 for delivered d
//! commpact::host::commit_sparse(grad, idx, val, float(P), residual, velocity, delivered, alive);
//! \endcode
//!
//! `scatter_into_zeroed` is the fused part: one streaming pass writes each 4 KB block of
//! the output from a small L1 buffer (zeroed, then the block's sparse entries placed), so
//! the k scattered stores hit L1 instead of missing in a buffer that a memset has just
//! evicted. For outputs above 1 M floats (SSE2) the blocks are written with non-temporal
//! stores, which also saves the read-for-ownership of the output's cache lines.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "../../error.hpp"
#include "simd.hpp"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace commpact::host {

namespace detail {
//! Floats per output block of scatter_into_zeroed.
inline constexpr std::size_t commit_block = 1024;
//! Outputs at least this long are written with non-temporal stores (SSE2 only).
inline constexpr std::size_t commit_stream_min = std::size_t{1} << 20;

//! Writes out[b, b + len) from the block's entries idx[j, ...) (ascending, >= b). Returns
//! the first j not in the block. Stream: the destination is 16-byte aligned and len a
//! multiple of 4; write with non-temporal stores.
template <bool Stream>
inline std::size_t emit_block(float* out, std::size_t b, std::size_t len, const std::int32_t* idx, const float* val,
                              std::size_t j, std::size_t k, float divisor) noexcept {
  const std::size_t e = b + len;
  if constexpr (!Stream) {
    std::memset(out + b, 0, len * sizeof(float));
    for (; j < k && static_cast<std::size_t>(idx[j]) < e; ++j) out[idx[j]] = val[j] / divisor;
    return j;
  } else {
#if defined(__SSE2__)
    alignas(64) float tmp[commit_block];
    std::memset(tmp, 0, len * sizeof(float));
    for (; j < k && static_cast<std::size_t>(idx[j]) < e; ++j) tmp[static_cast<std::size_t>(idx[j]) - b] = val[j] / divisor;
    for (std::size_t t = 0; t < len; t += 4) _mm_stream_ps(out + b + t, _mm_load_ps(tmp + t));
#endif
    return j;
  }
}
}  // namespace detail

//! out[i] = 0 for every i, then out[idx[j]] = val[j] / divisor for each j (the quotient
//! rounded once, as `val[j] / divisor` in a scalar loop). idx must be strictly ascending
//! and inside [0, out.size()); idx and val have equal lengths. All checks run before
//! anything is written (invalid_argument names the offending position).
inline void scatter_into_zeroed(std::span<float> out, std::span<const std::int32_t> idx, std::span<const float> val,
                                float divisor = 1.0f) {
  const std::size_t n = out.size(), k = idx.size();
  require(val.size() == k, "commpact::host::scatter_into_zeroed: ", k, " indices but ", val.size(),
          " values; pass equally long index and value spans.");
  for (std::size_t j = 0; j < k; ++j) {
    require(idx[j] >= 0 && static_cast<std::size_t>(idx[j]) < n, "commpact::host::scatter_into_zeroed: index ",
            idx[j], " at position ", j, " is outside the output of length ", n,
            "; indices must be in [0, n): check the set came from a vector of this length.");
    require(j == 0 || idx[j] > idx[j - 1], "commpact::host::scatter_into_zeroed: index ", idx[j], " at position ", j,
            " does not follow ", (j ? idx[j - 1] : 0),
            "; the indices must be strictly ascending (sort the set, or use scatter() after a fill).");
  }
  float* o = out.data();
  std::size_t b = 0, j = 0;
#if defined(__SSE2__)
  if (n >= detail::commit_stream_min) {
    const std::size_t head = ((16 - reinterpret_cast<std::uintptr_t>(o) % 16) % 16) / sizeof(float);
    if (reinterpret_cast<std::uintptr_t>(o) % sizeof(float) == 0) {
      j = detail::emit_block<false>(o, 0, head, idx.data(), val.data(), j, k, divisor);
      b = head;
      for (; b + detail::commit_block <= n; b += detail::commit_block)
        j = detail::emit_block<true>(o, b, detail::commit_block, idx.data(), val.data(), j, k, divisor);
      _mm_sfence();
    }
  }
#endif
  for (; b < n; b += detail::commit_block) {
    const std::size_t len = n - b < detail::commit_block ? n - b : detail::commit_block;
    j = detail::emit_block<false>(o, b, len, idx.data(), val.data(), j, k, divisor);
  }
}

//! residual[d] = 0 (and velocity[d] = 0 when velocity is not empty) for every delivered
//! index d = delivered[j] with alive[j] != 0 (every j when alive is empty). Indices are
//! checked against the residual's length before anything is written; any order, repeats
//! allowed.
inline void zero_delivered(std::span<float> residual, std::span<float> velocity,
                           std::span<const std::int32_t> delivered, std::span<const std::uint8_t> alive = {}) {
  const std::size_t n = residual.size();
  require(velocity.empty() || velocity.size() == n, "commpact::host::zero_delivered: velocity holds ",
          velocity.size(), " values but the residual ", n, "; pass an empty velocity or one of the same length.");
  require(alive.empty() || alive.size() == delivered.size(), "commpact::host::zero_delivered: ", alive.size(),
          " alive flags for ", delivered.size(), " delivered indices; pass one flag per index or none.");
  for (std::size_t j = 0; j < delivered.size(); ++j)
    require(delivered[j] >= 0 && static_cast<std::size_t>(delivered[j]) < n, "commpact::host::zero_delivered: index ",
            delivered[j], " at position ", j, " is outside the residual of length ", n, "; indices must be in [0, n).");
  for (std::size_t j = 0; j < delivered.size(); ++j) {
    if (!alive.empty() && !alive[j]) continue;
    const auto d = static_cast<std::size_t>(delivered[j]);
    residual[d] = 0.0f;
    if (!velocity.empty()) velocity[d] = 0.0f;
  }
}

//! The commit of a sparse step: scatter_into_zeroed(out, idx, val, divisor), then
//! zero_delivered(residual, velocity, delivered, alive). Every argument is checked before
//! anything is written. out must not share storage with residual or velocity.
inline void commit_sparse(std::span<float> out, std::span<const std::int32_t> idx, std::span<const float> val,
                          float divisor, std::span<float> residual, std::span<float> velocity,
                          std::span<const std::int32_t> delivered, std::span<const std::uint8_t> alive = {}) {
  const std::size_t n = residual.size();
  require(velocity.empty() || velocity.size() == n, "commpact::host::commit_sparse: velocity holds ", velocity.size(),
          " values but the residual ", n, "; pass an empty velocity or one of the same length.");
  require(alive.empty() || alive.size() == delivered.size(), "commpact::host::commit_sparse: ", alive.size(),
          " alive flags for ", delivered.size(), " delivered indices; pass one flag per index or none.");
  for (std::size_t j = 0; j < delivered.size(); ++j)
    require(delivered[j] >= 0 && static_cast<std::size_t>(delivered[j]) < n, "commpact::host::commit_sparse: index ",
            delivered[j], " at position ", j, " is outside the residual of length ", n, "; indices must be in [0, n).");
  simd::check_no_partial_overlap("commit_sparse", "out", out.data(), out.size(), "residual", residual.data(), n);
  require(out.data() != residual.data() || out.empty(),
          "commpact::host::commit_sparse: out and residual are the same buffer; pass separate buffers.");
  scatter_into_zeroed(out, idx, val, divisor);
  zero_delivered(residual, velocity, delivered, alive);
}

}  // namespace commpact::host
