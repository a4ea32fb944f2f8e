// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file rows_power.cuh
//! ops<cuda_space> (kernels/cuda/ops.cuh) inherits these rows: PowerCompressor's rows (check_finite, copy_if_clear,
//! lowrank_project, lowrank_back_project, lowrank_approx_residual, orthonormalize, gaussian, redraw_zero_columns) and
//! PowerGossip's (power_gossip_orthonormalize, power_gossip_update, power_gossip_vectors). Each row implements the
//! specification of kernels/ops.hpp on the executor's stream.
//!
//! Bits: every row reproduces its host twin's order of operations (power_kernels.cuh), so
//! the results are the host's bits, NaN payloads aside (ops.cuh), with one exception:
//! gaussian, redraw_zero_columns and power_gossip_orthonormalize's redraws share
//! host::gaussian_pair with the host, but CUDA's double log, cos and sin are not glibc's
//! (1 and 2 ulp), so a drawn value can differ in the last bit of the float, about once in
//! 2^28 values. Sizes are checked on the host before anything is queued (invalid_argument,
//! as the host rows raise); data outcomes go to the status words, never an exception.
//! That is products = power_products::exact (the default). products = blas runs the three
//! products as cuBLAS SGEMMs instead (blas.cuh): not the host's bits, within the bound of
//! docs/cuda.md, deterministic and the same on every rank of one GPU model and cuBLAS
//! version. The orthonormalisation is this file's one-block kernel either way: it is
//! deterministic (a fixed order, no atomics) and exact to the host, and cuBLAS's dot, nrm2
//! and axpy promise no summation order, while one r-column Gram-Schmidt on n x r costs
//! little next to the products. power.cuh's cuBLAS helpers serve the benchmark only.
//!
//! Speed: project, approx_residual, the updates and the draws are parallel over the
//! elements; back_project is parallel over the m columns of M times the chunks of 128
//! rows (the host's tree, host::detail::back_cols), a launch per level of the tree; the
//! orthonormalisation runs in one block, each dot product summed by the whole block in
//! kernels/fixed_sum.hpp's shape (the host's order), the column updates spread over it.
//!
//! Checked against its host twin by tests/cuda/test_cuda_rows_power.cu (docs/cuda.md, "Status",
//! says where it has run).

#if !defined(__CUDACC__)
#error "commpact/kernels/cuda/rows_power.cuh needs nvcc: include it from a .cu file only."
#endif

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "../../error.hpp"
#include "../../space/cuda.hpp"
#include "../host/lowrank.hpp"
#include "../power_products.hpp"
#include "blas.cuh"
#include "check.cuh"
#include "power_kernels.cuh"

namespace commpact::cuda_rows {

namespace power_kd = cuda_kernels::power_detail;

struct power {
  using exec = cuda_space::exec;
  template <class T>
  using span = cuda_span<T>;

  static void check_finite(const exec& e, span<const float> v, span<std::uint32_t> status) {
    require(!status.empty(), "commpact::ops::check_finite: pass a status word.");
    if (v.empty()) return;
    power_kd::check_finite_kernel<<<power_kd::vec_grid(v.size()), power_kd::vec_block, 0, e.stream()>>>(
        ptr(v), v.size(), ptr(status));
    ck(cudaGetLastError(), "check_finite");
  }
  static void copy_if_clear(const exec& e, span<const float> src, span<float> dst, span<const std::uint32_t> status) {
    require(src.size() == dst.size(), "commpact::ops::copy_if_clear: ", src.size(), " values into ", dst.size(),
            "; pass spans of equal length.");
    if (src.empty()) return;
    power_kd::copy_if_clear_kernel<<<power_kd::vec_grid(src.size()), power_kd::vec_block, 0, e.stream()>>>(
        ptr(src), ptr(dst), src.size(), status_ptr(status), status.size());
    ck(cudaGetLastError(), "copy_if_clear");
  }
  //! products = blas: the executor's cuBLAS handle and the approximation's scratch for an
  //! n x m matrix; exact: the scratch of back_project's tree at rank r. Made now
  //! (PowerCompressor::set_layout) so that no step makes them.
  static void lowrank_prepare(const exec& e, std::size_t n, std::size_t m, std::size_t r, power_products products) {
    if (products == power_products::blas) return cuda_kernels::blas::prepare(e, n, m);
    if (const std::size_t sf = power_kd::back_scratch_floats(n, m, r < 8 ? r : 8)) (void)e.scratch("lowrank_back_project", sf * sizeof(float));
  }
  static void lowrank_project(const exec& e, span<const float> g, span<const float> res, span<float> M, std::size_t n,
                              std::size_t m, span<const float> Q, std::size_t r, span<float> P,
                              power_products products = power_products::exact) {
    host::detail::check_lowrank("lowrank_project_into", g.size(), n, m, P.size(), Q.size(), r);
    require(M.size() == g.size() && (res.empty() || res.size() == g.size()), "commpact::ops::lowrank_project: M holds ",
            M.size(), " floats and the residual ", res.size(), " but the gradient ", g.size(),
            "; pass M (and a non-empty residual) of the gradient's shape.");
    host::simd::check_no_partial_overlap("lowrank_project", "g", ptr(g), g.size(), "M", ptr(M), M.size());
    host::simd::check_no_partial_overlap("lowrank_project", "e", ptr(res), res.size(), "M", ptr(M), M.size());
    if (products == power_products::blas)
      return cuda_kernels::blas::project(e, ptr(g), res.empty() ? nullptr : ptr(res), ptr(M), n, m, ptr(Q), r, ptr(P));
    if (n == 0) return;
    const unsigned grid = blocks((n + power_kd::project_rows - 1) / power_kd::project_rows);
    for (std::size_t c0 = 0; c0 < r; c0 += 8) {
      const std::size_t w = r - c0 < 8 ? r - c0 : 8;
      // The first group writes M (= g + res, or g); the others read it back.
      const bool first = c0 == 0;
      const float* src = first ? ptr(g) : ptr(M);
      const float* rs = first && !res.empty() ? ptr(res) : nullptr;
      const bool write_m = first && (rs != nullptr || ptr(M) != ptr(g));
      const float* q = ptr(Q) + c0 * m;
      float* p = ptr(P) + c0 * n;
      float* mp = ptr(M);
      switch (w) {
#define COMMPACT_PROJECT_CASE(W)                                                                                 \
  case W:                                                                                                        \
    power_kd::project_kernel<W><<<grid, power_kd::vec_block, 0, e.stream()>>>(src, rs, mp, write_m, n, m, q, p); \
    break;
        COMMPACT_PROJECT_CASE(1)
        COMMPACT_PROJECT_CASE(2)
        COMMPACT_PROJECT_CASE(3)
        COMMPACT_PROJECT_CASE(4)
        COMMPACT_PROJECT_CASE(5)
        COMMPACT_PROJECT_CASE(6)
        COMMPACT_PROJECT_CASE(7)
        default:
          power_kd::project_kernel<8><<<grid, power_kd::vec_block, 0, e.stream()>>>(src, rs, mp, write_m, n, m, q, p);
          break;
#undef COMMPACT_PROJECT_CASE
      }
      ck(cudaGetLastError(), "lowrank_project");
    }
  }
  static void lowrank_back_project(const exec& e, span<const float> M, std::size_t n, std::size_t m,
                                   span<const float> P, std::size_t r, span<float> Q,
                                   power_products products = power_products::exact) {
    host::detail::check_lowrank("lowrank_back_project", M.size(), n, m, P.size(), Q.size(), r);
    if (products == power_products::blas) return cuda_kernels::blas::back_project(e, ptr(M), n, m, ptr(P), r, ptr(Q));
    if (m == 0) return;
    // The tree's sums below the top level (n > back_chunk): the executor's scratch, free
    // between rows on its stream and grown by lowrank_prepare.
    const std::size_t sf = power_kd::back_scratch_floats(n, m, r < 8 ? r : 8);
    float* scratch = sf ? static_cast<float*>(e.scratch("lowrank_back_project", sf * sizeof(float))) : nullptr;
    for (std::size_t c0 = 0; c0 < r; c0 += 8) {
      const std::size_t w = r - c0 < 8 ? r - c0 : 8;
      const float* p = ptr(P) + c0 * n;
      float* q = ptr(Q) + c0 * m;
      cudaError_t err = cudaSuccess;
      switch (w) {
#define COMMPACT_BACK_CASE(W)                                                                \
  case W:                                                                                    \
    err = power_kd::back_project<W>(ptr(M), n, m, p, q, scratch, e.stream());                \
    break;
        COMMPACT_BACK_CASE(1)
        COMMPACT_BACK_CASE(2)
        COMMPACT_BACK_CASE(3)
        COMMPACT_BACK_CASE(4)
        COMMPACT_BACK_CASE(5)
        COMMPACT_BACK_CASE(6)
        COMMPACT_BACK_CASE(7)
        default: err = power_kd::back_project<8>(ptr(M), n, m, p, q, scratch, e.stream()); break;
#undef COMMPACT_BACK_CASE
      }
      ck(err, "lowrank_back_project");
    }
  }
  static void lowrank_approx_residual(const exec& e, span<float> g, span<float> M, std::size_t n, std::size_t m,
                                      span<const float> P, span<const float> Q, std::size_t r,
                                      span<const std::uint32_t> status,
                                      power_products products = power_products::exact) {
    host::detail::check_lowrank("lowrank_approx_residual_inplace", g.size(), n, m, P.size(), Q.size(), r);
    require(M.size() == g.size() && (ptr(M) != ptr(g) || g.empty()),
            "commpact::ops::lowrank_approx_residual: M must be a separate buffer of the gradient's size (", g.size(),
            " floats; got ", M.size(), ").");
    host::simd::check_no_partial_overlap("lowrank_approx_residual", "g", ptr(g), g.size(), "M", ptr(M), M.size());
    if (g.empty()) return;
    if (products == power_products::blas)
      return cuda_kernels::blas::approx_residual(e, ptr(g), ptr(M), n, m, ptr(P), ptr(Q), r, status_ptr(status),
                                                 status.size());
    power_kd::approx_residual_kernel<<<power_kd::vec_grid(g.size()), power_kd::vec_block, 0, e.stream()>>>(
        ptr(g), ptr(M), n, m, ptr(P), ptr(Q), r, status_ptr(status), status.size());
    ck(cudaGetLastError(), "lowrank_approx_residual");
  }
  static void orthonormalize(const exec& e, span<float> a, std::size_t rows, std::size_t cols) {
    require(a.size() == rows * cols, "commpact::ops::orthonormalize: the span holds ", a.size(), " values; a ", rows,
            " x ", cols, " matrix needs ", rows * cols, ".");
    if (a.empty()) return;
    power_kd::orthonormalize_kernel<<<1, power_kd::ortho_block, 0, e.stream()>>>(ptr(a), rows, cols);
    ck(cudaGetLastError(), "orthonormalize");
  }
  static void gaussian(const exec& e, span<float> v, std::uint64_t seed) {
    if (v.empty()) return;
    power_kd::gaussian_kernel<<<power_kd::vec_grid((v.size() + 1) / 2), power_kd::vec_block, 0, e.stream()>>>(
        ptr(v), v.size(), seed);
    ck(cudaGetLastError(), "gaussian");
  }
  static void redraw_zero_columns(const exec& e, span<float> q, std::size_t rows, std::size_t cols, std::uint64_t seed,
                                  std::uint64_t tensor, std::uint64_t step) {
    require(q.size() == rows * cols, "commpact::ops::redraw_zero_columns: the span holds ", q.size(), " values; a ",
            rows, " x ", cols, " factor needs ", rows * cols, ".");
    require(cols <= 0x7fffffffu, "commpact::ops::redraw_zero_columns: ", cols, " columns is too many for one grid.");
    if (q.empty()) return;
    power_kd::redraw_zero_columns_kernel<<<static_cast<unsigned>(cols), power_kd::ortho_block, 0, e.stream()>>>(
        ptr(q), rows, seed, tensor, step);
    ck(cudaGetLastError(), "redraw_zero_columns");
  }

  // ---- PowerGossip (kernels/host/power_gossip.hpp); words: the round's 3 status words ----
  static void power_gossip_orthonormalize(const exec& e, span<float> s, std::size_t len, std::size_t r,
                                          std::uint64_t seed, std::uint64_t tensor, std::uint64_t step) {
    require(s.size() >= len * r, "commpact::ops::power_gossip_orthonormalize: the span holds ", s.size(), " values; a ",
            len, " x ", r, " factor needs ", len * r, ".");
    if (len * r == 0) return;
    power_kd::orthonormalize_shared_kernel<<<1, power_kd::ortho_block, 0, e.stream()>>>(ptr(s), len, r, seed, tensor,
                                                                                        step);
    ck(cudaGetLastError(), "power_gossip_orthonormalize");
  }
  static void power_gossip_update(const exec& e, span<float> X, std::size_t n, std::size_t m, span<const float> S,
                                  span<const float> mine, span<const std::byte> theirs, span<float> d, std::size_t r,
                                  int phase, bool lower, float coef, span<float> upd, span<const std::int64_t> words) {
    const std::size_t len = phase == 0 ? n : m, dl = (phase == 0 ? m : n) * r;
    require(r >= 1 && X.size() == n * m && upd.size() == n * m && S.size() == len * r && mine.size() >= dl &&
                theirs.size() >= 4 * dl && d.size() >= dl && words.size() >= 3,
            "commpact::ops::power_gossip_update: X holds ", X.size(), " floats, upd ", upd.size(), ", S ", S.size(),
            ", mine ", mine.size(), ", d ", d.size(), ", theirs ", theirs.size(), " bytes, words ", words.size(),
            " for n = ", n, ", m = ", m, ", r = ", r, ", phase ", phase, "; pass the shapes PowerGossip uses.");
    if (dl > 0)
      power_kd::gossip_diff_kernel<<<power_kd::vec_grid(dl), power_kd::vec_block, 0, e.stream()>>>(
          ptr(d), ptr(mine), reinterpret_cast<const float*>(ptr(theirs)), dl, lower, ptr(words));
    ck(cudaGetLastError(), "power_gossip_update (difference)");
    if (n * m == 0) return;
    const float* p = phase == 0 ? ptr(S) : ptr(d);
    const float* q = phase == 0 ? ptr(d) : ptr(S);
    power_kd::gossip_apply_kernel<<<power_kd::vec_grid(n * m), power_kd::vec_block, 0, e.stream()>>>(
        ptr(X), ptr(upd), n, m, p, q, r, coef, ptr(words));
    ck(cudaGetLastError(), "power_gossip_update");
  }
  static void power_gossip_vectors(const exec& e, span<float> x, span<const std::byte> recv, std::size_t stride,
                                   std::size_t offset, span<const double> w, double self_w, span<double> acc,
                                   span<const std::int64_t> words) {
    const std::size_t len = x.size();
    require(acc.size() >= len && words.size() >= 3 && offset % 4 == 0 && stride % 4 == 0 &&
                (w.empty() || (w.size() - 1) * stride + offset + 4 * len <= recv.size()),
            "commpact::ops::power_gossip_vectors: ", len, " floats at byte ", offset, " of ", w.size(), " blocks of ",
            stride, " bytes need more than the ", recv.size(), " bytes received (or acc holds ", acc.size(),
            " doubles, words ", words.size(), "); pass PowerGossip's message layout.");
    if (len == 0) return;
    power_kd::gossip_vectors_kernel<<<power_kd::vec_grid(len), power_kd::vec_block, 0, e.stream()>>>(
        ptr(x), ptr(recv), stride, offset, w.empty() ? nullptr : ptr(w), w.size(), self_w, ptr(acc), len, ptr(words));
    ck(cudaGetLastError(), "power_gossip_vectors");
  }

 private:
  template <class T>
  static T* ptr(span<T> s) {
    return cuda_access::ptr(s);
  }
  //! The status words (a null pointer for none: every word is then "clear").
  static const std::uint32_t* status_ptr(span<const std::uint32_t> s) { return s.empty() ? nullptr : ptr(s); }
  static unsigned blocks(std::size_t b) { return static_cast<unsigned>(b < 1 ? 1 : b > 65535 * 4 ? 65535 * 4 : b); }
  static void ck(cudaError_t err, const char* what) {
    cuda_kernels::detail::check(err, what, "commpact::ops<cuda_space>");
  }
};

}  // namespace commpact::cuda_rows
