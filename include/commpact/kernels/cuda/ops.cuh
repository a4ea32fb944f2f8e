// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file ops.cuh
//! ops<cuda_space>: the kernel table (kernels/ops.hpp) on a CUDA stream. Every row
//! implements the same specification as ops<host_space>, queued on the executor's stream
//! (it has run by the next fence), with counts and status in device memory. Only nvcc
//! compiles this file.
//!
//! Checked against its host twin by tests/cuda/test_cuda_ops.cu, tests/cuda/test_gtopk_device.cu
//! (docs/cuda.md, "Status", says where it has run).
//!
//! | row | kernels | equal to the host |
//! |---|---|---|
//! | fill, copy, to_host, from_host | fill kernel, cudaMemcpyAsync | bits |
//! | mean, mean_into | __fdiv_rn(v, float(P)) (mean.hpp's mean_of), status on device | bits |
//! | ef_accumulate, sub | __fmul_rn / __fadd_rn / __fsub_rn in the host's order | bits |
//! | clip_scale | ||g||^2 in double in kernels/fixed_sum.hpp's shape (a block per node of 2048 values, one launch per level), the factor by the last level's thread 0 (kernels/clip.hpp) | bits (the host row sums in the same shape) |
//! | topk_abs | select.cuh's radix select (topk.cuh) | bits (indices and values) |
//! | scatter_mean, zero_delivered | memset + scatter kernels | bits (indices distinct; out-of-range indices are skipped where the host raises) |
//! | tree_local | ef kernel (__fadd_rn/__fmul_rn as the host's ef_body) + topk_abs | bits |
//! | tree_payload / tree_absorb | frame encode; decode + validation + merge (sparse_tree.cuh) | bits (frames byte for byte) |
//! | tree_scatter / tree_zero_delivered | gated by the meta on the device | bits |
//! | tree_status (TreeMerge) | a decision (grid.cuh's decision_launch: one warp, lane 0) | bits |
//! | tree_begin (TreeMerge) | tree_begin.cuh: a decision reading the header (begin_head), absorb_scan with the block's n, a decision (begin_decide), install kernel | bits (meta and sets) |
//! | check_finite, copy_if_clear (rows_power.cuh) | grid-stride kernels, status words on the device | bits |
//! | lowrank_project | 8 lanes per row of M, partial sums combined by shuffles in row_dots' order; M = g + res written | bits |
//! | lowrank_back_project | lowrank.hpp's tree: a thread per (column, chunk of 128 rows), rows in order; then a thread per (output, group of 128 sums), a launch per level; the levels below the top in the executor's scratch (grown by lowrank_prepare) | bits |
//! | lowrank_approx_residual | one thread per element, gated by the status words | bits |
//! | lowrank_project, lowrank_back_project, lowrank_approx_residual with power_products::blas; lowrank_prepare (blas.cuh) | M = g + res kernel; cublasSgemm for P = M Q, Q = M^T P and A = P Q^T (tiles of the executor's scratch, then a status-gated kernel: g = A, M -= A); the executor's cuBLAS handle | M bits; P, Q, A within docs/cuda.md's bound; deterministic, equal on every rank |
//! | orthonormalize, power_gossip_orthonormalize | one block: each dot product summed by the block in kernels/fixed_sum.hpp's shape (host::gs_dot_leaf, as the host), updates spread over it (host::gs_*), redraws in-kernel | bits (redraws as gaussian) |
//! | gaussian, redraw_zero_columns | host::gaussian_pair per pair of values (one block per zero column) | bits except CUDA's double log/cos/sin: a value may differ in the float's last bit (~2^-28) |
//! | power_gossip_update, power_gossip_vectors | difference kernel + element kernel (host::power_gossip::add_scaled / mix_term), gated by words | bits |
//! | cast_encode, cast_add, cast_decode_mean (rows_cast_vote.cuh) | host/cast.hpp's cast_encode_value and the casts' host-device to_code/from_code/add; finiteness flag, then mean_of | bits (NaN codes: any NaN code) |
//! | linear_encode, linear_decode, linear_feedback (randomk_codec only) | indices drawn on the host, copied to the executor's scratch; gather; mean + zero + scatter; zero_delivered | bits; other LinearCodecs: static_assert |
//! | signum_update, sign_vote | signum_value; per-block check and rank-order double scale sum in every block, one sign byte per thread | bits |
//! | choco_encode, choco_decode (rows_choco.cuh; choco_workspace<Codec> holds device_codec<Codec> and the staging blocks) | choco::diff, the codec's encode_frame into a frame block, choco::scatter (sparse codecs) and choco::message; choco::frames, the codec's decode_sum per neighbour, choco::first_malformed | bits of q, q_nb; messages byte for byte; the same messages rejected |
//! | gossip_check, gossip_agree_begin/end, gossip_pack, gossip_mix, choco_update (rows_gossip.cuh) | atomicMin of the first bad index; one warp's decision; memcpy; one thread per entry, k ascending (host/gossip.hpp's mix_term/choco_term) | bits |
//! | oktopk_local (rows_oktopk.cuh) | select.cuh's radix select; k gated to 0 on the device by the status | bits |
//! | oktopk_frames | one block: region ends + 40-byte headers; payload scatter | bits (frames byte for byte) |
//! | oktopk_region_sum | entry checks (host::oktopk::entry_ok); per 2048-position chunk, slots in rank order with __fadd_rn | bits; status_wire and status[1] as the host |
//! | oktopk_mags, oktopk_theta | radix select + cub::DeviceRadixSort descending; sort, then the k-th | bits (theta: either zero when +0 and -0 tie at the k-th) |
//! | oktopk_select | count of selectable sums, radix select with k = min(cap, count) | bits (block byte for byte) |
//! | oktopk_output, oktopk_clear_selected | checks, zero, scatter of __fdiv_rn(sum, P); running counts + rebalance (one block), binary search of the selected indices | bits |
//! | codec_encode_frame, codec_decode_sum, codec_clear_delivered: device_codec<Codec> (kernels/device_codec.hpp; every codec of compress/codecs/ in compress/device_codecs*.cuh) | kernels/cuda/codecs*.cuh: encode into the block's payload + frame_finish; validate, add in rank order (__fadd_rn), poison_on_wire | frames byte for byte; sums bits; a malformed payload sets status_wire (the host raises wire_error) |
//! | oktopk_begin (SparseReduceScatter's block path; oktopk_begin.cuh) | frame_check.cuh's checks (tree_begin's) with the caller's n, a decision in the host's order (decision_launch), install gated by it | bits (idx, val, status; untouched when flagged or malformed) |
//!
//! NaN: "bits" means the same bits for every value that is not a NaN. GPU arithmetic
//! returns the canonical NaN (0x7fffffff) where x86 keeps an operand's payload, so a NaN
//! produced by arithmetic (an accumulate or a mean over a NaN input) is a NaN on both
//! sides, flagged alike, with other bits; copies and selections keep the input's bits.
//!
//! Argument errors the host raises as invalid_argument (unequal lengths, k > n) are
//! raised here too, before anything is queued; a failed CUDA call raises device_error.
//! to_host into pageable host memory makes cudaMemcpyAsync synchronous (CUDA's rule for
//! pageable memory): correct, but it waits for the stream; pinned memory (cuda_space::pinned<T>)
//! keeps it queued.

#if !defined(__CUDACC__)
#error "commpact/kernels/cuda/ops.cuh needs nvcc: include it from a .cu file only."
#endif

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>

#include "../../error.hpp"
#include "../../space/cuda.hpp"
#include "../../wire/codec_frame.hpp"
#include "../device_codec.hpp"
#include "../host/sparse_tree.hpp"
#include "../ops.hpp"
#include "../status.hpp"
#include "check.cuh"
#include "frame_gate.cuh"
#include "rows_cast_vote.cuh"
#include "rows_choco.cuh"
#include "rows_gossip.cuh"
#include "rows_oktopk.cuh"
#include "rows_power.cuh"
#include "sparse_tree.cuh"
#include "topk.cuh"
#include "tree_begin.cuh"
#include "vector.cuh"

namespace commpact {

namespace cuda_kernels {
//! Owns the device scratch of tree_absorb's merge (grow-only, from an allocator hook),
//! stream-ordered on the executor's stream (cuda_workspace_bytes): growing frees the old
//! scratch there after the work queued so far and allocates the new one there; nothing
//! waits on the host. The layout is computed (CUB's size queries) and carved once per
//! capacity and storage: a later absorb with the same kcap reuses it (every selection
//! leaves the histogram zero, as carve() leaves it).
class merge_workspace {
 public:
  merge_workspace() = default;

  //! The scratch for sets of at most kcap entries, bound to e's stream and laid out there.
  merge_scratch& get(std::uint32_t kcap, const cuda_space::exec& e) {
    mem_.bind(e);
    return carve(kcap, e.stream());
  }
  //! The same on a caller's stream s, with allocator a while it holds nothing (the
  //! caller keeps s alive until the workspace is destroyed or used on another stream).
  merge_scratch& get(std::uint32_t kcap, const cuda_allocator* a, cudaStream_t s) {
    mem_.set_allocator(a);
    mem_.use(s);
    return carve(kcap, s);
  }
  [[nodiscard]] std::size_t capacity_bytes() const noexcept { return mem_.size(); }
  [[nodiscard]] std::size_t allocations() const noexcept { return allocations_; }
  [[nodiscard]] const void* data() const noexcept { return mem_.data(); }

 private:
  merge_scratch& carve(std::uint32_t kcap, cudaStream_t s) {
    if (carved_ != nullptr && carved_ == mem_.data() && kcap == ms_.kcap) return ms_;
    std::size_t need = 0;
    detail::check(merge_scratch::bytes(kcap, need), "merge_scratch::bytes");
    if (mem_.grow(need)) ++allocations_;
    detail::check(ms_.carve(mem_.data(), kcap, s), "merge_scratch::carve");
    carved_ = mem_.data();
    return ms_;
  }
  cuda_workspace_bytes mem_;
  std::size_t allocations_ = 0;
  merge_scratch ms_{};
  const void* carved_ = nullptr;  // the storage ms_ is laid out in (null: none yet)
};
}  // namespace cuda_kernels

//! The rows of PowerCompressor, PowerGossip, CastAllreduce, LinearCompressor, MajorityVote,
//! GossipMixer (CHOCO's codec rows included) and OkTopK live in rows_*.cuh (one file per
//! consumer) and are inherited.
template <>
struct ops<cuda_space> : cuda_rows::power, cuda_rows::cast_vote, cuda_rows::gossip, cuda_rows::choco,
                         cuda_rows::oktopk {
  using exec = cuda_space::exec;
  template <class T>
  using span = cuda_span<T>;
  using tree_views = sparse_tree_views<cuda_span>;
  using topk_workspace = cuda_kernels::topk_workspace;
  using merge_workspace = cuda_kernels::merge_workspace;
  //! The codec rows' workspace: the codec's device_codec object (kernels/device_codec.hpp).
  template <class Codec>
  using codec_workspace = device_codec<Codec>;

  template <class T>
  static void fill(const exec& e, span<T> v, T x) {
    ck(cuda_kernels::fill(cuda_access::ptr(v), v.size(), x, e.stream()), "fill");
  }
  template <class U, class T>
    requires std::is_same_v<std::remove_const_t<U>, T>
  static void copy(const exec& e, span<U> src, span<T> dst) {
    require(src.size() == dst.size(), "commpact::ops::copy: ", src.size(), " values into ", dst.size(),
            "; pass spans of equal length.");
    if (src.empty()) return;
    ck(cudaMemcpyAsync(cuda_access::ptr(dst), cuda_access::ptr(src), src.size_bytes(), cudaMemcpyDeviceToDevice,
                       e.stream()),
       "copy");
  }
  template <class U, class T>
    requires std::is_same_v<std::remove_const_t<U>, T>
  static void to_host(const exec& e, span<U> src, std::span<T> host) {
    require(src.size() == host.size(), "commpact::ops::to_host: ", src.size(), " values into ", host.size(),
            "; pass spans of equal length.");
    if (src.empty()) return;
    ck(cudaMemcpyAsync(host.data(), cuda_access::ptr(src), src.size_bytes(), cudaMemcpyDeviceToHost, e.stream()),
       "to_host");
  }
  template <class U, class T>
    requires std::is_same_v<std::remove_const_t<U>, T>
  static void from_host(const exec& e, std::span<U> host, span<T> dst) {
    require(host.size() == dst.size(), "commpact::ops::from_host: ", host.size(), " values into ", dst.size(),
            "; pass spans of equal length.");
    if (host.empty()) return;
    ck(cudaMemcpyAsync(cuda_access::ptr(dst), host.data(), host.size_bytes(), cudaMemcpyHostToDevice, e.stream()),
       "from_host");
  }
  static void mean(const exec& e, span<float> v, int P, span<std::uint32_t> status) {
    ck(cuda_kernels::mean(cuda_access::ptr(v), v.size(), P, status.empty() ? nullptr : cuda_access::ptr(status),
                          e.stream()),
       "mean");
  }
  static void mean_into(const exec& e, span<const float> src, span<float> dst, int P, span<std::uint32_t> status) {
    require(src.size() == dst.size(), "commpact::ops::mean_into: ", src.size(), " values into ", dst.size(),
            "; pass spans of equal length.");
    auto* flag = static_cast<std::uint32_t*>(e.scratch("mean_into", sizeof(std::uint32_t)));
    ck(cuda_kernels::mean_into(cuda_access::ptr(src), cuda_access::ptr(dst), src.size(), P,
                               status.empty() ? nullptr : cuda_access::ptr(status), flag, e.stream()),
       "mean_into");
  }
  static void frame_gate(const exec& e, span<const float> blocks, std::size_t block_floats, span<float> sum,
                         span<std::uint32_t> status) {
    require(!status.empty(), "commpact::ops::frame_gate: pass the step status (one word).");
    const std::size_t P = block_floats ? blocks.size() / block_floats : 0;
    cuda_kernels::decision_launch(cuda_kernels::frame_gate_kernel,
                                  e.stream(), reinterpret_cast<const std::uint32_t*>(cuda_access::ptr(blocks)),
                                  block_floats, P, cuda_access::ptr(sum), sum.size(), cuda_access::ptr(status));
    ck(cudaGetLastError(), "frame_gate");
  }
  static void ef_accumulate(const exec& e, span<float> acc, span<float> u_next, span<const float> u,
                            span<const float> r, span<const float> g, float m, span<const float> scale,
                            span<std::uint32_t> status) {
    const std::size_t n = acc.size();
    require(r.size() == n && g.size() == n && (m <= 0.0f || (u.size() == n && u_next.size() == n)),
            "commpact::ops::ef_accumulate: acc holds ", n, " values, the residual ", r.size(), ", g ", g.size(),
            ", u ", u.size(), ", u_next ", u_next.size(), "; pass equal lengths (u and u_next with momentum).");
    ck(cuda_kernels::ef_accumulate(cuda_access::ptr(acc), m > 0.0f ? cuda_access::ptr(u_next) : nullptr,
                                   m > 0.0f ? cuda_access::ptr(u) : nullptr, cuda_access::ptr(r), cuda_access::ptr(g),
                                   n, m, scale.empty() ? nullptr : cuda_access::ptr(scale),
                                   status.empty() ? nullptr : cuda_access::ptr(status), e.stream()),
       "ef_accumulate");
  }
  static void sub(const exec& e, span<float> y, span<const float> x) {
    require(y.size() == x.size(), "commpact::ops::sub: y holds ", y.size(), " values, x ", x.size(),
            "; pass spans of equal length.");
    ck(cuda_kernels::sub(cuda_access::ptr(y), cuda_access::ptr(x), y.size(), e.stream()), "sub");
  }
  static void add(const exec& e, span<float> y, span<const float> x) {
    require(y.size() == x.size(), "commpact::ops::add: y holds ", y.size(), " values, x ", x.size(),
            "; pass spans of equal length.");
    ck(cuda_kernels::add(cuda_access::ptr(y), cuda_access::ptr(x), y.size(), e.stream()), "add");
  }
  static void sgd_step(const exec& e, span<float> x, span<float> v, span<const float> g, float lr, float mu,
                       float wd) {
    require(g.size() == x.size() && (v.empty() || v.size() == x.size()), "commpact::ops::sgd_step: x holds ",
            x.size(), " values, g ", g.size(), ", v ", v.size(), "; pass equal lengths (v empty without momentum).");
    ck(cuda_kernels::sgd_step(cuda_access::ptr(x), v.empty() ? nullptr : cuda_access::ptr(v), cuda_access::ptr(g),
                              x.size(), lr, mu, wd, e.stream()),
       "sgd_step");
  }
  static void clip_scale(const exec& e, span<const float> g, float clip_norm, int P, span<float> scale) {
    auto* part = static_cast<double*>(e.scratch("clip_scale", cuda_kernels::clip_scratch_bytes(g.size())));
    ck(cuda_kernels::clip_scale(cuda_access::ptr(g), g.size(), clip_norm, P, cuda_access::ptr(scale), part, e.stream()),
       "clip_scale");
  }
  static void topk_abs(const exec& e, span<const float> v, std::size_t k, span<std::int32_t> idx, span<float> val,
                       topk_workspace& ws) {
    require(idx.size() >= k && val.size() >= k, "commpact::ops::topk_abs: outputs hold ", idx.size(), " indices and ",
            val.size(), " values, but k = ", k, " are written; pass spans of at least k entries.");
    ws.bind(e);
    ws.run(cuda_access::ptr(v), v.size(), k, cuda_access::ptr(idx), cuda_access::ptr(val), e.stream());
  }
  static void scatter_mean(const exec& e, span<float> out, span<const std::int32_t> idx, span<const float> val, int P) {
    require(idx.size() == val.size(), "commpact::ops::scatter_mean: ", idx.size(), " indices but ", val.size(),
            " values; pass equally long index and value spans.");
    ck(cuda_kernels::scatter_mean(cuda_access::ptr(out), out.size(), cuda_access::ptr(idx), cuda_access::ptr(val),
                                  idx.size(), P, e.stream()),
       "scatter_mean");
  }
  static void zero_delivered(const exec& e, span<float> residual, span<float> velocity, span<const std::int32_t> idx,
                             span<const std::uint8_t> alive) {
    require(velocity.empty() || velocity.size() == residual.size(), "commpact::ops::zero_delivered: velocity holds ",
            velocity.size(), " values but the residual ", residual.size(),
            "; pass an empty velocity or one of the same length.");
    require(alive.empty() || alive.size() == idx.size(), "commpact::ops::zero_delivered: ", alive.size(),
            " alive flags for ", idx.size(), " delivered indices; pass one flag per index or none.");
    ck(cuda_kernels::zero_delivered(cuda_access::ptr(residual), velocity.empty() ? nullptr : cuda_access::ptr(velocity),
                                    residual.size(), cuda_access::ptr(idx),
                                    alive.empty() ? nullptr : cuda_access::ptr(alive), idx.size(), e.stream()),
       "zero_delivered");
  }

  // ---- gTop-k's tree (kernels/cuda/sparse_tree.cuh); meta is one element -------------
  static void tree_local(const exec& e, span<sparse_tree_meta> m, std::int64_t n, std::int64_t k, std::uint16_t flags,
                         span<float> acc, span<float> u_next, span<const float> residual, span<const float> velocity,
                         span<const float> g, float momentum, span<const float> scale, const tree_views& b,
                         topk_workspace& ws) {
    namespace kd = cuda_kernels::detail;
    const cudaStream_t s = e.stream();
    sparse_tree_meta* mp = cuda_access::ptr(m);
    cuda_kernels::decision_launch(kd::local_begin, s, mp, n, k, flags);
    ck(cudaGetLastError(), "tree_local");
    if (flags & ~sparse_wire::step_bits) return;
    require(g.size() == acc.size() && k >= 0 && static_cast<std::size_t>(k) <= acc.size() &&
                static_cast<std::size_t>(k) <= b.cur_idx.size(),
            "commpact::ops::tree_local: n = ", acc.size(), ", g holds ", g.size(), ", k = ", k,
            "; pass equal lengths and k <= n.");
    const std::size_t nn = acc.size();
    const bool have_r = residual.size() == nn, have_u = velocity.size() == nn;
    const float* sp = scale.empty() ? nullptr : cuda_access::ptr(scale);
    std::uint32_t* st = &status_of(mp);
    const unsigned grid = kd::vec_grid(nn);
    if (u_next.empty()) {
      kd::ef_kernel<0><<<grid, kd::vec_block, 0, s>>>(cuda_access::ptr(acc), nullptr, nullptr,
                                                              have_r ? cuda_access::ptr(residual) : nullptr,
                                                              cuda_access::ptr(g), nn, sp, momentum, st);
    } else if (have_r && have_u) {
      kd::ef_kernel<1><<<grid, kd::vec_block, 0, s>>>(cuda_access::ptr(acc), cuda_access::ptr(u_next),
                                                              cuda_access::ptr(velocity), cuda_access::ptr(residual),
                                                              cuda_access::ptr(g), nn, sp, momentum, st);
    } else {
      kd::ef_kernel<2><<<grid, kd::vec_block, 0, s>>>(
          cuda_access::ptr(acc), cuda_access::ptr(u_next), have_u ? cuda_access::ptr(velocity) : nullptr,
          have_r ? cuda_access::ptr(residual) : nullptr, cuda_access::ptr(g), nn, sp, momentum, st);
    }
    ck(cudaGetLastError(), "tree_local (accumulate)");
    const auto kk = static_cast<std::size_t>(k);
    if (kk > 0) {
      ws.bind(e);
      ws.run(cuda_access::ptr(acc), nn, kk, cuda_access::ptr(b.mine_idx), cuda_access::ptr(b.cur_val), s);
    }
    kd::local_end<<<kd::vec_grid(kk), kd::vec_block, 0, s>>>(mp, ptrs(b), static_cast<std::uint32_t>(kk));
    ck(cudaGetLastError(), "tree_local (end)");
  }
  static void tree_payload(const exec& e, span<const sparse_tree_meta> m, tree_stage stage, span<std::byte> frame,
                           const tree_views& b) {
    cuda_kernels::detail::payload_kernel<<<cuda_kernels::detail::vec_grid(frame.size()), cuda_kernels::detail::vec_block,
                                           0, e.stream()>>>(cuda_access::ptr(m), stage == tree_stage::unfold_send,
                                                            cuda_access::ptr(frame), frame.size(), ptrs(b));
    ck(cudaGetLastError(), "tree_payload");
  }
  static void tree_absorb(const exec& e, span<sparse_tree_meta> m, tree_stage stage, bool lower, int peer,
                          span<const std::byte> frame, const tree_views& b, merge_workspace& mws) {
    namespace kd = cuda_kernels::detail;
    const cudaStream_t s = e.stream();
    const cuda_kernels::tree_ptrs p = ptrs(b);
    cuda_kernels::merge_scratch& ms = mws.get(p.kcap, e);
    sparse_tree_meta* mp = cuda_access::ptr(m);
    const std::byte* f = cuda_access::ptr(frame);
    const std::size_t bytes = frame.size();
    const unsigned gk = kd::vec_grid(p.kcap);
    cuda_kernels::decision_launch(kd::absorb_head, s, mp, f, bytes, ms.ctl);
    kd::absorb_scan<<<kd::vec_grid(bytes), kd::vec_block, 0, s>>>(mp, f, bytes, ms.ctl);
    cuda_kernels::decision_launch(kd::absorb_decide, s, mp, ms.ctl, f, stage == tree_stage::unfold_recv, peer,
                                  p.kcap);
    kd::absorb_decode<<<gk, kd::vec_block, 0, s>>>(ms.ctl, f, p);
    ck(cudaGetLastError(), "tree_absorb (decode)");
    const auto k = static_cast<std::uint32_t>(p.kcap);
    std::uint32_t* merged = nullptr;
    std::uint32_t* cur_count = &mp->cur_count;
    const std::uint32_t* oth_count = &ms.ctl->count;
    const std::uint32_t* gate = &ms.ctl->ok;
    switch (stage) {
      case tree_stage::unfold_recv:
        kd::absorb_unfold<<<gk, kd::vec_block, 0, s>>>(mp, ms.ctl, p);
        ck(cudaGetLastError(), "tree_absorb (unfold)");
        return;
      case tree_stage::fold_recv:
        kd::absorb_fold<<<gk, kd::vec_block, 0, s>>>(mp, ms.ctl, p);
        ck(cudaGetLastError(), "tree_absorb (fold)");
        ck(cuda_kernels::sparse_merge_topk(ms, p.cur_idx, p.cur_val, cur_count, p.oth_idx, p.oth_val, oth_count, k, p.out_idx, p.out_val, merged, s, gate, &mp->k),
           "tree_absorb (merge)");
        break;
      case tree_stage::exchange:
        if (lower)
          ck(cuda_kernels::sparse_merge_topk(ms, p.cur_idx, p.cur_val, cur_count, p.oth_idx, p.oth_val, oth_count, k, p.out_idx, p.out_val, merged, s, gate, &mp->k),
             "tree_absorb (merge)");
        else
          ck(cuda_kernels::sparse_merge_topk(ms, p.oth_idx, p.oth_val, oth_count, p.cur_idx, p.cur_val, cur_count, k, p.out_idx, p.out_val, merged, s, gate, &mp->k),
             "tree_absorb (merge)");
        break;
      default: return;
    }
    kd::absorb_after_merge<<<gk, kd::vec_block, 0, s>>>(mp, ms.ctl, merged, p);
    kd::absorb_copy_out<<<gk, kd::vec_block, 0, s>>>(ms.ctl, merged, p);
    cuda_kernels::decision_launch(kd::absorb_finish, s, mp, ms.ctl, merged);
    ck(cudaGetLastError(), "tree_absorb (finish)");
  }
  static void tree_scatter(const exec& e, span<const sparse_tree_meta> m, span<float> out, const tree_views& b, int P) {
    namespace kd = cuda_kernels::detail;
    const cuda_kernels::tree_ptrs p = ptrs(b);
    kd::tree_scatter_zero<<<kd::vec_grid(out.size()), kd::vec_block, 0, e.stream()>>>(
        cuda_access::ptr(m), cuda_access::ptr(out), out.size());
    kd::tree_scatter_values<<<kd::vec_grid(p.kcap), kd::vec_block, 0, e.stream()>>>(
        cuda_access::ptr(m), cuda_access::ptr(out), out.size(), p, P);
    ck(cudaGetLastError(), "tree_scatter");
  }
  static void tree_zero_delivered(const exec& e, span<const sparse_tree_meta> m, span<float> residual,
                                  span<float> velocity, const tree_views& b) {
    namespace kd = cuda_kernels::detail;
    const cuda_kernels::tree_ptrs p = ptrs(b);
    kd::tree_zero_delivered_kernel<<<kd::vec_grid(p.kcap), kd::vec_block, 0, e.stream()>>>(
        cuda_access::ptr(m), cuda_access::ptr(residual), velocity.empty() ? nullptr : cuda_access::ptr(velocity),
        residual.size(), p);
    ck(cudaGetLastError(), "tree_zero_delivered");
  }
  static void tree_begin(const exec& e, span<sparse_tree_meta> m, span<const std::byte> block, int self,
                         const tree_views& b) {  // TreeMerge (kernels/cuda/tree_begin.cuh)
    auto* ctl = static_cast<cuda_kernels::absorb_ctl*>(e.scratch("tree_begin", sizeof(cuda_kernels::absorb_ctl)));
    ck(cuda_kernels::tree_begin(cuda_access::ptr(m), cuda_access::ptr(block), block.size(), self, ptrs(b),
                                static_cast<std::uint32_t>(b.mine_idx.size()), ctl, e.stream()),
       "tree_begin");
  }
  static void tree_status(const exec& e, span<const sparse_tree_meta> m, span<std::uint32_t> status) {  // TreeMerge
    cuda_kernels::decision_launch(cuda_kernels::detail::tree_status_kernel, e.stream(), cuda_access::ptr(m),
                                  cuda_access::ptr(status));
    ck(cudaGetLastError(), "tree_status");
  }

  // ---- a Codec's frame: device_codec<Codec> (kernels/device_codec.hpp, specialised in
  // compress/device_codecs*.cuh or by a user's codec)
  template <class Codec>
  static void codec_encode_frame(const exec& e, codec_workspace<Codec>& ws, Codec& codec, span<const float> acc,
                                 span<float> block, frame::header h, span<float> approx,
                                 span<const std::uint32_t> status) {
    ws.encode_frame(e, codec, acc, block, h, approx, status);
  }
  template <class Codec>
  static void codec_decode_sum(const exec& e, const Codec& codec, span<const float> blocks, std::size_t block_floats,
                               span<float> sum, span<std::uint32_t> status) {
    device_codec<Codec>::decode_sum(e, codec, blocks, block_floats, sum, status);
  }
  template <class Codec>
  static void codec_clear_delivered(const exec& e, const codec_workspace<Codec>& ws, const Codec& codec,
                                    span<float> residual, span<float> velocity) {
    ws.clear_delivered(e, codec, residual, velocity);
  }

 private:
  static void ck(cudaError_t err, const char* what) { cuda_kernels::detail::check(err, what, "commpact::ops<cuda_space>"); }
  static std::uint32_t& status_of(sparse_tree_meta* m) { return m->status; }  // an address, never dereferenced here
  static cuda_kernels::tree_ptrs ptrs(const tree_views& b) {
    return {cuda_access::ptr(b.mine_idx), cuda_access::ptr(b.cur_idx),    cuda_access::ptr(b.oth_idx),
            cuda_access::ptr(b.out_idx),  cuda_access::ptr(b.extra_idx),  cuda_access::ptr(b.cur_val),
            cuda_access::ptr(b.oth_val),  cuda_access::ptr(b.out_val),    cuda_access::ptr(b.mine_alive),
            cuda_access::ptr(b.extra_alive), cuda_access::ptr(b.mask_in), static_cast<std::uint32_t>(b.cur_idx.size())};
  }
};

}  // namespace commpact
