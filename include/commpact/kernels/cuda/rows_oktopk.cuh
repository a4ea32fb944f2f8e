// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file rows_oktopk.cuh
//! ops<cuda_space> (kernels/cuda/ops.cuh) inherits these rows: OkTopK's rows (oktopk_local,
//! oktopk_begin, oktopk_frames, oktopk_region_sum, oktopk_mags, oktopk_theta,
//! oktopk_select, oktopk_output, oktopk_clear_selected). Each row implements the
//! specification of kernels/ops.hpp on the executor's stream,
//! bit-identical to its host twin (kernels/host/oktopk.hpp): the same entries, order and
//! ties, frames and blocks byte for byte, status_wire and status[1] set where the host
//! sets them. Kernels: kernels/cuda/oktopk.cuh, oktopk_begin.cuh.
//!
//! Checked against its host twin by tests/cuda/test_cuda_rows_oktopk.cu (docs/cuda.md, "Status",
//! says where it has run).
//!
//! | row | kernels |
//! |---|---|
//! | oktopk_local | select.cuh's selection (topk_abs's choice: sampled or radix path), k gated to 0 on the device by status |
//! | oktopk_begin | oktopk_begin.cuh: frame_check.cuh's checks (tree_begin's), a decision (decision_launch), install |
//! | oktopk_frames | one block: region ends by binary search + headers; a payload scatter |
//! | oktopk_region_sum | entry checks (atomicMin of the first bad rank); per chunk, slots in rank order (__fadd_rn) |
//! | oktopk_mags | radix select of the top |sum| + cub::DeviceRadixSort (descending) of those |
//! | oktopk_theta | cub::DeviceRadixSort (descending) of all, the k-th; every block's counts > and >= it (binary searches), the limit (decision) |
//! | oktopk_select | count of selectable sums, clamped to the limit (decision), radix select with k = min(cap, count) |
//! | oktopk_output | index checks and a non-finite sum in any block (its own included), zero, scatter of __fdiv_rn(sum, P) |
//! | oktopk_clear_selected | running counts and rebalance (one block), binary search of G per local entry |
//!
//! Scratch: oktopk_local uses its topk_workspace; the other rows carve the executor's
//! grow-only scratch (cuda_space::exec::scratch), sized by the spans' full lengths (the
//! ws spans of oktopk_mags and oktopk_select hold n values, which also serve as the
//! selection's candidates), so the scratch reaches its size at the first step: later
//! steps allocate nothing, whatever the regions. Argument errors (spans too short for the
//! host's reads and writes) raise invalid_argument before anything is queued.
//! Not bit-identical, where the host is: theta's k-th largest when it is a zero and both
//! +0 and -0 are in `all` (the host's bisection returns +0, the sort either; mags never
//! writes -0), and when `all` holds a NaN or a negative value (the host's bisection over
//! [+0, +Inf] never counts them; the descending sort puts a NaN first, so theta may be
//! NaN and the limit 0). mags writes neither: only a peer whose words are not commpact's
//! can send them, and the step's checked sums stay finite either way.

#if !defined(__CUDACC__)
#error "commpact/kernels/cuda/rows_oktopk.cuh needs nvcc: include it from a .cu file only."
#endif

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cub/device/device_radix_sort.cuh>

#include "../../error.hpp"
#include "../../space/cuda.hpp"
#include "check.cuh"
#include "oktopk.cuh"
#include "oktopk_begin.cuh"
#include "select.cuh"
#include "topk.cuh"

namespace commpact::cuda_kernels::oktopk {

// ---- a select_scratch whose candidates live in the caller's ws (mags, select) -------------
//! Bytes of a select_scratch for sets of at most cap entries, without the candidates.
inline cudaError_t select_bytes(std::uint32_t cap, std::size_t& total) {
  using detail::align256;
  std::size_t cb = 0;
  COMMPACT_CU_TRY(select_scratch::cub_need(cap, cb));
  total = align256(sizeof(detail::select_state)) + align256(4 * detail::max_bins) +
          align256(4 * detail::compact_blocks) + align256(cb);
  return cudaSuccess;
}
//! select_bytes for sets of len entries, sized by bound >= len (the length of the caller's
//! ws, fixed across steps), so that the scratch stops growing at the first step.
inline cudaError_t select_bytes_within(std::size_t len, std::size_t bound, std::size_t& total) {
  std::size_t a = 0, b = 0;
  COMMPACT_CU_TRY(select_bytes(static_cast<std::uint32_t>(len), a));
  COMMPACT_CU_TRY(select_bytes(static_cast<std::uint32_t>(bound), b));
  total = a > b ? a : b;
  return cudaSuccess;
}
//! Lays sc out in mem (select_bytes(bound) bytes, bound >= cap) with the candidates in
//! cand (cap entries), and zeroes the histogram on s (the memory is shared scratch).
inline cudaError_t carve_select(select_scratch& sc, unsigned char* mem, std::int32_t* cand, std::uint32_t cap,
                                cudaStream_t s) {
  using detail::align256;
  sc.st = reinterpret_cast<detail::select_state*>(mem);
  mem += align256(sizeof(detail::select_state));
  sc.hist = reinterpret_cast<std::uint32_t*>(mem);
  mem += align256(4 * detail::max_bins);
  sc.bcnt = reinterpret_cast<std::uint32_t*>(mem);
  mem += align256(4 * detail::compact_blocks);
  sc.cand = cand;
  sc.cub_tmp = mem;
  COMMPACT_CU_TRY(select_scratch::cub_need(cap, sc.cub_bytes));
  sc.cap = cap;
  int dev = 0;
  COMMPACT_CU_TRY(cudaGetDevice(&dev));
  COMMPACT_CU_TRY(cudaDeviceGetAttribute(&sc.sms, cudaDevAttrMultiProcessorCount, dev));
  return cudaMemsetAsync(sc.hist, 0, 4 * detail::max_bins, s);
}

}  // namespace commpact::cuda_kernels::oktopk

namespace commpact::cuda_rows {

struct oktopk {
  using exec = cuda_space::exec;
  template <class T>
  using span = cuda_span<T>;

  static void oktopk_local(const exec& e, span<const float> acc, std::size_t k, span<const std::uint32_t> status,
                           span<std::int32_t> idx, span<float> val, cuda_kernels::topk_workspace& ws) {
    cuda_kernels::detail::check_args(acc.size(), k);
    require(idx.size() >= k && val.size() >= k && !status.empty(), "commpact::ops::oktopk_local: outputs hold ",
            idx.size(), " indices and ", val.size(), " values for k = ", k, ", status ", status.size(),
            " words; pass spans of at least k entries and one status word.");
    if (k == 0) return;
    const cudaStream_t s = e.stream();
    const auto n = static_cast<std::uint32_t>(acc.size());
    std::size_t need = 0;
    ck(cuda_kernels::select_scratch::bytes(n, need), "oktopk_local (size)");
    need = cuda_kernels::detail::align256(need);
    ws.bind(e);
    ws.reserve(need + sizeof(std::int64_t));
    auto* mem = static_cast<unsigned char*>(ws.storage());
    auto* dk = reinterpret_cast<std::int64_t*>(mem + need);
    cuda_kernels::select_scratch sc;
    ck(sc.carve(mem, n, s), "oktopk_local (scratch)");
    namespace ok = cuda_kernels::oktopk;
    cuda_kernels::decision_launch(ok::local_gate, s, cuda_access::ptr(status), static_cast<std::int64_t>(k), dk);
    ck(cudaGetLastError(), "oktopk_local (gate)");
    // topk_abs's selection (its choice of path), with k gated on the device.
    ck(cuda_kernels::detail::run_topk(sc, cuda_access::ptr(acc), acc.size(), k, cuda_access::ptr(idx),
                                      cuda_access::ptr(val), ws.method(), s, dk),
       "oktopk_local (select)");
  }

  static void oktopk_begin(const exec& e, span<const std::byte> block, std::int64_t n, std::int64_t k,
                           span<std::int32_t> idx, span<float> val, span<std::uint32_t> status) {
    require(!status.empty(), "commpact::ops::oktopk_begin: no status word; pass a span of at least one.");
    auto* ctl = static_cast<cuda_kernels::absorb_ctl*>(e.scratch("oktopk_begin", sizeof(cuda_kernels::absorb_ctl)));
    ck(cuda_kernels::oktopk::begin(cuda_access::ptr(block), block.size(), n, k, cuda_access::ptr(idx), idx.size(),
                                   cuda_access::ptr(val), val.size(), cuda_access::ptr(status), ctl, e.stream()),
       "oktopk_begin");
  }

  static void oktopk_frames(const exec& e, span<const std::int32_t> idx, span<const float> val,
                            span<const std::int64_t> bounds, span<const std::uint32_t> status, std::uint32_t flags,
                            std::int64_t n, std::int64_t k, std::int64_t step, span<std::byte> hdr,
                            span<std::byte> pay) {
    namespace ok = cuda_kernels::oktopk;
    require(bounds.size() >= 2 && !status.empty() && hdr.size() >= (bounds.size() - 1) * ok::hk::header_bytes &&
                ((flags & ok::hk::stop_flags) != 0 || val.size() >= idx.size()),
            "commpact::ops::oktopk_frames: ", bounds.size(), " bounds, ", status.size(), " status words, ", hdr.size(),
            " header bytes, ", idx.size(), " indices and ", val.size(),
            " values; pass P + 1 >= 2 bounds, a status word, 40 P header bytes and a value per index.");
    const auto P = static_cast<std::uint32_t>(bounds.size() - 1);
    const cudaStream_t s = e.stream();
    auto* ends = static_cast<std::uint64_t*>(e.scratch("oktopk_frames", 8 * (std::size_t(P) + 2)));
    auto* fl = reinterpret_cast<std::uint32_t*>(ends + P + 1);
    const std::size_t m = (flags & ok::hk::stop_flags) ? 0 : idx.size();
    ok::frames_head<<<1, ok::block, 0, s>>>(m ? cuda_access::ptr(idx) : nullptr, m, cuda_access::ptr(bounds), P,
                                            cuda_access::ptr(status), flags, n, k, step, cuda_access::ptr(hdr), ends,
                                            fl);
    ck(cudaGetLastError(), "oktopk_frames (headers)");
    if (m == 0) return;
    ok::frames_payload<<<ok::grid(m), ok::block, 0, s>>>(cuda_access::ptr(idx), cuda_access::ptr(val), m, ends, P, fl,
                                                          cuda_access::ptr(pay), pay.size(), pay.size() / P);
    ck(cudaGetLastError(), "oktopk_frames (payload)");
  }

  static void oktopk_region_sum(const exec& e, span<const std::byte> hdr_out, span<const std::byte> pay_out,
                                span<const std::byte> hdr_in, span<const std::byte> pay_in, int me, std::int64_t lo,
                                std::int64_t hi, span<float> reg, span<std::uint8_t> touched,
                                span<std::uint32_t> status) {
    namespace ok = cuda_kernels::oktopk;
    const std::size_t P = hdr_out.size() / ok::hk::header_bytes;
    require(P >= 1 && hdr_in.size() >= hdr_out.size() && me >= 0 && static_cast<std::size_t>(me) < P && lo <= hi &&
                reg.size() >= static_cast<std::size_t>(hi - lo) &&
                touched.size() >= static_cast<std::size_t>(hi - lo) &&
                status.size() >= 2,
            "commpact::ops::oktopk_region_sum: ", hdr_out.size(), " and ", hdr_in.size(), " header bytes, rank ", me,
            ", region [", lo, ", ", hi, "), reg ", reg.size(), ", touched ", touched.size(), ", status ", status.size(),
            "; pass 40 P header bytes each, 0 <= me < P, lo <= hi, hi - lo sums and flags and two status words.");
    const auto len = static_cast<std::size_t>(hi - lo);
    const cudaStream_t s = e.stream();
    auto* bad = static_cast<std::uint32_t*>(e.scratch("oktopk_region_sum", sizeof(std::uint32_t)));
    const ok::frame_slots fs{cuda_access::ptr(hdr_out), cuda_access::ptr(pay_out), cuda_access::ptr(hdr_in),
                             cuda_access::ptr(pay_in), pay_out.size(), pay_in.size(), pay_out.size() / P,
                             static_cast<std::uint32_t>(me), lo, hi};
    const auto up = static_cast<std::uint32_t>(P);
    const std::size_t per_slot = pay_out.size() / P / 8 / P + 1;  // about k / P entries a peer
    ck(ok::check(fs, up, static_cast<std::uint32_t>(me), per_slot, bad, cuda_access::ptr(status), s),
       "oktopk_region_sum (check)");
    if (len == 0) return;
    const std::size_t chunks = (len + ok::sum_chunk - 1) / ok::sum_chunk;
    ok::region_sum_kernel<<<static_cast<unsigned>(chunks < 65535 ? chunks : 65535), ok::block, 0, s>>>(
        fs, up, len, cuda_access::ptr(reg), cuda_access::ptr(touched), bad);
    ck(cudaGetLastError(), "oktopk_region_sum");
  }

  static void oktopk_mags(const exec& e, span<const float> reg, span<const std::uint8_t> touched, span<float> mags,
                          span<float> ws) {
    require(touched.size() >= reg.size() && ws.size() >= reg.size() && ws.size() < (std::size_t{1} << 31),
            "commpact::ops::oktopk_mags: reg holds ", reg.size(), " sums, touched ", touched.size(), ", ws ", ws.size(),
            "; pass touched and ws at least as long as reg (below 2^31).");
    namespace ok = cuda_kernels::oktopk;
    using cuda_kernels::detail::align256;
    const std::size_t len = reg.size(), cap = mags.size(), m = len < cap ? len : cap;
    if (cap == 0) return;
    const cudaStream_t s = e.stream();
    std::size_t sel = 0, sort = 0, sort_m = 0;
    ck(ok::select_bytes_within(len, ws.size(), sel), "oktopk_mags (size)");
    ck(cub::DeviceRadixSort::SortKeysDescending(nullptr, sort, static_cast<const float*>(nullptr),
                                                 static_cast<float*>(nullptr), cap, 0, 32, s),
       "oktopk_mags (sort size)");
    ck(cub::DeviceRadixSort::SortKeysDescending(nullptr, sort_m, static_cast<const float*>(nullptr),
                                                 static_cast<float*>(nullptr), m, 0, 32, s),
       "oktopk_mags (sort size)");
    sort = sort > sort_m ? sort : sort_m;
    auto* mem = static_cast<unsigned char*>(e.scratch("oktopk_mags", sel + align256(4 * cap) + sort));
    auto* tmp = reinterpret_cast<float*>(mem + sel);
    float* out = cuda_access::ptr(mags);
    if (m > 0) {
      cuda_kernels::select_scratch sc;
      auto* cand = reinterpret_cast<std::int32_t*>(cuda_access::ptr(ws));
      ck(ok::carve_select(sc, mem, cand, static_cast<std::uint32_t>(len), s),
         "oktopk_mags (scratch)");
      const ok::mag_keys keys{cuda_access::ptr(reg), cuda_access::ptr(touched)};
      ck(cuda_kernels::select_topk(sc, keys, nullptr, static_cast<std::uint32_t>(m), ok::mag_emit{keys, tmp}, s),
         "oktopk_mags (select)");
      ck(cub::DeviceRadixSort::SortKeysDescending(mem + sel + align256(4 * cap), sort, static_cast<const float*>(tmp),
                                                   out, m, 0, 32, s),
         "oktopk_mags (sort)");
    }
    if (m < cap) ck(cudaMemsetAsync(out + m, 0, 4 * (cap - m), s), "oktopk_mags (padding)");
  }

  static void oktopk_theta(const exec& e, span<const float> all, std::size_t k, int me, span<float> theta,
                           span<std::uint32_t> limit) {
    require(k >= 1 && all.size() % k == 0 && me >= 0 && static_cast<std::size_t>(me) < all.size() / k &&
                !theta.empty() && !limit.empty() && all.size() < (std::size_t{1} << 31),
            "commpact::ops::oktopk_theta: k = ", k, ", ", all.size(), " values, rank ", me, ", theta ", theta.size(),
            ", limit ", limit.size(), "; pass P blocks of k >= 1 values (below 2^31 in all), 0 <= me < P, one theta "
            "and one limit.");
    namespace ok = cuda_kernels::oktopk;
    using cuda_kernels::detail::align256;
    const cudaStream_t s = e.stream();
    const std::size_t A = all.size(), P = A / k;
    std::size_t sort = 0;
    ck(cub::DeviceRadixSort::SortKeysDescending(nullptr, sort, static_cast<const float*>(nullptr),
                                                 static_cast<float*>(nullptr), A, 0, 32, s),
       "oktopk_theta (sort size)");
    auto* mem = static_cast<unsigned char*>(e.scratch("oktopk_theta", align256(4 * A) + align256(16 * P) + sort));
    auto* sorted = reinterpret_cast<float*>(mem);
    auto* gt = reinterpret_cast<std::uint64_t*>(mem + align256(4 * A));
    auto* ge = gt + P;
    const float* in = cuda_access::ptr(all);
    float* t = cuda_access::ptr(theta);
    ck(cub::DeviceRadixSort::SortKeysDescending(mem + align256(4 * A) + align256(16 * P), sort, in, sorted, A, 0, 32,
                                                 s),
       "oktopk_theta (sort)");
    ck(cudaMemcpyAsync(t, sorted + (k - 1), sizeof(float), cudaMemcpyDeviceToDevice, s), "oktopk_theta (copy)");
    const auto up = static_cast<std::uint32_t>(P);
    ok::theta_counts<<<ok::grid(P), ok::block, 0, s>>>(in, k, up, t, gt, ge);
    cuda_kernels::decision_launch(ok::theta_limit, s, static_cast<const std::uint64_t*>(gt),
                                  static_cast<const std::uint64_t*>(ge), up, static_cast<std::uint32_t>(me), k,
                                  cuda_access::ptr(limit));
    ck(cudaGetLastError(), "oktopk_theta (limit)");
  }

  static void oktopk_select(const exec& e, span<const float> reg, span<const std::uint8_t> touched,
                            span<const float> theta, span<const std::uint32_t> limit, std::int64_t lo, int me,
                            span<std::byte> block, span<std::int32_t> ws) {
    namespace ok = cuda_kernels::oktopk;
    require(block.size() >= ok::hk::block_header_bytes && (block.size() - 8) / 8 < (std::size_t{1} << 32) &&
                touched.size() >= reg.size() && ws.size() >= reg.size() && ws.size() < (std::size_t{1} << 31) &&
                !theta.empty() && !limit.empty() && me >= 0,
            "commpact::ops::oktopk_select: block of ", block.size(), " bytes, reg ", reg.size(), ", touched ",
            touched.size(), ", ws ", ws.size(), ", theta ", theta.size(), ", limit ", limit.size(), ", rank ", me,
            "; pass a block of at least 8 bytes, touched and ws at least as long as reg (below 2^31), one theta and "
            "one limit.");
    const std::size_t len = reg.size();
    const auto cap = static_cast<std::uint32_t>((block.size() - 8) / 8);
    const cudaStream_t s = e.stream();
    std::size_t sel = 0;
    ck(ok::select_bytes_within(len, ws.size(), sel), "oktopk_select (size)");
    auto* mem = static_cast<unsigned char*>(e.scratch("oktopk_select", sel + 256));
    auto* passing = reinterpret_cast<unsigned long long*>(mem + sel);
    const ok::pass_keys keys{cuda_access::ptr(reg), cuda_access::ptr(touched), cuda_access::ptr(theta)};
    std::byte* blk = cuda_access::ptr(block);
    ck(cudaMemsetAsync(passing, 0, sizeof(unsigned long long), s), "oktopk_select (count)");
    if (len > 0) ok::count_pass<<<ok::grid(len, 4096), ok::block, 0, s>>>(keys, len, passing);
    // passing = min(selectable, limit): the block's count is min(passing, cap), as the host's.
    cuda_kernels::decision_launch(ok::clamp_passing, s, passing, cuda_access::ptr(limit));
    cuda_kernels::decision_launch(ok::select_head, s, blk, static_cast<std::uint32_t>(me), passing, cap);
    ck(cudaGetLastError(), "oktopk_select (count)");
    if (len == 0 || cap == 0) return;
    cuda_kernels::select_scratch sc;
    ck(ok::carve_select(sc, mem, cuda_access::ptr(ws), static_cast<std::uint32_t>(len), s), "oktopk_select (scratch)");
    ck(cuda_kernels::select_topk(sc, keys, nullptr, cap, ok::select_emit{keys.reg, blk, lo, passing, cap}, s,
                                 reinterpret_cast<const std::int64_t*>(passing)),
       "oktopk_select (select)");
  }

  static void oktopk_output(const exec& e, span<const std::byte> blocks, span<const std::int64_t> bounds, int me,
                            span<float> grad, span<std::uint32_t> status) {
    namespace ok = cuda_kernels::oktopk;
    const std::size_t P = bounds.size() < 2 ? 0 : bounds.size() - 1;
    require(P >= 1 && blocks.size() >= 8 * P && me >= 0 && static_cast<std::size_t>(me) < P && status.size() >= 2,
            "commpact::ops::oktopk_output: ", bounds.size(), " bounds, ", blocks.size(), " block bytes, rank ", me,
            ", status ", status.size(), "; pass P + 1 >= 2 bounds, at least 8 bytes per block, 0 <= me < P and two "
            "status words.");
    const cudaStream_t s = e.stream();
    const auto up = static_cast<std::uint32_t>(P);
    const std::size_t stride = blocks.size() / P, per_slot = (stride - 8) / 8 + 1;
    const ok::block_slots bs{cuda_access::ptr(blocks), blocks.size(), stride, cuda_access::ptr(bounds)};
    auto* bad = static_cast<std::uint32_t*>(e.scratch("oktopk_output", sizeof(std::uint32_t)));
    ck(ok::check(bs, up, static_cast<std::uint32_t>(me), per_slot, bad, cuda_access::ptr(status), s, false),
       "oktopk_output (check)");
    ok::output_zero<<<ok::grid(grad.size(), 4096), ok::block, 0, s>>>(cuda_access::ptr(grad), grad.size(), bad);
    ok::output_scatter<<<dim3(ok::grid(per_slot, 1024), up < 65535u ? up : 65535u), ok::block, 0, s>>>(
        bs, up, cuda_access::ptr(grad), grad.size(), bad);
    ck(cudaGetLastError(), "oktopk_output");
  }

  static void oktopk_clear_selected(const exec& e, span<float> acc, span<const std::int32_t> idx,
                                    span<const std::byte> blocks, span<const std::int64_t> bounds,
                                    span<const std::uint32_t> status, span<std::int64_t> next) {
    namespace ok = cuda_kernels::oktopk;
    const std::size_t P = bounds.size() < 2 ? 0 : bounds.size() - 1;
    require(P >= 1 && blocks.size() >= 8 * P && !status.empty() && next.size() >= bounds.size(),
            "commpact::ops::oktopk_clear_selected: ", bounds.size(), " bounds, ", blocks.size(), " block bytes, ",
            status.size(), " status words, next ", next.size(),
            "; pass P + 1 >= 2 bounds, at least 8 bytes per block, a status word and P + 1 next bounds.");
    const cudaStream_t s = e.stream();
    const auto up = static_cast<std::uint32_t>(P);
    const ok::block_slots bs{cuda_access::ptr(blocks), blocks.size(), blocks.size() / P, cuda_access::ptr(bounds)};
    auto* pre = static_cast<std::uint64_t*>(e.scratch("oktopk_clear_selected", 8 * (P + 1)));
    const std::uint32_t* st = cuda_access::ptr(status);
    ok::clear_head<<<1, ok::block, 0, s>>>(bs, up, st, pre, cuda_access::ptr(next));
    if (!idx.empty())
      ok::clear_acc<<<ok::grid(idx.size(), 4096), ok::block, 0, s>>>(bs, up, st, pre, cuda_access::ptr(idx), idx.size(),
                                                                      cuda_access::ptr(acc), acc.size());
    ck(cudaGetLastError(), "oktopk_clear_selected");
  }

 private:
  static void ck(cudaError_t err, const char* what) {
    cuda_kernels::detail::check(err, what, "commpact::ops<cuda_space>");
  }
};

}  // namespace commpact::cuda_rows
