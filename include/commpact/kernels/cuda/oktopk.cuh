// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file oktopk.cuh
//! The device kernels behind OkTopK's rows of ops<cuda_space> (rows_oktopk.cuh), the
//! twins of kernels/host/oktopk.hpp. The per-entry formulas are the host's own
//! COMMPACT_HOST_DEVICE functions (host::oktopk::entry_ok, selectable, rebalance_rank,
//! mean_of's division as __fdiv_rn); the selections run on select.cuh's radix select.
//!
//! Checked against its host twin by tests/cuda/test_cuda_rows_oktopk.cu (docs/cuda.md, "Status",
//! says where it has run).
//!
//! Frames and blocks are read and written byte-wise (memcpy), so no alignment is assumed.
//! A slot's entries are read where the host reads them, also when a count runs past the
//! slot into the next one; only a count whose entries would run past the whole span
//! (where the host reads out of bounds) is refused: as a malformed slot (status_wire,
//! the slot's rank in status[1]), also for the own slot, which the host does not check.

#if !defined(__CUDACC__)
#error "commpact/kernels/cuda/oktopk.cuh needs nvcc: include it from a .cu file only."
#endif

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cub/block/block_reduce.cuh>

#include "../host/oktopk.hpp"
#include "../status.hpp"
#include "select.cuh"

namespace commpact::cuda_kernels::oktopk {

namespace hk = commpact::host::oktopk;

inline constexpr std::uint32_t none = 0xffffffffu;  //!< "no malformed slot"
//! "no malformed slot, but a non-finite value" (oktopk_output: a sum that overflowed);
//! above every slot, so atomicMin keeps a malformed slot first, as the host does.
inline constexpr std::uint32_t nonfinite_value = 0xfffffffeu;
inline constexpr int block = 256;

template <class T>
__device__ __forceinline__ T get(const std::byte* p) {
  T v;
  memcpy(&v, p, sizeof(T));
  return v;
}
template <class T>
__device__ __forceinline__ void put(std::byte* p, T v) {
  memcpy(p, &v, sizeof(T));
}

__device__ __forceinline__ std::size_t gtid() { return blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; }
__device__ __forceinline__ std::size_t gstride() { return std::size_t(gridDim.x) * blockDim.x; }

inline unsigned grid(std::size_t n, std::size_t most = 65535) {
  const std::size_t g = (n + block - 1) / block;
  return static_cast<unsigned>(g < 1 ? 1 : g > most ? most : g);
}

//! One slot's entries: c int32 indices at p, then c floats, expected in [lo, hi).
struct slot {
  const std::byte* p;
  std::uint64_t c;
  std::int64_t lo, hi;
  bool fits;  //!< the head and 8c bytes from off lie inside the span
};

__device__ __forceinline__ bool fits(std::uint64_t c, std::size_t off, std::size_t bytes, std::size_t head) {
  return off <= bytes && bytes - off >= head && c <= (bytes - off - head) / 8;
}

//! The reduce-scatter frames of region_sum: slot j's count in its 40-byte header (the own
//! slot from hdr_out/pay_out, the others from hdr_in/pay_in), entries at j stride.
struct frame_slots {
  const std::byte *hdr_out, *pay_out, *hdr_in, *pay_in;
  std::size_t out_bytes, in_bytes, stride;
  std::uint32_t me;
  std::int64_t lo, hi;
  __device__ slot operator()(std::uint32_t j) const {
    const bool own = j == me;
    const auto c = get<std::uint64_t>((own ? hdr_out : hdr_in) + std::size_t(j) * hk::header_bytes + 8);
    const std::size_t off = std::size_t(j) * stride;
    const bool ok = fits(c, off, own ? out_bytes : in_bytes, 0);
    return {(own ? pay_out : pay_in) + (ok ? off : 0), ok ? c : 0, lo, hi, ok};
  }
};

//! The allgather blocks of output and clear_selected: u32 origin, u32 count, entries,
//! block o at o stride (stride >= 8), region [bounds[o], bounds[o + 1]).
struct block_slots {
  const std::byte* blocks;
  std::size_t bytes, stride;
  const std::int64_t* bounds;
  __device__ slot operator()(std::uint32_t o) const {
    const std::size_t off = std::size_t(o) * stride;
    const std::uint64_t c = get<std::uint32_t>(blocks + off + 4);
    const bool ok = fits(c, off, bytes, hk::block_header_bytes);
    return {blocks + off + hk::block_header_bytes, ok ? c : 0, bounds[o], bounds[o + 1], ok};
  }
};

__device__ __forceinline__ std::int32_t index_at(const slot& q, std::uint64_t e) {
  return get<std::int32_t>(q.p + 4 * e);
}
__device__ __forceinline__ float value_at(const slot& q, std::uint64_t e) { return get<float>(q.p + 4 * (q.c + e)); }

//! The first entry of q with index >= key (q ascending).
__device__ __forceinline__ std::uint64_t lower(const slot& q, std::int64_t key) {
  std::uint64_t a = 0, b = q.c;
  while (a < b) {
    const std::uint64_t m = a + (b - a) / 2;
    if (index_at(q, m) < key) a = m + 1;
    else b = m;
  }
  return a;
}

//! *bad = the smallest slot j != me with an entry failing host::oktopk::entry_ok (the
//! host's entries_ok, whose first failing slot it reports), or that does not fit (any j).
//! With values false the values are not read (the host's indices_ok) and a non-finite
//! value in any slot, me included, sets *bad to at most nonfinite_value (oktopk_output).
//! Grid: x over entries, y over slots.
template <class Slots>
__global__ void __launch_bounds__(block) check_slots(Slots s, std::uint32_t P, std::uint32_t me, bool values,
                                                     std::uint32_t* bad) {
  for (std::uint32_t j = blockIdx.y; j < P; j += gridDim.y) {
    const slot q = s(j);
    if (!q.fits) {
      if (blockIdx.x == 0 && threadIdx.x == 0) atomicMin(bad, j);
      continue;
    }
    if (j == me && values) continue;
    for (std::uint64_t e = std::uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < q.c;
         e += std::uint64_t(gridDim.x) * blockDim.x) {
      if (!values && !isfinite(value_at(q, e))) atomicMin(bad, nonfinite_value);
      if (j == me) continue;
      const std::int64_t prev = e == 0 ? q.lo - 1 : std::int64_t(index_at(q, e - 1));
      if (!hk::entry_ok(index_at(q, e), prev, q.hi, values ? value_at(q, e) : 0.0f)) {
        atomicMin(bad, j);
        break;
      }
    }
  }
}

//! status[0] |= wire and status[1] = the slot when *bad names one; status[0] |= nonfinite
//! when it is nonfinite_value.
__global__ void report_bad(const std::uint32_t* bad, std::uint32_t* status) {
  if (!decision_lane()) return;
  if (*bad == nonfinite_value) {
    status[0] |= status_nonfinite;
  } else if (*bad != none) {
    status[0] |= status_wire;
    status[1] = *bad;
  }
}

//! Queues the check of every slot into *bad (reset first) and its report into status.
template <class Slots>
cudaError_t check(Slots s, std::uint32_t P, std::uint32_t me, std::size_t per_slot, std::uint32_t* bad,
                  std::uint32_t* status, cudaStream_t st, bool values = true) {
  COMMPACT_CU_TRY(cudaMemsetAsync(bad, 0xFF, sizeof(std::uint32_t), st));
  const dim3 g(grid(per_slot, 1024), P < 65535u ? P : 65535u);
  check_slots<<<g, block, 0, st>>>(s, P, me, values, bad);
  COMMPACT_CU_TRY(cudaGetLastError());
  decision_launch(report_bad, st, bad, status);
  return cudaGetLastError();
}

// ---- oktopk_local --------------------------------------------------------------------
//! *dk = 0 when status shows a non-finite acc (the selection then writes nothing), else k.
__global__ void local_gate(const std::uint32_t* status, std::int64_t k, std::int64_t* dk) {
  if (!decision_lane()) return;
  *dk = (status[0] & status_nonfinite) ? 0 : k;
}

// ---- oktopk_frames -------------------------------------------------------------------
//! One block: fl = flags | (bit 0 when status shows a non-finite acc) | (bit 1 when it shows a rejected input); ends[j + 1] = the
//! end of slot j's entries (the host's scan: the first entry from ends[j] on whose index
//! is >= bounds[j + 1], idx ascending; 0 when fl has a stop flag); then every slot's 40-byte header.
__global__ void __launch_bounds__(block) frames_head(const std::int32_t* idx, std::size_t m, const std::int64_t* bounds,
                                                     std::uint32_t P, const std::uint32_t* status, std::uint32_t flags,
                                                     std::int64_t n, std::int64_t k, std::int64_t step, std::byte* hdr,
                                                     std::uint64_t* ends, std::uint32_t* fl_out) {
  const std::uint32_t fl = flags | ((status[0] & status_nonfinite) ? 1u : 0u) | ((status[0] & status_rejected) ? 2u : 0u);
  for (std::uint32_t j = threadIdx.x; j < P; j += blockDim.x) {
    std::uint64_t a = 0, b = (fl & hk::stop_flags) ? 0 : m;
    while (a < b) {
      const std::uint64_t mid = a + (b - a) / 2;
      if (idx[mid] < bounds[j + 1]) a = mid + 1;
      else b = mid;
    }
    ends[j + 1] = a;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    ends[0] = 0;
    *fl_out = fl;
    for (std::uint32_t j = 1; j <= P; ++j) ends[j] = ends[j] > ends[j - 1] ? ends[j] : ends[j - 1];
  }
  __syncthreads();
  for (std::uint32_t j = threadIdx.x; j < P; j += blockDim.x) {
    std::byte* h = hdr + std::size_t(j) * hk::header_bytes;
    put(h, hk::magic), put(h + 4, fl), put(h + 8, std::uint64_t(ends[j + 1] - ends[j]));
    put(h + 16, n), put(h + 24, k), put(h + 32, step);
  }
}

//! Entry e of slot j (ends[j] <= e < ends[j + 1]) to the slot's payload: index at
//! 4 (e - ends[j]), value after the slot's count indices. Nothing when fl has a stop flag.
__global__ void __launch_bounds__(block) frames_payload(const std::int32_t* idx, const float* val, std::size_t m,
                                                        const std::uint64_t* ends, std::uint32_t P,
                                                        const std::uint32_t* fl, std::byte* pay, std::size_t bytes,
                                                        std::size_t stride) {
  if (*fl & hk::stop_flags) return;
  for (std::size_t e = gtid(); e < m; e += gstride()) {
    if (e >= ends[P]) continue;
    std::uint32_t a = 0, b = P;  // the first j with ends[j + 1] > e
    while (a < b) {
      const std::uint32_t mid = a + (b - a) / 2;
      if (ends[mid + 1] <= e) a = mid + 1;
      else b = mid;
    }
    const std::uint64_t c = ends[a + 1] - ends[a], at = e - ends[a];
    const std::size_t off = std::size_t(a) * stride;
    if (!fits(c, off, bytes, 0)) continue;  // the host writes out of bounds
    put(pay + off + 4 * at, idx[e]);
    put(pay + off + 4 * (c + at), val[e]);
  }
}

// ---- oktopk_region_sum ---------------------------------------------------------------
inline constexpr std::size_t sum_chunk = block * 8;

//! Unless *bad names a slot: every block owns positions [a, a + sum_chunk) of the region,
//! zeroes them, then adds slot after slot in rank order (a barrier between slots), so
//! reg[r] = ((0 + v_0) + v_1) + ... exactly as the host's loop; touched[r] = 1 where sent.
__global__ void __launch_bounds__(block) region_sum_kernel(frame_slots s, std::uint32_t P, std::size_t len, float* reg,
                                                           std::uint8_t* touched, const std::uint32_t* bad) {
  __shared__ std::uint64_t sb[block], se[block], sc[block];
  __shared__ const std::byte* sp[block];
  if (*bad != none) return;
  const unsigned t = threadIdx.x;
  for (std::size_t a = blockIdx.x * sum_chunk; a < len; a += std::size_t(gridDim.x) * sum_chunk) {
    const std::size_t b = a + sum_chunk < len ? a + sum_chunk : len;
    for (std::size_t r = a + t; r < b; r += blockDim.x) reg[r] = 0.0f, touched[r] = 0;
    for (std::uint32_t j0 = 0; j0 < P; j0 += block) {
      __syncthreads();  // the zeroes and the previous batch are done
      if (j0 + t < P) {
        const slot q = s(j0 + t);
        sp[t] = q.p, sc[t] = q.c;
        sb[t] = lower(q, s.lo + std::int64_t(a));
        se[t] = lower(q, s.lo + std::int64_t(b));
      }
      __syncthreads();
      const std::uint32_t nb = P - j0 < std::uint32_t(block) ? P - j0 : std::uint32_t(block);
      for (std::uint32_t i = 0; i < nb; ++i) {
        if (sb[i] >= se[i]) continue;  // the same for every thread
        const slot q{sp[i], sc[i], 0, 0, true};
        for (std::uint64_t e = sb[i] + t; e < se[i]; e += blockDim.x) {
          const std::int64_t r = std::int64_t(index_at(q, e)) - s.lo;
          if (r < std::int64_t(a) || r >= std::int64_t(b)) continue;  // an unsorted own slot (host: undefined)
          reg[r] = __fadd_rn(reg[r], value_at(q, e));
          touched[r] = 1;
        }
        __syncthreads();
      }
    }
    __syncthreads();
  }
}

// ---- oktopk_mags and oktopk_select: keys and emitters of select_topk --------------------
//! |reg[p]| as abs_key over touched p, +0 elsewhere (an untouched position only adds a
//! zero, which the host's padding adds too).
struct mag_keys {
  const float* reg;
  const std::uint8_t* touched;
  __device__ __forceinline__ std::uint32_t key(std::uint32_t p) const {
    return touched[p] ? (__float_as_uint(reg[p]) & 0x7fffffffu) : 0u;
  }
};
struct mag_emit {
  mag_keys k;
  float* out;
  __device__ __forceinline__ void operator()(std::uint32_t p, std::uint32_t o) const {
    out[o] = __uint_as_float(k.key(p));
  }
};

//! abs_key(reg[p]) where host::oktopk::selectable, else 0 (a selectable sum is nonzero:
//! its key is at least 1, so with k at most their number only they are selected).
struct pass_keys {
  const float* reg;
  const std::uint8_t* touched;
  const float* theta;
  __device__ __forceinline__ std::uint32_t key(std::uint32_t p) const {
    return hk::selectable(touched[p], reg[p], *theta) ? (__float_as_uint(reg[p]) & 0x7fffffffu) : 0u;
  }
};

__global__ void __launch_bounds__(block) count_pass(pass_keys k, std::size_t len, unsigned long long* cnt) {
  using reduce = cub::BlockReduce<unsigned long long, block>;
  __shared__ typename reduce::TempStorage tmp;
  unsigned long long c = 0;
  for (std::size_t p = gtid(); p < len; p += gstride())
    c += k.key(static_cast<std::uint32_t>(p)) != 0u;
  const unsigned long long total = reduce(tmp).Sum(c);
  if (threadIdx.x == 0 && total) atomicAdd(cnt, total);
}

//! The block's count: min(passing, cap).
__device__ __forceinline__ std::uint64_t block_count(const unsigned long long* passing, std::uint32_t cap) {
  return *passing < cap ? *passing : cap;
}
__global__ void select_head(std::byte* blk, std::uint32_t me, const unsigned long long* passing, std::uint32_t cap) {
  if (!decision_lane()) return;
  put(blk, me), put(blk + 4, static_cast<std::uint32_t>(block_count(passing, cap)));
}
//! The o-th selected position p (ascending): index lo + p, its sum after the m indices.
struct select_emit {
  const float* reg;
  std::byte* blk;
  std::int64_t lo;
  const unsigned long long* passing;
  std::uint32_t cap;
  __device__ __forceinline__ void operator()(std::uint32_t p, std::uint32_t o) const {
    const std::uint64_t m = block_count(passing, cap);
    put(blk + 8 + 4 * std::size_t(o), static_cast<std::int32_t>(lo + std::int64_t(p)));
    put(blk + 8 + 4 * (m + o), reg[p]);
  }
};

//! *passing = min(*passing, *limit): select's count, at most this step's limit.
__global__ void clamp_passing(unsigned long long* passing, const std::uint32_t* limit) {
  if (!decision_lane()) return;
  if (*passing > *limit) *passing = *limit;
}

// ---- oktopk_theta: every block's counts around T, then this region's limit -----------
//! For every block j < P (k values at all + j k, descending): gt[j], ge[j] = its values
//! > T and >= T, T = *theta (binary searches, host::oktopk::count_from_top).
__global__ void __launch_bounds__(block) theta_counts(const float* all, std::size_t k, std::uint32_t P,
                                                      const float* theta, std::uint64_t* gt, std::uint64_t* ge) {
  const float t = *theta;
  for (std::size_t j = gtid(); j < P; j += gstride()) {
    gt[j] = hk::count_from_top(all + j * k, k, t, false);
    ge[j] = hk::count_from_top(all + j * k, k, t, true);
  }
}
//! *limit = host::oktopk::region_limit from the counts (a loop over the P ranks).
__global__ void theta_limit(const std::uint64_t* gt, const std::uint64_t* ge, std::uint32_t P, std::uint32_t me,
                            std::size_t k, std::uint32_t* limit) {
  if (!decision_lane()) return;
  std::uint64_t above = 0, before = 0;
  for (std::uint32_t j = 0; j < P; ++j) {
    above += gt[j];
    if (j < me) before += ge[j] - gt[j];
  }
  *limit = hk::region_limit(k, above, before, gt[me], ge[me] - gt[me]);
}

// ---- oktopk_output -------------------------------------------------------------------
__global__ void __launch_bounds__(block) output_zero(float* grad, std::size_t n, const std::uint32_t* bad) {
  if (*bad != none) return;
  for (std::size_t i = gtid(); i < n; i += gstride())
    grad[i] = 0.0f;
}
//! grad[i] = mean_of(sum, P) (as __fdiv_rn) for every entry of every block.
__global__ void __launch_bounds__(block) output_scatter(block_slots s, std::uint32_t P, float* grad, std::size_t n,
                                                        const std::uint32_t* bad) {
  if (*bad != none) return;
  const float d = static_cast<float>(P);
  for (std::uint32_t o = blockIdx.y; o < P; o += gridDim.y) {
    const slot q = s(o);
    for (std::uint64_t e = std::uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < q.c;
         e += std::uint64_t(gridDim.x) * blockDim.x) {
      const std::int32_t i = index_at(q, e);
      if (i >= 0 && std::size_t(i) < n) grad[i] = __fdiv_rn(value_at(q, e), d);  // the own block unchecked
    }
  }
}

// ---- oktopk_clear_selected -----------------------------------------------------------
//! G(g): the g-th selected index (blocks in origin order), pre the running counts.
__device__ __forceinline__ std::int32_t selected_at(const block_slots& s, const std::uint64_t* pre, std::uint32_t P,
                                                    std::uint64_t g) {
  std::uint32_t a = 0, b = P;  // the first o with pre[o + 1] > g
  while (a < b) {
    const std::uint32_t m = a + (b - a) / 2;
    if (pre[m + 1] <= g) a = m + 1;
    else b = m;
  }
  return get<std::int32_t>(s.blocks + std::size_t(a) * s.stride + hk::block_header_bytes + 4 * (g - pre[a]));
}

//! One block, unless status[0]: pre = running counts; next = bounds, rebalanced when
//! |G| >= P: next[j] = max(next[j - 1], G[rebalance_rank(|G|, j, P)]).
__global__ void __launch_bounds__(block) clear_head(block_slots s, std::uint32_t P, const std::uint32_t* status,
                                                    std::uint64_t* pre, std::int64_t* next) {
  if (status[0]) return;
  if (threadIdx.x == 0) {
    pre[0] = 0;
    for (std::uint32_t o = 0; o < P; ++o) pre[o + 1] = pre[o] + s(o).c;
  }
  __syncthreads();
  const std::uint64_t total = pre[P];
  for (std::uint32_t j = threadIdx.x; j <= P; j += blockDim.x)
    next[j] = (total >= P && j > 0 && j < P) ? std::int64_t(selected_at(s, pre, P, hk::rebalance_rank(total, j, P)))
                                             : s.bounds[j];
  __syncthreads();
  if (threadIdx.x == 0)
    for (std::uint32_t j = 1; total >= P && j < P; ++j) next[j] = next[j] > next[j - 1] ? next[j] : next[j - 1];
}

//! Unless status[0]: acc[idx[e]] = 0 where idx[e] is in G (ascending: a binary search).
__global__ void __launch_bounds__(block) clear_acc(block_slots s, std::uint32_t P, const std::uint32_t* status,
                                                   const std::uint64_t* pre, const std::int32_t* idx, std::size_t m,
                                                   float* acc, std::size_t n) {
  if (status[0]) return;
  const std::uint64_t total = pre[P];
  for (std::size_t e = gtid(); e < m; e += gstride()) {
    const std::int32_t key = idx[e];
    std::uint64_t a = 0, b = total;
    while (a < b) {
      const std::uint64_t mid = a + (b - a) / 2;
      if (selected_at(s, pre, P, mid) < key) a = mid + 1;
      else b = mid;
    }
    if (a < total && selected_at(s, pre, P, a) == key && key >= 0 && std::size_t(key) < n) acc[key] = 0.0f;
  }
}

}  // namespace commpact::cuda_kernels::oktopk
