// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file topk.hpp
//! (Over 400 lines on purpose: one selection algorithm, sampled bound + SIMD filter +
//! radix select with its fallbacks, whose parts are only meaningful together.)
//! Exact top-k selection by absolute value on the host.
//!
//! \code
//! commpact::host::topk_workspace ws;                 // reused across steps
//! std::vector<std::int32_t> idx(k);
//! std::vector<float> val(k);
//! commpact::host::topk_abs(grad, k, idx, val, ws);   // k largest |grad[i]|, index-sorted
//! \endcode
//!
//! Order. Entries are ranked by `abs_key(x)`, the IEEE-754 bit pattern of x with the
//! sign bit cleared, read as an unsigned integer, largest first; equal keys are ranked
//! by the smaller index first. For every non-NaN value this is exactly the order of
//! |x| (+0 and -0 are equal, denormals rank below normals, +-Inf above every finite
//! value). A NaN's key is above +Inf's, so NaNs rank above everything (a NaN with a
//! larger payload above one with a smaller payload); the selection stays exact and
//! deterministic and never reads or writes out of bounds. Callers that must reject
//! non-finite gradients check finiteness themselves (a NaN in x is selected first, so
//! checking the selected values finds it whenever k > 0).
//!
//! Algorithm (single thread, deterministic, O(n) for every input):
//!  1. Sampled path (n >= 2^15 and k small enough that the sample can bracket it): read a
//!     fixed sample of x (1024 to 4096 evenly spaced chunks of 8 consecutive entries:
//!     at least 64 n / k keys or n / 256, at most 32768),
//!     take as bound L the sample's j-th largest key, j = e + 4 sqrt(e) + 4 with
//!     e = k s / n the expected number of sample entries in the top k, and in one pass
//!     over x collect the index and bits of every entry with key >= L (a vectorised test
//!     of 16 keys per block, so blocks without a hit cost a few instructions). When
//!     between k and the planned capacity (about 1.6 to 3.7 k) entries qualify, an exact
//!     radix select on those candidates gives the threshold, and one pass over them the
//!     output. Expected cost: one read of x plus O(k).
//!  2. Second bound: when too many entries passed (a big group of ties at L) the smallest
//!     sample key above L, when too few a deeper sample rank; one more collect pass.
//!  3. Fallback (small n, large k, or both bounds missed, e.g. on massively tied data): an
//!     MSD radix select over the 31 key bits (11 + 10 + 10 bits: one histogram pass over
//!     x, then passes that only count the chosen bucket, the last one skipped when that
//!     bucket holds one key), then a collect pass into the output, or into the candidate
//!     buffer when the chosen top buckets fit there. At most about six passes over x in
//!     the worst case; no allocation beyond the candidate buffer of the sampled path.
//! The result does not depend on the path taken.

#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>

#include "../../error.hpp"
#include "simd.hpp"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace commpact::host {

//! The order key of |v|: the bits of v with the sign cleared. Monotone in |v| for every
//! non-NaN v; NaNs map above +Inf (0x7f800000).
[[nodiscard]] constexpr std::uint32_t abs_key(float v) noexcept {
  return std::bit_cast<std::uint32_t>(v) & 0x7fffffffu;
}

//! Largest span length the kernels accept: indices are int32.
inline constexpr std::size_t max_kernel_length = std::size_t{1} << 31;  // exclusive

namespace detail {

//! Uninitialised, grow-only scratch storage of trivially copyable T.
template <class T>
class grow_buffer {
 public:
  //! Makes room for n elements (contents are not kept). Returns true when it allocated.
  bool reserve(std::size_t n) {
    if (n <= cap_) return false;
    data_.reset(new T[n]);
    cap_ = n;
    return true;
  }
  [[nodiscard]] T* data() noexcept { return data_.get(); }
  [[nodiscard]] const T* data() const noexcept { return data_.get(); }
  [[nodiscard]] std::size_t capacity() const noexcept { return cap_; }

 private:
  std::unique_ptr<T[]> data_;
  std::size_t cap_ = 0;
};

//! The k-th largest of a set of keys and how many keys are strictly larger.
struct kth_key {
  std::uint32_t key;
  std::size_t above;
};

//! Walks a histogram from the top bucket down to the bucket holding the k-th largest
//! element (k >= 1, k <= total). Returns the bucket; `above` is increased by the count of
//! the buckets above it and k is turned into a rank inside the bucket.
template <std::size_t B>
inline std::uint32_t walk_down(const std::array<std::uint32_t, B>& hist, std::size_t& k, std::size_t& above) {
  std::size_t b = B - 1;
  for (;; --b) {
    if (hist[b] >= k) break;
    k -= hist[b];
    above += hist[b];
  }
  return static_cast<std::uint32_t>(b);
}

//! Histogram of the top 11 bits of key(i) for i in [0, m) (key(i) < 2^31). Large inputs
//! use four interleaved tables, so that runs of equal buckets (clustered or tied data) do
//! not serialise on one counter.
template <class KeyOf>
inline std::array<std::uint32_t, 2048> hist11(std::size_t m, KeyOf key) {
  std::array<std::uint32_t, 2048> h{};
  std::size_t i = 0;
  if (m >= 8192) {
    std::array<std::array<std::uint32_t, 2048>, 3> t{};
    const std::size_t m4 = m - m % 4;
    for (; i < m4; i += 4) {
      ++h[key(i) >> 20];
      ++t[0][key(i + 1) >> 20];
      ++t[1][key(i + 2) >> 20];
      ++t[2][key(i + 3) >> 20];
    }
    for (std::size_t b = 0; b < 2048; ++b) h[b] += t[0][b] + t[1][b] + t[2][b];
  }
  for (; i < m; ++i) ++h[key(i) >> 20];
  return h;
}

//! Exact k-th largest of the keys bits[i] & 0x7fffffff, i in [0, m) (1 <= k <= m), by MSD
//! radix select over 11 + 10 + 10 bits. bits may hold raw float bit patterns (the sign is
//! masked off) or keys. scratch must hold m entries; bits is not modified.
inline kth_key kth_largest_key(const std::uint32_t* bits, std::size_t m, std::size_t k, std::uint32_t* scratch) {
  constexpr std::uint32_t mag = 0x7fffffffu;
  const std::array<std::uint32_t, 2048> h1 = hist11(m, [bits](std::size_t i) { return bits[i] & mag; });
  std::size_t above = 0;
  const std::uint32_t b1 = walk_down(h1, k, above);
  std::size_t m2 = 0;
  for (std::size_t i = 0; i < m; ++i) {
    const std::uint32_t v = bits[i] & mag;
    scratch[m2] = v;
    m2 += (v >> 20) == b1;
  }
  std::array<std::uint32_t, 1024> h2{};
  for (std::size_t i = 0; i < m2; ++i) ++h2[(scratch[i] >> 10) & 1023u];
  const std::uint32_t b2 = walk_down(h2, k, above);
  const std::uint32_t p2 = (b1 << 10) | b2;
  std::array<std::uint32_t, 1024> h3{};
  for (std::size_t i = 0; i < m2; ++i) {
    const std::uint32_t v = scratch[i];
    h3[v & 1023u] += (v >> 10) == p2;
  }
  const std::uint32_t b3 = walk_down(h3, k, above);
  return {(p2 << 10) | b3, above};
}

//! Histogram of the top 11 abs_key bits of x.
inline std::array<std::uint32_t, 2048> abs_key_hist11(const float* x, std::size_t n) {
  return hist11(n, [x](std::size_t i) { return abs_key(x[i]); });
}

//! Block width of the filter loops: a vectorised test of 16 keys per block (is any key
//! in range?), then a walk over the set bits of the block's hit mask.
inline constexpr std::size_t filter_block = 16;

//! Bit j of the result is set when lo <= abs_key(p[j]) (and, when Bounded,
//! abs_key(p[j]) <= hi), for j < 16. Keys compare as int32: all keys are below 2^31.
//! lom1 = lo - 1 as int32 (-1 for lo = 0).
#if defined(__SSE2__)
using key_vec = __m128i;
inline key_vec splat_key(std::int32_t v) noexcept { return _mm_set1_epi32(v); }

template <bool Bounded>
inline unsigned block_mask16(const float* p, key_vec lom1, key_vec hi) noexcept {
  const __m128i mag = _mm_set1_epi32(0x7fffffff);
  __m128i k[4];
  __m128i c[4];
  for (int q = 0; q < 4; ++q) {
    k[q] = _mm_and_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 4 * q)), mag);
    c[q] = _mm_cmpgt_epi32(k[q], lom1);
    if constexpr (Bounded) c[q] = _mm_andnot_si128(_mm_cmpgt_epi32(k[q], hi), c[q]);
  }
  const __m128i any = _mm_or_si128(_mm_or_si128(c[0], c[1]), _mm_or_si128(c[2], c[3]));
  if (_mm_movemask_epi8(any) == 0) return 0;
  return static_cast<unsigned>(_mm_movemask_ps(_mm_castsi128_ps(c[0]))) |
         static_cast<unsigned>(_mm_movemask_ps(_mm_castsi128_ps(c[1]))) << 4 |
         static_cast<unsigned>(_mm_movemask_ps(_mm_castsi128_ps(c[2]))) << 8 |
         static_cast<unsigned>(_mm_movemask_ps(_mm_castsi128_ps(c[3]))) << 12;
}
#else
using key_vec = std::int32_t;
inline key_vec splat_key(std::int32_t v) noexcept { return v; }

template <bool Bounded>
inline unsigned block_mask16(const float* p, key_vec lom1, key_vec hi) noexcept {
  unsigned m = 0;
  for (unsigned j = 0; j < 16; ++j) {
    const auto v = static_cast<std::int32_t>(abs_key(p[j]));
    m |= static_cast<unsigned>(v > lom1 && (!Bounded || v <= hi)) << j;
  }
  return m;
}
#endif

//! Calls f(i) for every i in [begin, n) with lo <= abs_key(x[i]) (<= hi when Bounded), in
//! increasing order. After each block with a hit, stops when stop() is true. Returns the
//! index where it stopped (a block boundary: every entry before it was visited), or n.
template <bool Bounded, class F, class Stop>
inline std::size_t for_each_key_in(const float* x, std::size_t begin, std::size_t n, std::uint32_t lo, std::uint32_t hi,
                                   F&& f, Stop&& stop) {
  const key_vec lom1 = splat_key(static_cast<std::int32_t>(lo) - 1);
  const key_vec hiv = splat_key(static_cast<std::int32_t>(hi & 0x7fffffffu));
  std::size_t i = begin;
  for (; i + filter_block <= n; i += filter_block) {
    unsigned m = block_mask16<Bounded>(x + i, lom1, hiv);
    if (m == 0) continue;
    if (m == 0xffffu) {  // every entry hits (tied or dense data): no bit walk
      for (std::size_t j = 0; j < filter_block; ++j) f(i + j);
    } else {
      do {
        f(i + static_cast<std::size_t>(std::countr_zero(m)));
        m &= m - 1;
      } while (m != 0);
    }
    if (stop()) return i + filter_block;
  }
  for (; i < n; ++i) {
    const std::uint32_t v = abs_key(x[i]);
    if (v >= lo && (!Bounded || v <= hi)) f(i);
  }
  return n;
}

#if COMMPACT_HOST_SIMD && defined(__SSE2__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
//! block_mask16<false> with vectors of W bytes (the same bits): bit j set when
//! abs_key(p[j]) > lom1 (as int32), j < 16. The masks leave the vectors 16 bytes at a
//! time (SSE2 movemask), so that the body compiles at every width.
template <std::size_t W>
COMMPACT_ALWAYS_INLINE inline unsigned block_mask16_w(const float* p, std::int32_t lom1) noexcept {
  using vi = simd::vi_w<W>;
  constexpr std::size_t L = W / sizeof(float), G = filter_block / L, P = W / 16;
  vi c[G];
  vi any{};
  COMMPACT_UNROLL
  for (std::size_t q = 0; q < G; ++q) {
    const vi k = simd::load<vi>(p + q * L) & 0x7fffffff;
    c[q] = k > lom1;
    any |= c[q];
  }
  __m128i a = _mm_setzero_si128();
  COMMPACT_UNROLL
  for (std::size_t r = 0; r < P; ++r) {
    __m128i piece;
    std::memcpy(&piece, reinterpret_cast<const char*>(&any) + 16 * r, 16);
    a = _mm_or_si128(a, piece);
  }
  if (_mm_movemask_epi8(a) == 0) return 0;
  unsigned m = 0;
  COMMPACT_UNROLL
  for (std::size_t q = 0; q < G; ++q) {
    COMMPACT_UNROLL
    for (std::size_t r = 0; r < P; ++r) {
      __m128 piece;
      std::memcpy(&piece, reinterpret_cast<const char*>(&c[q]) + 16 * r, 16);
      m |= static_cast<unsigned>(_mm_movemask_ps(piece)) << (q * L + 4 * r);
    }
  }
  return m;
}
#pragma GCC diagnostic pop
#endif

//! collect_keys_geq's pass with vectors of W bytes (run at isa::active()'s width).
struct collect_geq_kernel {
  template <std::size_t W>
  COMMPACT_ALWAYS_INLINE static std::size_t run(const float* x, std::size_t n, std::uint32_t lo, std::int32_t* idx,
                                                std::uint32_t* bits, std::size_t cap) noexcept {
    std::size_t c = 0, i = 0;
    auto take = [&](std::size_t j) {
      idx[c] = static_cast<std::int32_t>(j);
      bits[c] = std::bit_cast<std::uint32_t>(x[j]);
      ++c;
    };
#if COMMPACT_HOST_SIMD && defined(__SSE2__)
    const auto lom1 = static_cast<std::int32_t>(lo) - 1;
    for (; i + filter_block <= n; i += filter_block) {
      unsigned m = block_mask16_w<W>(x + i, lom1);
      if (m == 0) continue;
      if (m == 0xffffu) {  // every entry hits (tied or dense data): no bit walk
        for (std::size_t j = 0; j < filter_block; ++j) take(i + j);
      } else {
        do {
          take(i + static_cast<std::size_t>(std::countr_zero(m)));
          m &= m - 1;
        } while (m != 0);
      }
      if (c > cap) return c;
    }
#endif
    for (; i < n; ++i) {
      if (abs_key(x[i]) >= lo) take(i);
      if (c > cap) return c;  // (stopping inside the tail keeps the room: cap + filter_block)
    }
    return c;
  }
};

//! Collects, in index order, the index and bit pattern of every entry of x with
//! key >= lo into idx/bits, whose room is cap + filter_block. Returns the count, or a
//! value > cap when more than cap entries qualify (the scan stops early). Runs at the
//! vector width of isa::active() (isa.hpp); the same result at every width.
inline std::size_t collect_keys_geq(const float* x, std::size_t n, std::uint32_t lo, std::int32_t* idx,
                                    std::uint32_t* bits, std::size_t cap) {
  return simd::dispatch<collect_geq_kernel>(x, n, lo, idx, bits, cap);
}

//! Writes, in index order, every entry with key > t and the first `ties` entries with key
//! == t (by index) to idx/val. Returns the count written. Once the ties are used up, the
//! rest of x is scanned for key > t only.
inline std::size_t collect_selected(const float* x, std::size_t n, std::uint32_t t, std::size_t ties, std::int32_t* idx,
                                    float* val) {
  std::size_t c = 0;
  auto take = [&](std::size_t i) {
    idx[c] = static_cast<std::int32_t>(i);
    val[c] = x[i];
    ++c;
  };
  std::size_t pos = 0;
  if (ties > 0)
    pos = for_each_key_in<false>(
        x, 0, n, t, 0,
        [&](std::size_t i) {
          const std::uint32_t v = abs_key(x[i]);
          if (v > t || ties > 0) {
            ties -= v == t;
            take(i);
          }
        },
        [&] { return ties == 0; });
  if (pos < n && t < 0x7fffffffu) for_each_key_in<false>(x, pos, n, t + 1, 0, take, [] { return false; });
  return c;
}

//! Exact k-th largest abs_key of x[0, n) (1 <= k <= n) reading x directly, given the
//! histogram h1 of the top 11 key bits: two more passes that only look at the chosen
//! bucket (vectorised skip of the others), no storage.
inline kth_key kth_largest_abs_direct(const float* x, std::size_t n, std::size_t k,
                                      const std::array<std::uint32_t, 2048>& h1) {
  std::size_t above = 0;
  const std::uint32_t b1 = walk_down(h1, k, above);
  // Four interleaved tables so that runs of one bucket do not serialise on one counter.
  std::array<std::array<std::uint32_t, 1024>, 4> h{};
  const std::uint32_t lo2 = b1 << 20;
  // Also notes whether every key in the bucket is the same (heavy ties: zeros, quantised
  // or saturated values); then that key is the answer and the third pass is skipped.
  std::uint32_t first = 0, diff = 0;
  bool seen = false;
  for_each_key_in<true>(
      x, 0, n, lo2, lo2 | 0xfffffu,
      [&](std::size_t i) {
        const std::uint32_t v = abs_key(x[i]);
        if (!seen) {
          first = v;
          seen = true;
        }
        diff |= v ^ first;
        ++h[i & 3][(v >> 10) & 1023u];
      },
      [] { return false; });
  if (diff == 0) return {first, above};
  for (std::size_t b = 0; b < 1024; ++b) h[0][b] += h[1][b] + h[2][b] + h[3][b];
  const std::uint32_t b2 = walk_down(h[0], k, above);
  const std::uint32_t p2 = (b1 << 10) | b2;
  h = {};
  const std::uint32_t lo3 = p2 << 10;
  for_each_key_in<true>(
      x, 0, n, lo3, lo3 | 1023u, [&](std::size_t i) { ++h[i & 3][abs_key(x[i]) & 1023u]; }, [] { return false; });
  for (std::size_t b = 0; b < 1024; ++b) h[0][b] += h[1][b] + h[2][b] + h[3][b];
  const std::uint32_t b3 = walk_down(h[0], k, above);
  return {(p2 << 10) | b3, above};
}

}  // namespace detail

//! Where the k-th largest |x| lies. Entry i is selected by topk_abs iff
//! abs_key(x[i]) > key, or abs_key(x[i]) == key and i is among the first `ties_taken`
//! indices with that key. `above + ties_taken == k`. For k == 0: key = 0xffffffff (above
//! every key), magnitude = +Inf, above = ties_taken = 0.
struct topk_threshold {
  std::uint32_t key;       //!< abs_key of the k-th largest entry
  float magnitude;         //!< that entry's |x| (a NaN if it is a NaN)
  std::size_t above;       //!< entries with a larger key (all selected)
  std::size_t ties_taken;  //!< entries with an equal key that are selected (>= 1 when k > 0)
};

namespace detail {
struct topk_impl;
}

//! Which path the last call took (for tests and tuning).
enum class topk_path : std::uint8_t {
  none,                  //!< no call yet
  trivial,               //!< k == 0 or k == n
  direct,                //!< radix select over x (small n or large k)
  sampled,               //!< one pass over x with a sampled lower bound, then select among candidates
  sampled_second_bound,  //!< the first bound missed; a second bound from the sample worked
  sampled_retry,         //!< both bounds missed; radix histogram, then candidates
  sampled_fallback       //!< both bounds missed; full radix select over x
};

//! Reusable scratch for topk_abs. It grows to what a given (n, k) needs on the first call
//! and never shrinks: later calls with the same or smaller sizes do not allocate.
class topk_workspace {
 public:
  //! Bytes held.
  [[nodiscard]] std::size_t capacity_bytes() const noexcept {
    return cand_idx_.capacity() * sizeof(std::int32_t) + cand_bits_.capacity() * sizeof(std::uint32_t) +
           scratch_.capacity() * sizeof(std::uint32_t) + sample_.capacity() * sizeof(std::uint32_t);
  }
  //! How many times the workspace has allocated since construction.
  [[nodiscard]] std::size_t allocations() const noexcept { return allocations_; }
  //! Address of the candidate buffer (changes only when the workspace allocates).
  [[nodiscard]] const void* data() const noexcept { return cand_idx_.data(); }
  //! The path the last call took.
  [[nodiscard]] topk_path last_path() const noexcept { return path_; }

  // Tuning constants of the sampled path (see topk.hpp's file comment).
  static constexpr std::size_t sample_chunks = 4096;  //!< most chunks in the sample
  static constexpr std::size_t sample_chunk_len = 8;  //!< consecutive entries per chunk
  static constexpr std::size_t sampled_min_n = std::size_t{1} << 15;
  //! Chunks sampled for (n, k), n >= sampled_min_n: enough for about 64 expected sample
  //! entries in the top k or n / 2048 chunks (a larger sample makes a tighter bound, worth
  //! it for large n), at least 1024 (or n / 32), at most sample_chunks. Chunk c
  //! starts at floor(c * (n - sample_chunk_len) / (chunks - 1)).
  static constexpr std::size_t sample_chunks_for(std::size_t n, std::size_t k) noexcept {
    const std::size_t want = k == 0 ? sample_chunks : std::max(8 * (n / k), n / 2048);
    const std::size_t most = std::min(sample_chunks, n / (4 * sample_chunk_len));
    return std::min(most, std::max(want, std::size_t{1024}));
  }

 private:
  friend struct detail::topk_impl;
  template <class T>
  void reserve(detail::grow_buffer<T>& b, std::size_t n) {
    if (b.reserve(n)) ++allocations_;
  }

  detail::grow_buffer<std::int32_t> cand_idx_;
  detail::grow_buffer<std::uint32_t> cand_bits_;
  detail::grow_buffer<std::uint32_t> scratch_;
  detail::grow_buffer<std::uint32_t> sample_;
  std::size_t allocations_ = 0;
  topk_path path_ = topk_path::none;
};

namespace detail {
inline void check_topk_args(std::span<const float> x, std::size_t k, std::size_t idx_size, std::size_t val_size,
                            bool need_out) {
  require(x.size() < max_kernel_length, "commpact::host::topk_abs: x has ", x.size(),
          " entries, but indices are int32, so a span must have fewer than 2^31 (", max_kernel_length,
          "); split the tensor into buckets of fewer than 2^31 entries.");
  require(k <= x.size(), "commpact::host::topk_abs: k = ", k, " is larger than the span length n = ", x.size(),
          "; k must be in [0, n]: pass a smaller k or check the density.");
  if (need_out) {
    require(idx_size >= k, "commpact::host::topk_abs: the index output holds ", idx_size, " entries, but k = ", k,
            " are written; pass an index span of at least k entries.");
    require(val_size >= k, "commpact::host::topk_abs: the value output holds ", val_size, " entries, but k = ", k,
            " are written; pass a value span of at least k entries.");
  }
}
}  // namespace detail

namespace detail {
struct topk_impl {
  //! The sampled path's plan for (n, k): chunks sampled, sample size s, rank j of the
  //! bound in the sample, candidate capacity cap.
  struct sample_plan {
    std::size_t chunks, s, j, cap;
  };

  //! The plan of the sampled path, or false when it does not apply (n < sampled_min_n, or
  //! k too large for the sample to bracket it). 1 <= k < n.
  static bool plan_sampled(std::size_t n, std::size_t k, sample_plan& p) {
    if (n < topk_workspace::sampled_min_n) return false;
    const std::size_t chunks = topk_workspace::sample_chunks_for(n, k);
    const std::size_t s = chunks * topk_workspace::sample_chunk_len;
    const double e = static_cast<double>(k) * static_cast<double>(s) / static_cast<double>(n);
    const auto j = static_cast<std::size_t>(std::ceil(e + 4.0 * std::sqrt(e) + 4.0));
    if (2 * j > s) return false;
    const double dj = static_cast<double>(j);
    std::size_t cap = std::min(n, static_cast<std::size_t>(std::ceil((dj + 6.0 * std::sqrt(dj) + 16.0) *
                                                                      static_cast<double>(n) / static_cast<double>(s))));
    p = {chunks, s, j, std::max(cap, k)};
    return true;
  }

  //! Reserves the buffers of the sampled path, fills the sample with key_at(i) (the key of
  //! entry i) at the plan's positions and returns the bound L: the sample's j-th largest.
  template <class KeyAt>
  static std::uint32_t sample_bound(topk_workspace& ws, std::size_t n, const sample_plan& p, KeyAt key_at) {
    ws.reserve(ws.sample_, 2 * topk_workspace::sample_chunks * topk_workspace::sample_chunk_len);
    ws.reserve(ws.cand_idx_, p.cap + detail::filter_block);
    ws.reserve(ws.cand_bits_, p.cap + detail::filter_block);
    ws.reserve(ws.scratch_, p.cap + detail::filter_block);
    std::uint32_t* smp = ws.sample_.data();
    // Chunk c starts at floor(c * span / (chunks - 1)), stepped without a division.
    const std::size_t chunks = p.chunks;
    const std::size_t span = n - topk_workspace::sample_chunk_len;
    const std::size_t step = span / (chunks - 1), carry = span % (chunks - 1);
    std::size_t start = 0, rem = 0;
    for (std::size_t c = 0; c < chunks; ++c) {
      for (std::size_t q = 0; q < topk_workspace::sample_chunk_len; ++q)
        smp[c * topk_workspace::sample_chunk_len + q] = key_at(start + q);
      start += step;
      rem += carry;
      if (rem >= chunks - 1) {
        ++start;
        rem -= chunks - 1;
      }
    }
    return detail::kth_largest_key(smp, p.s, p.j, smp + p.s).key;
  }

  //! The candidate buffers (room: the plan's cap + filter_block) after sample_bound.
  static std::int32_t* cand_idx(topk_workspace& ws) noexcept { return ws.cand_idx_.data(); }
  static std::uint32_t* cand_bits(topk_workspace& ws) noexcept { return ws.cand_bits_.data(); }
  static void set_path(topk_workspace& ws, topk_path p) noexcept { ws.path_ = p; }

  static topk_threshold make_threshold(detail::kth_key t, std::size_t k) noexcept {
    return topk_threshold{t.key, std::bit_cast<float>(t.key), t.above, k - t.above};
  }

  //! Finishes from the candidate list (index order, m entries) that holds every entry with
  //! key >= some bound, and at least k of them: the threshold, and the selection when idx
  //! and val are not null.
  static topk_threshold finish_from_candidates(topk_workspace& ws, std::size_t m, std::size_t k, std::int32_t* idx,
                                               float* val) {
    const detail::kth_key t = detail::kth_largest_key(ws.cand_bits_.data(), m, k, ws.scratch_.data());
    if (idx) {
      std::size_t ties = k - t.above;
      std::size_t c = 0;
      const std::int32_t* ci = ws.cand_idx_.data();
      const std::uint32_t* cb = ws.cand_bits_.data();
      // Branch-free: every step writes slot c (< k, so in bounds) and advances c when the
      // entry is taken; the loop ends once k are taken.
      for (std::size_t j = 0; j < m && c < k; ++j) {
        const std::uint32_t v = cb[j] & 0x7fffffffu;
        const bool eq = v == t.key;
        const bool take = (v > t.key) | (eq & (ties > 0));
        idx[c] = ci[j];
        val[c] = std::bit_cast<float>(cb[j]);
        c += take;
        ties -= eq & take;
      }
    }
    return make_threshold(t, k);
  }

  //! Computes the threshold and, when idx/val are not null, writes the selection.
  //! Arguments are checked by the callers.
  static topk_threshold run(std::span<const float> xs, std::size_t k, topk_workspace& ws, std::int32_t* idx,
                            float* val) {
    const float* x = xs.data();
    const std::size_t n = xs.size();
    auto make = [&](detail::kth_key t) { return make_threshold(t, k); };
    if (k == 0) {
      ws.path_ = topk_path::trivial;
      return {0xffffffffu, std::numeric_limits<float>::infinity(), 0, 0};
    }
    if (k == n) {
      ws.path_ = topk_path::trivial;
      std::uint32_t mn = 0xffffffffu;
      std::size_t eq = 0;
      for (std::size_t i = 0; i < n; ++i) {
        const std::uint32_t v = abs_key(x[i]);
        if (v < mn) {
          mn = v;
          eq = 0;
        }
        eq += v == mn;
        if (idx) {
          idx[i] = static_cast<std::int32_t>(i);
          val[i] = x[i];
        }
      }
      return make({mn, n - eq});
    }

    auto finish = [&](std::size_t m) { return finish_from_candidates(ws, m, k, idx, val); };

    // --- sampled path ---------------------------------------------------------------
    std::size_t cap = 0;
    sample_plan plan{};
    if (plan_sampled(n, k, plan)) {
      cap = plan.cap;
      const std::size_t s = plan.s, j = plan.j;
      const std::uint32_t lo = sample_bound(ws, n, plan, [x](std::size_t i) { return abs_key(x[i]); });
      const std::uint32_t* smp = ws.sample_.data();
      const std::size_t m = detail::collect_keys_geq(x, n, lo, ws.cand_idx_.data(), ws.cand_bits_.data(), cap);
      if (m >= k && m <= cap) {
        ws.path_ = topk_path::sampled;
        return finish(m);
      }
      // One more try with a second bound from the same sample: when too many entries
      // passed (a large group of ties at lo), the smallest sample key above lo; when too
      // few (the sample overestimated), a deeper sample rank, and below lo.
      std::uint32_t lo2 = lo;
      if (m > cap) {
        std::uint32_t next = 0xffffffffu;
        for (std::size_t q = 0; q < s; ++q)
          if (smp[q] > lo && smp[q] < next) next = smp[q];
        lo2 = next;
      } else if (4 * j + 16 <= s) {
        lo2 = detail::kth_largest_key(ws.sample_.data(), s, 4 * j + 16, ws.sample_.data() + s).key;
      }
      if (lo2 != lo && lo2 != 0xffffffffu) {
        const std::size_t m2 = detail::collect_keys_geq(x, n, lo2, ws.cand_idx_.data(), ws.cand_bits_.data(), cap);
        if (m2 >= k && m2 <= cap) {
          ws.path_ = topk_path::sampled_second_bound;
          return finish(m2);
        }
      }
    }

    // --- radix select over x ----------------------------------------------------------
    const std::array<std::uint32_t, 2048> h1 = detail::abs_key_hist11(x, n);
    if (cap > 0) {
      // The sample missed. If the top bucket range is small enough, use the candidates.
      std::size_t kk = k, above = 0;
      const std::uint32_t b1 = detail::walk_down(h1, kk, above);
      const std::size_t m = above + h1[b1];
      if (m <= cap) {
        const std::size_t got =
            detail::collect_keys_geq(x, n, b1 << 20, ws.cand_idx_.data(), ws.cand_bits_.data(), cap);
        (void)got;  // == m by construction
        ws.path_ = topk_path::sampled_retry;
        return finish(m);
      }
      ws.path_ = topk_path::sampled_fallback;
    } else {
      ws.path_ = topk_path::direct;
    }
    const detail::kth_key t = detail::kth_largest_abs_direct(x, n, k, h1);
    if (idx) detail::collect_selected(x, n, t.key, k - t.above, idx, val);
    return make(t);
  }
};
}  // namespace detail

//! Exact top-k of x by |x| (ties: the smaller index wins; order and NaN: see the file
//! comment). Writes exactly k entries, sorted by ascending index, to idx[0, k) and
//! val[0, k) (val[i] = x[idx[i]], sign kept). O(n); no allocation after the first call of
//! a given (n, k) on ws.
//! \throws commpact::invalid_argument when n >= 2^31, k > n, or idx/val hold fewer than k.
inline void topk_abs(std::span<const float> x, std::size_t k, std::span<std::int32_t> idx, std::span<float> val,
                     topk_workspace& ws) {
  detail::check_topk_args(x, k, idx.size(), val.size(), true);
  detail::topk_impl::run(x, k, ws, idx.data(), val.data());
}

//! The threshold of the top-k of x by |x| without writing the selection: the k-th largest
//! key and how many entries are above it / equal to it and taken (see topk_threshold).
//! \throws commpact::invalid_argument when n >= 2^31 or k > n.
inline topk_threshold topk_abs_threshold(std::span<const float> x, std::size_t k, topk_workspace& ws) {
  detail::check_topk_args(x, k, 0, 0, false);
  return detail::topk_impl::run(x, k, ws, nullptr, nullptr);
}

//! Writes the selection a threshold describes (entries with key > t.key and the first
//! t.ties_taken with key == t.key, in index order) to idx/val; returns the count
//! (t.above + t.ties_taken when t came from the same x). One pass, no workspace.
//! \throws commpact::invalid_argument when n >= 2^31 or idx/val hold fewer than
//!         t.above + t.ties_taken entries.
inline std::size_t select_by_threshold(std::span<const float> x, const topk_threshold& t, std::span<std::int32_t> idx,
                                       std::span<float> val) {
  const std::size_t k = t.above + t.ties_taken;
  require(x.size() < max_kernel_length, "commpact::host::select_by_threshold: x has ", x.size(),
          " entries; a span must have fewer than 2^31; split the tensor into buckets.");
  require(idx.size() >= k && val.size() >= k, "commpact::host::select_by_threshold: outputs hold ", idx.size(),
          " indices and ", val.size(), " values, but the threshold selects up to ", k,
          "; pass spans of at least above + ties_taken entries.");
  if (k == 0) return 0;
  // Count entries above t.key first so that a threshold from another x cannot overflow.
  std::size_t above = 0;
  for (float v : x) above += abs_key(v) > t.key;
  require(above <= k, "commpact::host::select_by_threshold: ", above, " entries of x are above the threshold key ",
          t.key, " but the threshold says ", t.above, "; compute the threshold on the same x.");
  return detail::collect_selected(x.data(), x.size(), t.key, k - above, idx.data(), val.data());
}

}  // namespace commpact::host
