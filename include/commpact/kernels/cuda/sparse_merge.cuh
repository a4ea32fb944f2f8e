// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file sparse_merge.cuh
//! host::sparse_merge_topk on the GPU, the merge of gTop-k's tree (sparse_tree.cuh's
//! absorb calls it); tests/cuda/test_cuda_ops.cu (check_merge) compares it with the host.
//!
//! Merge (host::sparse_merge_topk's specification), with CUB: cub::DeviceMerge merges the
//! two index-sorted sets (keyed index << 1 | side, so at an equal index the lower rank's
//! entry comes first and the order is total), cub::DeviceReduce::ReduceByKey sums equal
//! neighbours (va + vb, __fadd_rn) into the union, and select.cuh selects the top
//! min(k, |union|) of the union by abs_key (ties: the smaller index, which is the smaller
//! position, the union being index-sorted), in index order. The sets' counts live on the
//! device, so both CUB calls run over the capacity, the entries past a count padded with
//! one key that sorts last and forms one run of zeros, which a decision drops from the
//! union's size. Every call's temporary storage is asked of CUB first (merge_scratch).

#if !defined(__CUDACC__)
#error "commpact/kernels/cuda/sparse_merge.cuh needs nvcc: include it from a .cu file only."
#endif

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cub/device/device_merge.cuh>
#include <cub/device/device_reduce.cuh>
#include <cuda/std/functional>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/transform_iterator.h>
#include <thrust/iterator/transform_output_iterator.h>

#include "frame_check.cuh"
#include "grid.cuh"
#include "select.cuh"

namespace commpact::cuda_kernels {

namespace detail {

//! A set's live length: its count clamped to the capacity; zero when the gate is shut.
__device__ __forceinline__ std::uint32_t live_count(const std::uint32_t* n_p, const std::uint32_t* gate,
                                                    std::uint32_t cap) {
  if (gate != nullptr && *gate == 0) return 0;
  const std::uint32_t n = *n_p;
  return n < cap ? n : cap;
}

//! The merge runs over both sets' whole capacity (their counts live on the device, CUB's
//! lengths on the host): entry t of a set is its key index << 1 | side (side 0 for a, 1
//! for b, so a's entry orders first at an equal index and no two keys tie, which makes
//! CUB's unstable merge deterministic), or merge_pad past the live count.
inline constexpr std::int64_t merge_pad = INT64_MAX;
struct merge_key_of {
  const std::int32_t* idx;
  const std::uint32_t* n_p;
  const std::uint32_t* gate;
  std::uint32_t cap;
  std::int64_t side;
  __host__ __device__ std::int64_t operator()(std::int64_t t) const {
#if defined(__CUDA_ARCH__)
    return t < live_count(n_p, gate, cap) ? (std::int64_t{idx[t]} << 1) | side : merge_pad;
#else
    return t < 0 ? side : merge_pad;  // never called on the host (the iterators' types only)
#endif
  }
};
//! Entry t's value, or 0 past the live count (the padding sums to 0, in one run).
struct merge_val_of {
  const float* val;
  const std::uint32_t* n_p;
  const std::uint32_t* gate;
  std::uint32_t cap;
  __host__ __device__ float operator()(std::int64_t t) const {
#if defined(__CUDA_ARCH__)
    return t < live_count(n_p, gate, cap) ? val[t] : 0.0f;
#else
    return t < 0 ? 1.0f : 0.0f;
#endif
  }
};
//! A merged key's index (the padding's is 2^62 - 1: one run, after every index).
struct merge_index_of {
  __host__ __device__ std::int64_t operator()(std::int64_t key) const { return key >> 1; }
};
struct narrow_index {
  __host__ __device__ std::int32_t operator()(std::int64_t i) const { return static_cast<std::int32_t>(i); }
};
//! Equal indices sum va + vb, rounded to nearest without contraction, as the host.
struct add_rn {
  __device__ float operator()(float x, float y) const { return __fadd_rn(x, y); }
};
//! The reduce-by-key counts the padding's run too, when there was padding: the union
//! holds one run less then. A decision.
__global__ void merge_union_count(std::uint32_t* u, const std::uint32_t* na_p, const std::uint32_t* nb_p,
                                  const std::uint32_t* gate, std::uint32_t cap) {
  if (!decision_lane()) return;
  const std::uint64_t live = std::uint64_t{live_count(na_p, gate, cap)} + live_count(nb_p, gate, cap);
  if (live < 2 * std::uint64_t{cap} && *u > 0) *u -= 1;
}

//! The merge's two CUB calls over sets of capacity cap. With tmp == nullptr each writes
//! only its temporary-storage size (CUB's first phase); with storage it queues on s.
struct merge_union_calls {
  const std::int32_t *ia, *ib;
  const float *va, *vb;
  const std::uint32_t *na, *nb, *gate;
  std::uint32_t cap;
  std::int64_t* mk;  // the merged keys, 2 cap
  float* mv;         // the merged values, 2 cap
  std::int32_t* ui;  // the union's indices, 2 cap
  float* uv;         // the union's values, 2 cap
  std::uint32_t* u;  // the union's size (runs)

  cudaError_t merge(void* tmp, std::size_t& bytes, cudaStream_t s) const {
    const thrust::counting_iterator<std::int64_t> t0(0);
    return cub::DeviceMerge::MergePairs(
        tmp, bytes, thrust::make_transform_iterator(t0, merge_key_of{ia, na, gate, cap, 0}),
        thrust::make_transform_iterator(t0, merge_val_of{va, na, gate, cap}), std::int64_t{cap},
        thrust::make_transform_iterator(t0, merge_key_of{ib, nb, gate, cap, 1}),
        thrust::make_transform_iterator(t0, merge_val_of{vb, nb, gate, cap}), std::int64_t{cap}, mk, mv,
        ::cuda::std::less<std::int64_t>{}, s);
  }
  cudaError_t reduce(void* tmp, std::size_t& bytes, cudaStream_t s) const {
    return cub::DeviceReduce::ReduceByKey(tmp, bytes, thrust::make_transform_iterator(mk, merge_index_of{}),
                                          thrust::make_transform_output_iterator(ui, narrow_index{}), mv, uv, u,
                                          add_rn{}, 2 * std::int64_t{cap}, s);
  }
};

struct merge_emit {
  const std::int32_t* ui;
  const float* uv;
  std::int32_t* io;
  float* vo;
  __device__ __forceinline__ void operator()(std::uint32_t p, std::uint32_t o) const {
    io[o] = ui[p];
    vo[o] = uv[p];
  }
};

}  // namespace detail

//! Device scratch of the sparse merge and the absorb, for sets of at most kcap entries,
//! two-phase: bytes(kcap) asks CUB for its temporary storage, then carve() lays it out.
struct merge_scratch {
  std::int64_t* mk = nullptr;
  float *mv = nullptr, *uv = nullptr;
  std::int32_t* ui = nullptr;
  std::uint32_t* u = nullptr;
  absorb_ctl* ctl = nullptr;
  void* cub_tmp = nullptr;
  std::size_t cub_bytes = 0;
  select_scratch sel;
  std::uint32_t kcap = 0;

  //! CUB's temporary storage for the merge and the reduce-by-key (one after the other on
  //! the stream, so they share it).
  static cudaError_t cub_need(std::uint32_t kcap, std::size_t& bytes) {
    const detail::merge_union_calls q{nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                      kcap,    nullptr, nullptr, nullptr, nullptr, nullptr};
    std::size_t m = 0, r = 0;
    COMMPACT_CU_TRY(q.merge(nullptr, m, cudaStream_t{}));
    COMMPACT_CU_TRY(q.reduce(nullptr, r, cudaStream_t{}));
    bytes = m > r ? m : r;
    return cudaSuccess;
  }
  static cudaError_t bytes(std::uint32_t kcap, std::size_t& total) {
    using detail::align256;
    const std::size_t two = 2 * std::size_t(kcap > 0 ? kcap : 1);
    std::size_t sb = 0, cb = 0;
    COMMPACT_CU_TRY(select_scratch::bytes(static_cast<std::uint32_t>(two), sb));
    COMMPACT_CU_TRY(cub_need(kcap, cb));
    total = align256(8 * two) + 3 * align256(4 * two) + align256(16) + align256(sizeof(absorb_ctl)) + align256(cb) +
            sb;
    return cudaSuccess;
  }
  cudaError_t carve(void* mem, std::uint32_t k, cudaStream_t s) {
    using detail::align256;
    const std::size_t two = 2 * std::size_t(k > 0 ? k : 1);
    auto* b = static_cast<unsigned char*>(mem);
    mk = reinterpret_cast<std::int64_t*>(b), b += align256(8 * two);
    mv = reinterpret_cast<float*>(b), b += align256(4 * two);
    ui = reinterpret_cast<std::int32_t*>(b), b += align256(4 * two);
    uv = reinterpret_cast<float*>(b), b += align256(4 * two);
    u = reinterpret_cast<std::uint32_t*>(b), b += align256(16);
    ctl = reinterpret_cast<absorb_ctl*>(b), b += align256(sizeof(absorb_ctl));
    COMMPACT_CU_TRY(cub_need(k, cub_bytes));
    cub_tmp = b, b += align256(cub_bytes);
    kcap = k;
    return sel.carve(b, static_cast<std::uint32_t>(two), s);
  }
};

//! host::sparse_merge_topk on the device: a = (ia, va, *na), b = (ib, vb, *nb) (counts in
//! device memory, at most kcap each), the top min(k, |union|) into io / vo in index order,
//! their number into *out_count. gate (device, may be null): when zero, both sets count as
//! empty. d_k (device, may be null): k is min(k, *d_k). Queued on s.
inline cudaError_t sparse_merge_topk(merge_scratch& ms, const std::int32_t* ia, const float* va,
                                     const std::uint32_t* na, const std::int32_t* ib, const float* vb,
                                     const std::uint32_t* nb, std::uint32_t k, std::int32_t* io, float* vo,
                                     std::uint32_t*& out_count, cudaStream_t s, const std::uint32_t* gate = nullptr,
                                     const std::int64_t* d_k = nullptr) {
  const std::uint32_t cap = ms.kcap;
  if (cap == 0) {
    COMMPACT_CU_TRY(cudaMemsetAsync(ms.u, 0, sizeof(std::uint32_t), s));
  } else {
    const detail::merge_union_calls c{ia, ib, va, vb, na, nb, gate, cap, ms.mk, ms.mv, ms.ui, ms.uv, ms.u};
    std::size_t tb = ms.cub_bytes;
    COMMPACT_CU_TRY(c.merge(ms.cub_tmp, tb, s));
    tb = ms.cub_bytes;
    COMMPACT_CU_TRY(c.reduce(ms.cub_tmp, tb, s));
    decision_launch(detail::merge_union_count, s, ms.u, na, nb, gate, cap);
    COMMPACT_CU_TRY(cudaGetLastError());
  }
  COMMPACT_CU_TRY(
      select_topk(ms.sel, detail::float_keys{ms.uv}, ms.u, k, detail::merge_emit{ms.ui, ms.uv, io, vo}, s, d_k));
  out_count = &ms.sel.st->out;
  return cudaSuccess;
}

}  // namespace commpact::cuda_kernels
