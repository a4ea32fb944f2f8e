// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file select.cuh
//! The device selection core behind top-k and the sparse merge: the k largest entries of
//! a set by abs_key (ties: the smaller position), written in position order, bit-identical
//! to commpact::host::topk_abs's order (kernels/host/topk.hpp). Only nvcc compiles this.
//!
//! Checked against its host twin by tests/cuda/test_cuda_ops.cu (docs/cuda.md, "Status", says
//! where it has run).
//!
//! Method (radix select in the manner of AIR top-k, Zhang et al., SC'23). Each entry at
//! position p has the 62-bit composite c = abs_key << 31 | (2^31 - 1 - p): the host's
//! order (larger key first, then the smaller index) is exactly descending c, and every c
//! is distinct, so the top k of c is one well-defined set. Its digits are 11, 10, 10 bits
//! of the key, then 11, 10, 10 bits of the inverted position.
//!  1. One histogram pass over the set of the top 11 key bits; a one-block pick kernel
//!     finds the bucket holding the k-th largest (a block-wide suffix scan).
//!  2. One stable compaction (cub::DeviceSelect::If when the length is known on the host,
//!     our two-kernel compaction when the count lives on the device) of the positions
//!     whose top digit is >= that bucket: the candidates, in position order.
//!  3. Histogram + pick passes over the candidates only, digit by digit, until the k-th
//!     bucket is resolved (its count equals the rank still sought: every entry of it is
//!     taken), at most five more; each kernel returns at once once resolved.
//!  4. The selection is then exactly {c : c >> shift >= prefix}; one stable compaction of
//!     the candidates writes it, in position order, through an emit functor.
//! Device traffic: two reads of the input (histogram, candidate selection) plus O(m)
//! for m candidates. Counts and the resolved threshold stay in device memory
//! (select_state); nothing synchronises the host. Deterministic: no step depends on the
//! order of atomics (histogram counts are order-free; compactions are stable).

#if !defined(__CUDACC__)
#error "commpact/kernels/cuda/select.cuh needs nvcc: include it from a .cu file only."
#endif

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_select.cuh>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/tabulate_output_iterator.h>

#include "grid.cuh"

namespace commpact::cuda_kernels {

#define COMMPACT_CU_TRY(expr)                \
  do {                                       \
    const cudaError_t commpact_e_ = (expr);  \
    if (commpact_e_ != cudaSuccess) return commpact_e_; \
  } while (0)

namespace detail {

inline constexpr int select_block = 256;
inline constexpr int pick_threads = 1024;
inline constexpr int max_bins = 2048;

__host__ __device__ constexpr int level_shift(int L) {
  return L == 0 ? 51 : L == 1 ? 41 : L == 2 ? 31 : L == 3 ? 20 : L == 4 ? 10 : 0;
}
__host__ __device__ constexpr int level_width(int L) { return (L == 0 || L == 3) ? 11 : 10; }

__device__ __forceinline__ std::uint64_t composite(std::uint32_t key, std::uint32_t pos) {
  return (static_cast<std::uint64_t>(key) << 31) | static_cast<std::uint64_t>(0x7fffffffu - pos);
}

//! The state of one selection, in device memory.
struct select_state {
  std::uint32_t count;   //!< entries in the set
  std::uint32_t k_rem;   //!< the rank still sought inside the current prefix
  std::uint32_t done;    //!< resolved: the selection is {c : c >> shift >= prefix}
  std::uint32_t shift;   //!< the current prefix is c >> shift
  std::uint64_t prefix;
  std::uint32_t m;       //!< candidates
  std::uint32_t out;     //!< entries selected (min(k, count))
  std::uint32_t k_all;   //!< the rank sought in the whole set (min(k, count))
  std::uint32_t bound;   //!< the sampled path's bound L: candidates are the keys >= L
  std::uint32_t ident;   //!< 1: the candidates are the whole set (candidate j is position j)
  std::uint32_t keys_at; //!< not 0: candidate j's abs_key is cand[keys_at + j] (the keyed sampled path)
};

//! abs_key of a float array (the host's abs_key: sign bit cleared).
struct float_keys {
  const float* v;
  __device__ __forceinline__ std::uint32_t key(std::uint32_t p) const { return __float_as_uint(v[p]) & 0x7fffffffu; }
};

__global__ void select_init(select_state* st, const std::uint32_t* d_count, std::uint32_t cap, std::uint32_t k,
                            const std::int64_t* d_k) {
  if (!decision_lane()) return;
  if (d_k) k = *d_k < 0 ? 0u : *d_k < std::int64_t(k) ? static_cast<std::uint32_t>(*d_k) : k;
  std::uint32_t cnt = d_count ? *d_count : cap;
  if (cnt > cap) cnt = cap;
  const std::uint32_t kr = k < cnt ? k : cnt;
  st->count = cnt;
  st->k_rem = kr;
  st->m = 0;
  st->out = 0;
  st->k_all = kr;
  st->bound = 0;
  st->ident = 0;
  st->keys_at = 0;
  st->shift = 62;
  st->prefix = kr == 0 ? 1 : 0;  // nothing (c >> 62 is 0) or, below, everything
  st->done = (kr == 0 || kr == cnt) ? 1u : 0u;
}

//! Entries each thread loads before it counts any (select_hist): independent loads in
//! flight per thread, so one pass streams x near the device's bandwidth (a grid-stride
//! loop of one load, then one atomic, keeps a single load in flight per thread).
inline constexpr int hist_batch = 8;

//! Position of candidate j: cand[j], or j itself when the candidates are the whole set
//! (the sampled path's fallback, st->ident).
__device__ __forceinline__ std::uint32_t cand_position(const select_state* st, const std::int32_t* cand,
                                                       std::uint32_t j) {
  return st->ident ? j : static_cast<std::uint32_t>(cand[j]);
}

//! abs_key of candidate j at position p: src.key(p), or, on the keyed sampled path, the
//! copy its selection pass wrote beside the positions (a contiguous read, not a gather).
template <class Src>
__device__ __forceinline__ std::uint32_t cand_key(const Src& src, const select_state* st, const std::int32_t* cand,
                                                  std::uint32_t j, std::uint32_t p) {
  const std::uint32_t at = st->keys_at;
  return at != 0 ? static_cast<std::uint32_t>(cand[at + j]) : src.key(p);
}

//! Histogram of digit L over the entries matching the current prefix: all of [0, count)
//! (OverCand false) or the candidates (OverCand true: cand[0, m), or [0, m) when
//! st->ident). Each thread loads hist_batch keys (coalesced: entry base + u * blockDim +
//! threadIdx) before it counts them.
template <class Src, bool OverCand>
__global__ void __launch_bounds__(select_block) select_hist(Src src, const select_state* st, const std::int32_t* cand,
                                                            std::uint32_t* hist, int L) {
  __shared__ std::uint32_t sh[max_bins];
  if (st->done) return;
  const int width = level_width(L), shift = level_shift(L);
  const std::uint32_t nb = 1u << width, mask = nb - 1;
  for (std::uint32_t i = threadIdx.x; i < nb; i += blockDim.x) sh[i] = 0;
  __syncthreads();
  const std::uint32_t total = OverCand ? st->m : st->count;
  const std::uint32_t cs = st->shift;
  const std::uint64_t cp = st->prefix;
  const std::uint32_t step = blockDim.x * hist_batch;
  for (std::uint32_t base = blockIdx.x * step; base < total; base += gridDim.x * step) {
    std::uint32_t pos[hist_batch], key[hist_batch];
#pragma unroll
    for (int u = 0; u < hist_batch; ++u) {
      const std::uint32_t j = base + static_cast<std::uint32_t>(u) * blockDim.x + threadIdx.x;
      pos[u] = j < total ? (OverCand ? cand_position(st, cand, j) : j) : 0u;
    }
#pragma unroll
    for (int u = 0; u < hist_batch; ++u) {
      const std::uint32_t j = base + static_cast<std::uint32_t>(u) * blockDim.x + threadIdx.x;
      key[u] = j < total ? (OverCand ? cand_key(src, st, cand, j, pos[u]) : src.key(pos[u])) : 0u;
    }
#pragma unroll
    for (int u = 0; u < hist_batch; ++u) {
      const std::uint32_t j = base + static_cast<std::uint32_t>(u) * blockDim.x + threadIdx.x;
      const std::uint64_t c = composite(key[u], pos[u]);
      if (j < total && (c >> cs) == cp) atomicAdd(&sh[static_cast<std::uint32_t>(c >> shift) & mask], 1u);
    }
  }
  __syncthreads();
  for (std::uint32_t i = threadIdx.x; i < nb; i += blockDim.x)
    if (sh[i]) atomicAdd(&hist[i], sh[i]);
}

//! One block of pick_threads: the bucket of digit L holding the k_rem-th largest, by a
//! suffix scan of the histogram; updates the state and zeroes the histogram.
__global__ void __launch_bounds__(pick_threads) select_pick(select_state* st, std::uint32_t* hist, int L) {
  using scan = cub::BlockScan<std::uint32_t, pick_threads>;
  __shared__ typename scan::TempStorage tmp;
  __shared__ std::uint32_t sel_b, sel_above, sel_h;
  if (st->done) return;
  const std::uint32_t nb = 1u << level_width(L);
  const std::uint32_t t = threadIdx.x;
  std::uint32_t h[2], inc[2];
  for (int q = 0; q < 2; ++q) {
    const std::uint32_t j = 2 * t + q;  // rank from the top bucket
    h[q] = j < nb ? hist[nb - 1 - j] : 0u;
  }
  scan(tmp).InclusiveSum(h, inc);
  const std::uint32_t kr = st->k_rem;
  for (int q = 0; q < 2; ++q)
    if (h[q] != 0 && inc[q] >= kr && inc[q] - h[q] < kr) {
      sel_b = nb - 1 - (2 * t + q);
      sel_above = inc[q] - h[q];
      sel_h = h[q];
    }
  __syncthreads();
  for (std::uint32_t i = t; i < static_cast<std::uint32_t>(max_bins); i += blockDim.x) hist[i] = 0;
  if (t == 0) {
    const std::uint32_t nk = kr - sel_above;
    st->k_rem = nk;
    st->prefix = (st->prefix << level_width(L)) | sel_b;
    st->shift = static_cast<std::uint32_t>(level_shift(L));
    if (sel_h == nk || L == 5) st->done = 1;
  }
}

//! Whether position p is in the current candidate / final set: c >> shift >= prefix.
template <class Src>
struct select_pred {
  Src src;
  const select_state* st;
  __device__ __forceinline__ bool operator()(std::int32_t p) const {
    const auto u = static_cast<std::uint32_t>(p);
    return (composite(src.key(u), u) >> st->shift) >= st->prefix;
  }
};

// ---- stable compaction with the count in device memory ------------------------------
inline constexpr int compact_blocks = 1024;

//! The chunk of block b: [begin, end), chunks a multiple of the block size.
__device__ __forceinline__ void compact_chunk(std::uint32_t total, std::uint32_t& begin, std::uint32_t& end) {
  const std::uint32_t per = (total + gridDim.x - 1) / gridDim.x;
  const std::uint32_t chunk = (per + blockDim.x - 1) / blockDim.x * blockDim.x;
  const std::uint64_t b = static_cast<std::uint64_t>(blockIdx.x) * chunk;
  begin = b < total ? static_cast<std::uint32_t>(b) : total;
  end = b + chunk < total ? static_cast<std::uint32_t>(b + chunk) : total;
}

template <class Pred>
__global__ void __launch_bounds__(select_block) compact_count(Pred pred, const std::uint32_t* total_p,
                                                              std::uint32_t* bcnt) {
  const std::uint32_t total = *total_p;
  std::uint32_t begin, end;
  compact_chunk(total, begin, end);
  std::uint32_t cnt = 0;
  for (std::uint32_t base = begin; base < end; base += blockDim.x) {
    const std::uint32_t j = base + threadIdx.x;
    cnt += static_cast<std::uint32_t>(__syncthreads_count(j < end && pred(static_cast<std::int32_t>(j))));
  }
  if (threadIdx.x == 0) bcnt[blockIdx.x] = cnt;
}

//! emit(j, o): entry j (pred true) is the o-th selected; *out_count = the total.
template <class Pred, class Emit>
__global__ void __launch_bounds__(select_block) compact_write(Pred pred, Emit emit, const std::uint32_t* total_p,
                                                              const std::uint32_t* bcnt, std::uint32_t* out_count) {
  using reduce = cub::BlockReduce<std::uint32_t, select_block>;
  using scan = cub::BlockScan<std::uint32_t, select_block>;
  __shared__ union {
    typename reduce::TempStorage r;
    typename scan::TempStorage s;
  } tmp;
  __shared__ std::uint32_t off;
  std::uint32_t part = 0;
  for (std::uint32_t i = threadIdx.x; i < blockIdx.x; i += blockDim.x) part += bcnt[i];
  const std::uint32_t before = reduce(tmp.r).Sum(part);
  if (threadIdx.x == 0) off = before;
  __syncthreads();
  const std::uint32_t total = *total_p;
  std::uint32_t begin, end;
  compact_chunk(total, begin, end);
  for (std::uint32_t base = begin; base < end; base += blockDim.x) {
    const std::uint32_t j = base + threadIdx.x;
    const bool f = j < end && pred(static_cast<std::int32_t>(j));
    std::uint32_t rank, agg;
    scan(tmp.s).ExclusiveSum(f ? 1u : 0u, rank, agg);
    if (f) emit(j, off + rank);
    __syncthreads();
    if (threadIdx.x == 0) off += agg;
    __syncthreads();
  }
  if (blockIdx.x == gridDim.x - 1 && threadIdx.x == 0) *out_count = off;
}

template <class Pred, class Emit>
cudaError_t compact(Pred pred, Emit emit, const std::uint32_t* total_p, std::uint32_t cap, std::uint32_t* bcnt,
                    std::uint32_t* out_count, cudaStream_t s) {
  std::uint32_t g = (cap + select_block - 1) / select_block;
  g = g < 1 ? 1 : g > compact_blocks ? compact_blocks : g;
  compact_count<<<g, select_block, 0, s>>>(pred, total_p, bcnt);
  COMMPACT_CU_TRY(cudaGetLastError());
  compact_write<<<g, select_block, 0, s>>>(pred, emit, total_p, bcnt, out_count);
  return cudaGetLastError();
}

//! Candidates of the device-count path: position j of the set is candidate j's position.
struct emit_position {
  std::int32_t* cand;
  __device__ __forceinline__ void operator()(std::uint32_t j, std::uint32_t o) const {
    cand[o] = static_cast<std::int32_t>(j);
  }
};

//! Over candidates: candidate j holds position cand[j] (j itself when st->ident), its key
//! as cand_key gives it.
template <class Src>
struct cand_pred {
  select_pred<Src> p;
  const std::int32_t* cand;
  __device__ __forceinline__ bool operator()(std::int32_t jj) const {
    const auto j = static_cast<std::uint32_t>(jj);
    const std::uint32_t pos = cand_position(p.st, cand, j);
    return (composite(cand_key(p.src, p.st, cand, j, pos), pos) >> p.st->shift) >= p.st->prefix;
  }
};
template <class Emit>
struct cand_emit {
  Emit e;
  const select_state* st;
  const std::int32_t* cand;
  __device__ __forceinline__ void operator()(std::uint32_t j, std::uint32_t o) const {
    e(cand_position(st, cand, j), o);
  }
};

// ---- the sampled path's bound -----------------------------------------------------------
inline constexpr int sample_threads = 1024;
inline constexpr std::uint32_t sample_chunk_len = 8;      //!< the host plan's chunk length
inline constexpr std::uint32_t sample_max = 4096 * 8;     //!< the host plan's largest sample
inline constexpr int sample_per_thread = static_cast<int>(sample_max) / sample_threads;

//! One block of sample_threads: st->bound = the j-th largest abs_key (1 <= j <= s/2) of
//! the sample of commpact::host's plan for the same (n, k) (kernels/host/topk.hpp,
//! topk_impl::sample_bound: `chunks` chunks of sample_chunk_len consecutive entries, chunk
//! c starting at floor(c * (n - sample_chunk_len) / (chunks - 1))), so the bound equals the
//! host's. The keys stay in registers; a radix select of 8, 8, 8, 7 key bits over them,
//! each digit a shared histogram and a block-wide suffix scan.
__global__ void __launch_bounds__(sample_threads) select_sample_bound(const float* x, select_state* st, std::uint32_t n,
                                                                     std::uint32_t chunks, std::uint32_t j) {
  using scan = cub::BlockScan<std::uint32_t, sample_threads>;
  __shared__ typename scan::TempStorage tmp;
  __shared__ std::uint32_t hist[256];
  __shared__ std::uint32_t sel_b, sel_above;
  if (st->done) {  // k == 0 (nothing passes) or k == count (everything does)
    if (threadIdx.x == 0) st->bound = st->k_rem == 0 ? 0xffffffffu : 0u;
    return;
  }
  const std::uint32_t s = chunks * sample_chunk_len;
  // floor(c * span / (chunks - 1)) in 32 bits, as the host steps it: span = step * (chunks
  // - 1) + carry, so the start is c * step + floor(c * carry / (chunks - 1)) (c * carry is
  // below 2^24, c * step at most span).
  const std::uint32_t span = n - sample_chunk_len, gaps = chunks - 1;
  const std::uint32_t step = span / gaps, carry = span % gaps;
  // 0xffffffff (no abs_key is that large) marks a slot past the sample: its top bits
  // never match a prefix, so it is never counted.
  std::uint32_t key[sample_per_thread];
#pragma unroll
  for (int r = 0; r < sample_per_thread; ++r) {
    const std::uint32_t i = threadIdx.x + static_cast<std::uint32_t>(r) * sample_threads;
    key[r] = 0xffffffffu;
    if (i < s) {
      const std::uint32_t c = i / sample_chunk_len;
      const std::uint32_t start = c * step + c * carry / gaps;
      key[r] = __float_as_uint(x[start + i % sample_chunk_len]) & 0x7fffffffu;
    }
  }
  std::uint32_t prefix = 0, kr = j;
  for (int d = 0; d < 4; ++d) {
    const int shift = d == 0 ? 23 : d == 1 ? 15 : d == 2 ? 7 : 0;
    const int width = d == 3 ? 7 : 8;
    const std::uint32_t nb = 1u << width;
    for (std::uint32_t i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
    __syncthreads();
#pragma unroll
    for (int r = 0; r < sample_per_thread; ++r)
      if ((key[r] >> (shift + width)) == prefix) atomicAdd(&hist[(key[r] >> shift) & (nb - 1)], 1u);
    __syncthreads();
    const std::uint32_t t = threadIdx.x;
    const std::uint32_t h = t < nb ? hist[nb - 1 - t] : 0u;  // rank from the top bucket
    std::uint32_t inc = 0;
    scan(tmp).InclusiveSum(h, inc);
    if (h != 0 && inc >= kr && inc - h < kr) {
      sel_b = nb - 1 - t;
      sel_above = inc - h;
    }
    __syncthreads();
    prefix = (prefix << width) | sel_b;
    kr -= sel_above;
    __syncthreads();  // sel_b, sel_above, hist and tmp are reused by the next digit
  }
  if (threadIdx.x == 0) st->bound = prefix;
}

//! CUB's flag test of the sampled path: the entry's abs_key is at least the bound.
struct at_or_above_bound {
  const select_state* st;
  __device__ __forceinline__ bool operator()(float v) const { return (__float_as_uint(v) & 0x7fffffffu) >= st->bound; }
};

//! The keyed sampled path's output of its selection pass (the function of a
//! thrust::tabulate_output_iterator): candidate o is position p and, while o < half, its
//! abs_key goes to cand[at + o] too (half = cap / 2, at = cap - half). Those slots are
//! disjoint from the positions' [0, m) whenever m <= half, the only case in which
//! select_settle keeps the list (with more candidates than half, key and position writes
//! may overlap, and the candidates become the whole set instead).
struct keep_keyed {
  const float* x;
  std::int32_t* cand;
  std::uint32_t half, at;
  __device__ __forceinline__ void operator()(std::ptrdiff_t o, std::int32_t p) const {
    cand[o] = p;
    if (o < static_cast<std::ptrdiff_t>(half))
      cand[at + o] = static_cast<std::int32_t>(__float_as_uint(x[p]) & 0x7fffffffu);
  }
};

//! The sampled path's decision: fewer than k candidates passed the bound (the sample
//! overestimated the k-th key), so the candidates become the whole set; when every entry
//! passed (a bound of 0: the k-th key is 0, as in a mostly zero gradient), the whole set
//! too, so that the digit passes skip reading the candidate list. keys_at (not 0: the
//! keyed path, its keys at cand + keys_at for the first count - keys_at candidates): the
//! keys are used when every candidate has one, else the whole set again.
__global__ void select_settle(select_state* st, std::uint32_t keys_at) {
  if (!decision_lane()) return;
  const bool keys_short = keys_at != 0 && st->m > st->count - keys_at;
  if (st->m < st->k_all || st->m == st->count || keys_short) {
    st->ident = 1;
    st->m = st->count;
  } else {
    st->keys_at = keys_at;
  }
}

inline unsigned grid_for(std::size_t n, int sms) {
  std::size_t g = (n + select_block - 1) / select_block;
  const std::size_t most = static_cast<std::size_t>(sms > 0 ? sms : 1) * 8;
  return static_cast<unsigned>(g < 1 ? 1 : g > most ? most : g);
}

inline std::size_t align256(std::size_t b) { return (b + 255) & ~std::size_t{255}; }

}  // namespace detail

//! Device scratch of one selection over sets of at most `cap` entries: the state, the
//! histogram, the per-block counts, the candidates and CUB's temporary storage. Laid out
//! in caller-provided memory (two-phase: bytes(cap) first).
struct select_scratch {
  detail::select_state* st = nullptr;
  std::uint32_t* hist = nullptr;
  std::uint32_t* bcnt = nullptr;
  std::int32_t* cand = nullptr;
  void* cub_tmp = nullptr;
  std::size_t cub_bytes = 0;
  std::uint32_t cap = 0;
  int sms = 0;

  //! CUB's temporary storage for a DeviceSelect::If (the radix path) or FlaggedIf (the
  //! sampled path, its output plain or keyed) over cap entries: the largest of the three.
  static cudaError_t cub_need(std::uint32_t cap, std::size_t& bytes) {
    std::size_t b_if = 0, b_flagged = 0, b_keyed = 0;
    const auto items = static_cast<std::int64_t>(cap > 0 ? cap : 1);
    detail::select_pred<detail::float_keys> pred{{nullptr}, nullptr};
    COMMPACT_CU_TRY(cub::DeviceSelect::If(nullptr, b_if, thrust::counting_iterator<std::int32_t>(0),
                                          static_cast<std::int32_t*>(nullptr), static_cast<std::uint32_t*>(nullptr),
                                          items, pred, cudaStream_t{}));
    COMMPACT_CU_TRY(cub::DeviceSelect::FlaggedIf(nullptr, b_flagged, thrust::counting_iterator<std::int32_t>(0),
                                                 static_cast<const float*>(nullptr), static_cast<std::int32_t*>(nullptr),
                                                 static_cast<std::uint32_t*>(nullptr), items,
                                                 detail::at_or_above_bound{nullptr}, cudaStream_t{}));
    COMMPACT_CU_TRY(cub::DeviceSelect::FlaggedIf(nullptr, b_keyed, thrust::counting_iterator<std::int32_t>(0),
                                                 static_cast<const float*>(nullptr),
                                                 thrust::make_tabulate_output_iterator(detail::keep_keyed{}),
                                                 static_cast<std::uint32_t*>(nullptr), items,
                                                 detail::at_or_above_bound{nullptr}, cudaStream_t{}));
    bytes = b_if > b_flagged ? b_if : b_flagged;
    bytes = bytes > b_keyed ? bytes : b_keyed;
    return cudaSuccess;
  }
  //! Bytes of scratch for sets of at most cap entries.
  static cudaError_t bytes(std::uint32_t cap, std::size_t& total) {
    std::size_t cb = 0;
    COMMPACT_CU_TRY(cub_need(cap, cb));
    using detail::align256;
    total = align256(sizeof(detail::select_state)) + align256(4 * detail::max_bins) +
            align256(4 * detail::compact_blocks) + align256(4 * std::size_t(cap > 0 ? cap : 1)) + align256(cb);
    return cudaSuccess;
  }
  //! Lays the scratch out in mem (of bytes(cap) bytes) and zeroes the histogram on s.
  cudaError_t carve(void* mem, std::uint32_t c, cudaStream_t s) {
    using detail::align256;
    auto* b = static_cast<unsigned char*>(mem);
    st = reinterpret_cast<detail::select_state*>(b);
    b += align256(sizeof(detail::select_state));
    hist = reinterpret_cast<std::uint32_t*>(b);
    b += align256(4 * detail::max_bins);
    bcnt = reinterpret_cast<std::uint32_t*>(b);
    b += align256(4 * detail::compact_blocks);
    cand = reinterpret_cast<std::int32_t*>(b);
    b += align256(4 * std::size_t(c > 0 ? c : 1));
    cub_tmp = b;
    COMMPACT_CU_TRY(cub_need(c, cub_bytes));
    cap = c;
    int dev = 0;
    COMMPACT_CU_TRY(cudaGetDevice(&dev));
    COMMPACT_CU_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    return cudaMemsetAsync(hist, 0, 4 * detail::max_bins, s);
  }
};

namespace detail {
//! The digit passes over the candidates (levels first_level..5; each kernel returns at
//! once when the selection is resolved) and the final stable compaction of the selected
//! candidates through emit: the common tail of select_topk and select_topk_sampled.
//! g: the grid of a pass over the whole set.
template <class Src, class Emit>
cudaError_t select_from_candidates(select_scratch& sc, Src src, Emit emit, unsigned g, int first_level,
                                   cudaStream_t s) {
  // Fewer blocks than a pass over the set (the candidates' number is known only on the
  // device, and usually small), still enough to stream a large candidate set.
  const unsigned most = 4u * static_cast<unsigned>(sc.sms > 0 ? sc.sms : 1);
  const unsigned gc = g < most ? g : most;
  for (int L = first_level; L < 6; ++L) {
    select_hist<Src, true><<<gc, select_block, 0, s>>>(src, sc.st, sc.cand, sc.hist, L);
    COMMPACT_CU_TRY(cudaGetLastError());
    select_pick<<<1, pick_threads, 0, s>>>(sc.st, sc.hist, L);
    COMMPACT_CU_TRY(cudaGetLastError());
  }
  const select_pred<Src> pred{src, sc.st};
  return compact(cand_pred<Src>{pred, sc.cand}, cand_emit<Emit>{emit, sc.st, sc.cand}, &sc.st->m, sc.cap, sc.bcnt,
                 &sc.st->out, s);
}
}  // namespace detail

//! Selects the min(k, count) entries of the set [0, count) with the largest src.key(p)
//! (ties: the smaller p) and calls emit(p, o) for the o-th of them in increasing p;
//! st->out receives their number. count is *d_count when d_count is not null (at most
//! sc.cap), else sc.cap. The histogram must be zero on entry (carve() zeroes it; every
//! selection leaves it zero). d_k (device, may be null): k is min(k, *d_k). Queued on s;
//! returns the first launch error.
template <class Src, class Emit>
cudaError_t select_topk(select_scratch& sc, Src src, const std::uint32_t* d_count, std::uint32_t k, Emit emit,
                        cudaStream_t s, const std::int64_t* d_k = nullptr) {
  using namespace detail;
  const std::uint32_t cap = sc.cap;
  decision_launch(select_init, s, sc.st, d_count, cap, k, d_k);
  COMMPACT_CU_TRY(cudaGetLastError());
  const unsigned g = grid_for(cap, sc.sms);
  select_hist<Src, false><<<g, select_block, 0, s>>>(src, sc.st, nullptr, sc.hist, 0);
  COMMPACT_CU_TRY(cudaGetLastError());
  select_pick<<<1, pick_threads, 0, s>>>(sc.st, sc.hist, 0);
  COMMPACT_CU_TRY(cudaGetLastError());
  const select_pred<Src> pred{src, sc.st};
  if (d_count == nullptr) {
    std::size_t cb = sc.cub_bytes;
    COMMPACT_CU_TRY(cub::DeviceSelect::If(sc.cub_tmp, cb, thrust::counting_iterator<std::int32_t>(0), sc.cand,
                                          &sc.st->m, static_cast<std::int64_t>(cap), pred, s));
  } else {
    COMMPACT_CU_TRY(compact(pred, emit_position{sc.cand}, &sc.st->count, cap, sc.bcnt, &sc.st->m, s));
  }
  return detail::select_from_candidates(sc, src, emit, g, 1, s);
}

//! The sampled path of a top-k over the float array x[0, sc.cap) by abs_key: the bound L
//! (select_sample_bound: the j-th largest key of the host plan's sample of `chunks`
//! chunks), ONE stable pass over x keeping the positions with key >= L (cub::DeviceSelect::
//! FlaggedIf, x as the flags), then the digit passes over those candidates only and the
//! final compaction, as select_topk. When fewer than k passed (the sample overestimated
//! the k-th key: rare by the plan's margin, possible on adversarial input), select_settle
//! makes the candidates the whole set and the digit passes run over x: still exact, at the
//! radix path's cost and more. 1 <= k < sc.cap; chunks and j from
//! commpact::host::detail::topk_impl::plan_sampled(sc.cap, k). d_k (device, may be null):
//! k is min(k, *d_k), as select_topk (a k of 0 there lets nothing pass the bound). Queued
//! on s.
//! keyed: the selection pass also copies each candidate's abs_key beside the positions
//! (keep_keyed), so that the digit passes and the final compaction read the keys
//! contiguously instead of gathering x[cand[j]] (one scattered read per candidate and
//! pass, about 1.2k to 2k of them); with more than cap / 2 candidates the whole set
//! instead. Same bits either way.
template <class Emit>
cudaError_t select_topk_sampled(select_scratch& sc, const float* x, std::uint32_t k, std::uint32_t chunks,
                                std::uint32_t j, Emit emit, cudaStream_t s, const std::int64_t* d_k = nullptr,
                                bool keyed = false) {
  using namespace detail;
  const std::uint32_t cap = sc.cap;
  decision_launch(select_init, s, sc.st, static_cast<const std::uint32_t*>(nullptr), cap, k, d_k);
  COMMPACT_CU_TRY(cudaGetLastError());
  select_sample_bound<<<1, sample_threads, 0, s>>>(x, sc.st, cap, chunks, j);
  COMMPACT_CU_TRY(cudaGetLastError());
  std::size_t cb = sc.cub_bytes;
  const std::uint32_t half = cap / 2, keys_at = keyed && half > 0 ? cap - half : 0u;
  if (keys_at != 0) {
    COMMPACT_CU_TRY(cub::DeviceSelect::FlaggedIf(
        sc.cub_tmp, cb, thrust::counting_iterator<std::int32_t>(0), x,
        thrust::make_tabulate_output_iterator(keep_keyed{x, sc.cand, half, keys_at}), &sc.st->m,
        static_cast<std::int64_t>(cap), at_or_above_bound{sc.st}, s));
  } else {
    COMMPACT_CU_TRY(cub::DeviceSelect::FlaggedIf(sc.cub_tmp, cb, thrust::counting_iterator<std::int32_t>(0), x,
                                                 sc.cand, &sc.st->m, static_cast<std::int64_t>(cap),
                                                 at_or_above_bound{sc.st}, s));
  }
  decision_launch(select_settle, s, sc.st, keys_at);
  COMMPACT_CU_TRY(cudaGetLastError());
  return select_from_candidates(sc, float_keys{x}, emit, grid_for(cap, sc.sms), 0, s);
}

}  // namespace commpact::cuda_kernels
