// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file topk.cuh
//! Exact top-k by |x| on the GPU, the device twin of commpact::host::topk_abs: the same
//! order (abs_key descending, ties by the smaller index; NaNs above +Inf), the same
//! output (exactly k entries sorted by index, val[i] = x[idx[i]]), so host and device
//! results are bit-identical.
//!
//! Checked against its host twin by tests/cuda/test_kernels_topk.cu, tests/cuda/test_cuda_ops.cu
//! (docs/cuda.md, "Status", says where it has run).
//!
//! Method (select.cuh), chosen per call by topk_method:
//!  - sampled (automatic's choice wherever commpact::host::topk_abs samples: n >= 2^15 and
//!    k small enough for the sample to bracket it): the host's sample plan, its bound L
//!    (the j-th largest key of up to 32768 sampled keys) found by one block, ONE stable
//!    pass over x keeping the keys >= L (cub::DeviceSelect::FlaggedIf), then digit passes
//!    over those candidates only (about 1.2k to 2k of them by the plan's margin) and one
//!    stable compaction into the output. One read of x plus O(candidates). When fewer
//!    than k pass (a sample that overestimates: adversarial input), a device-side
//!    decision makes every entry a candidate: exact still, slower.
//!  - radix (everything else, and topk_method::radix): AIR top-k style, one histogram
//!    pass over x, one stable DeviceSelect of the candidates at or above the k-th bucket,
//!    then the same digit passes and compaction. Two reads of x plus O(candidates).
//! Scratch: 4n bytes of candidates plus CUB's DeviceSelect storage. The counts stay on the
//! device: nothing synchronises the host, and no step depends on the order of atomics.
//!
//! CUB-style two-phase call: with d_temp == nullptr, topk_abs only sets temp_bytes.
//!
//! <!-- snippet: d_x=const float*; d_idx=std::int32_t*; d_val=float*; d_temp=void*; stream=cudaStream_t; exec=commpact::cuda_space::exec -->
//! \code
//! std::size_t bytes = 0;
//! commpact::cuda_kernels::topk_abs(nullptr, bytes, d_x, n, k, d_idx, d_val, stream);
//! cudaMallocAsync(&d_temp, bytes, stream);
//! commpact::cuda_kernels::topk_abs(d_temp, bytes, d_x, n, k, d_idx, d_val, stream);
//! // or, owning and reusing the temporary storage:
//! commpact::cuda_kernels::topk_workspace ws;
//! ws.run(exec, d_x, n, k, d_idx, d_val);   // on the executor's stream, stream-ordered growth
//! \endcode
//!
//! Only nvcc compiles this file (CUB headers need it); include it from .cu files.

#if !defined(__CUDACC__)
#error "commpact/kernels/cuda/topk.cuh needs nvcc: include it from a .cu file only."
#endif

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "../../error.hpp"
#include "../../space/cuda.hpp"
#include "../host/topk.hpp"
#include "check.cuh"
#include "select.cuh"

namespace commpact::cuda_kernels {

//! Which selection topk_abs runs (see the file comment): automatic (the sampled path
//! where the host's plan applies, else radix), radix always, or sampled_keyed: automatic
//! with the sampled path's candidates keyed (select_topk_sampled: the selection pass
//! copies each candidate's key beside its position, so the later passes read no x[cand[j]]
//! gathers; the whole set instead when more than n / 2 pass). All give the same bits;
//! bench/cuda/bench_topk.cu times them in one run. sampled_keyed stays opt-in until that
//! run shows it faster than automatic (docs/cuda.md, "Not done yet").
enum class topk_method { automatic, radix, sampled_keyed };

namespace detail {

static_assert(host::topk_workspace::sample_chunk_len == sample_chunk_len &&
                  host::topk_workspace::sample_chunks * host::topk_workspace::sample_chunk_len == sample_max,
              "select_sample_bound holds the host plan's largest sample in registers: keep the two in step");

//! The sampled path's plan for (n, k) (the host's), or use == false for the radix path.
struct sampled_plan {
  bool use = false;
  std::uint32_t chunks = 0, j = 0;
};
inline sampled_plan plan_for(std::size_t n, std::size_t k, topk_method method) {
  host::detail::topk_impl::sample_plan p{};
  if (method == topk_method::radix || k == 0 || k >= n || !host::detail::topk_impl::plan_sampled(n, k, p))
    return {};
  return {true, static_cast<std::uint32_t>(p.chunks), static_cast<std::uint32_t>(p.j)};
}

//! Writes the selected position p as the o-th output entry.
struct topk_emit {
  const float* x;
  std::int32_t* idx;
  float* val;
  __device__ __forceinline__ void operator()(std::uint32_t p, std::uint32_t o) const {
    idx[o] = static_cast<std::int32_t>(p);
    val[o] = x[p];
  }
};

inline void check_args(std::size_t n, std::size_t k) {
  require(n < (std::size_t{1} << 31), "commpact::cuda_kernels::topk_abs: x has ", n,
          " entries, but indices are int32, so n must be below 2^31; split the tensor into buckets.");
  require(k <= n, "commpact::cuda_kernels::topk_abs: k = ", k, " is larger than n = ", n,
          "; k must be in [0, n]: pass a smaller k or check the density.");
}

//! The selection on laid-out scratch (sc.cap == n), by the plan's path. d_k (device, may
//! be null): k is min(k, *d_k) (OkTopK's local selection gates it to 0 there).
inline cudaError_t run_topk(select_scratch& sc, const float* d_x, std::size_t n, std::size_t k, std::int32_t* d_idx,
                            float* d_val, topk_method method, cudaStream_t stream,
                            const std::int64_t* d_k = nullptr) {
  const topk_emit emit{d_x, d_idx, d_val};
  const auto kk = static_cast<std::uint32_t>(k);
  const sampled_plan p = plan_for(n, k, method);
  if (p.use)
    return select_topk_sampled(sc, d_x, kk, p.chunks, p.j, emit, stream, d_k, method == topk_method::sampled_keyed);
  return select_topk(sc, float_keys{d_x}, nullptr, kk, emit, stream, d_k);
}

}  // namespace detail

//! Exact top-k of the n floats at d_x by |x| (order as commpact::host::topk_abs), written
//! index-sorted to d_idx[0, k) and d_val[0, k). Two-phase: with d_temp == nullptr only
//! sets temp_bytes. Asynchronous on `stream`; returns the first CUDA error.
//! \throws commpact::invalid_argument when n >= 2^31 or k > n (before any launch).
inline cudaError_t topk_abs(void* d_temp, std::size_t& temp_bytes, const float* d_x, std::size_t n, std::size_t k,
                            std::int32_t* d_idx, float* d_val, cudaStream_t stream = 0,
                            topk_method method = topk_method::automatic) {
  detail::check_args(n, k);
  std::size_t need = 0;
  COMMPACT_CU_TRY(select_scratch::bytes(static_cast<std::uint32_t>(n), need));
  if (d_temp == nullptr) {
    temp_bytes = need;
    return cudaSuccess;
  }
  if (temp_bytes < need) return cudaErrorInvalidValue;
  if (k == 0) return cudaSuccess;
  select_scratch sc;
  COMMPACT_CU_TRY(sc.carve(d_temp, static_cast<std::uint32_t>(n), stream));
  return detail::run_topk(sc, d_x, n, k, d_idx, d_val, method, stream);
}

//! Owns the temporary storage of topk_abs (from an allocator hook); grows on demand,
//! never shrinks, so repeated calls with the same or smaller n allocate once. Growth and
//! release are stream-ordered (CUB's discipline: the storage belongs to one stream at a
//! time): the old storage is freed on the stream after the work queued there, the new
//! one allocated there; nothing waits on the host.
//!
//! bind(exec) ties it to an executor's stream (kept alive until the workspace goes): the
//! way ops<cuda_space> uses it. run/reserve with a raw stream order it on that stream
//! instead (the caller keeps the stream alive until the workspace is destroyed or used on
//! another stream). Moving to another stream orders the new stream after the old one.
class topk_workspace {
 public:
  explicit topk_workspace(const cuda_allocator* a = nullptr) : mem_(a) {}

  //! Ties the workspace to e's stream and, while it holds no storage, to e's allocator.
  void bind(const cuda_space::exec& e) { mem_.bind(e); }
  //! topk_abs on e's stream with this workspace's storage (binds it to e).
  void run(const cuda_space::exec& e, const float* d_x, std::size_t n, std::size_t k, std::int32_t* d_idx,
           float* d_val) {
    bind(e);
    cuda_device_guard g(e.device());
    run(d_x, n, k, d_idx, d_val, e.stream());
  }
  //! topk_abs with this workspace's storage, queued on `stream` (as CUB's calls, 0 is the
  //! legacy default stream: commpact's rows pass the executor's); throws
  //! commpact::device_error on a CUDA error.
  //! The layout (CUB's size query) is computed and carved once per n and storage; a later
  //! call with the same n reuses it (every selection leaves the histogram zero).
  void run(const float* d_x, std::size_t n, std::size_t k, std::int32_t* d_idx, float* d_val,
           cudaStream_t stream = 0) {
    detail::check_args(n, k);
    const auto cap = static_cast<std::uint32_t>(n);
    if (carved_ == nullptr || carved_ != mem_.data() || cap != sc_.cap) {
      std::size_t need = 0;
      detail::check(select_scratch::bytes(cap, need), "topk_abs (size query)");
      reserve(need, stream);
      detail::check(sc_.carve(mem_.data(), cap, stream), "topk_abs (scratch layout)");
      carved_ = mem_.data();
    } else {
      mem_.use(stream);
    }
    if (k == 0) return;
    detail::check(detail::run_topk(sc_, d_x, n, k, d_idx, d_val, method_, stream), "topk_abs");
  }
  //! The selection of later runs (automatic by default).
  void set_method(topk_method m) noexcept { method_ = m; }
  [[nodiscard]] topk_method method() const noexcept { return method_; }
  //! Device address of the last run's selection state (null before the first run):
  //! `m`, the number of candidates, and `ident`, 1 when the sampled path's candidates
  //! are every entry (fewer than k passed its bound, or all did). For tests and
  //! diagnostics; read it after the run's stream is fenced.
  [[nodiscard]] const detail::select_state* device_state() const noexcept { return sc_.st; }
  //! Grows to at least `bytes`, stream-ordered on `stream`.
  void reserve(std::size_t bytes, cudaStream_t stream) {
    mem_.use(stream);
    if (mem_.grow(bytes)) ++allocations_;
  }
  //! Grows to at least `bytes` on the stream it is bound to. Never bound: on the calling
  //! thread's per-thread default stream, then waits for it (a set-up-time fallback).
  void reserve(std::size_t bytes) {
    if (bytes <= mem_.size()) return;
    if (mem_.ordered()) {
      if (mem_.grow(bytes)) ++allocations_;
      return;
    }
    mem_.use(cudaStreamPerThread);
    if (mem_.grow(bytes)) ++allocations_;
    detail::check(cudaStreamSynchronize(cudaStreamPerThread),  // commpact-discipline: allow set-up fallback of a workspace bound to no stream
                  "cudaStreamSynchronize (growing a top-k workspace bound to no stream)");
  }
  //! The allocator of the next growth while the workspace holds no storage.
  void set_allocator(const cuda_allocator* a) { mem_.set_allocator(a); }
  [[nodiscard]] std::size_t capacity_bytes() const noexcept { return mem_.size(); }
  [[nodiscard]] std::size_t allocations() const noexcept { return allocations_; }
  [[nodiscard]] const void* data() const noexcept { return mem_.data(); }
  [[nodiscard]] void* storage() noexcept { return mem_.data(); }

 private:
  cuda_workspace_bytes mem_;
  std::size_t allocations_ = 0;
  select_scratch sc_{};
  const void* carved_ = nullptr;  // the storage sc_ is laid out in (null: none yet)
  topk_method method_ = topk_method::automatic;
};

}  // namespace commpact::cuda_kernels
