// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file lowrank.hpp
//! PowerSGD's products for a row-major matrix M (n x m) and a small rank r, on the host.
//!
//! <!-- snippet: e=std::vector<float>; Q=std::vector<float>; r=std::size_t; P=std::vector<float> -->
//! \code
//! namespace h = commpact::host;
//! h::lowrank_project_ef(g, e, n, m, Q, r, P);         // g = M = g + e; P = M Q
//! // allreduce P; orthonormalize_columns(P) ...
//! h::lowrank_back_project(g, n, m, P, r, Q);          // Q = M^T P
//! // allreduce Q; scale ...
//! h::lowrank_approx_residual(g, e, n, m, P, Q, r);    // e = M - P Q^T; g = P Q^T
//! \endcode
//!
//! P (n x r) and Q (m x r) are column-major, M row-major, all contiguous. Each routine
//! streams over the rows of M once, reading each element once, without repacking M:
//! the factors (at most 8 columns of m or n floats) stay in cache.
//!
//! Arithmetic order (fixed; every product is rounded, then added: never fused into an
//! FMA, see simd.hpp), so results are the same bits on every rank, whatever its
//! vector width or -march, given the same inputs:
//!  - project: P[i,c] = sum_j M[i,j] Q[j,c] with eight partial sums s_l over
//!    j = l, l + 8, l + 16, ... < m8 = m - m % 8 (increasing j), combined as
//!    ((s0 + s4) + (s2 + s6)) + ((s1 + s5) + (s3 + s7)), then the products of the last
//!    m % 8 columns added in increasing j.
//!  - back_project: Q[j,c] = sum_i M[i,j] P[i,c] as a tree of sequential sums that a
//!    GPU runs in parallel (kernels/cuda/power_kernels.cuh): the rows by chunks of
//!    back_chunk = 128, each chunk's products added in increasing row order from 0; then
//!    the chunk sums by groups of 128 consecutive ones, each group added in order from 0,
//!    and so on up to one sum. For n <= 128 that is the plain scalar loop's order.
//!  - approx: A[i,j] = (...(P[i,0] Q[j,0] + P[i,1] Q[j,1]) + ...) in increasing c;
//!    then e[i,j] = M[i,j] - A[i,j].
//! Error bound (tested against a double-precision reference): for P = M Q,
//! |P - P_exact| <= (m / 8 + 11) u sum_j |M[i,j] Q[j,c]|, u = 2^-24; for Q = M^T P,
//! (n + 1) u sum_i |M[i,j] P[i,c]|; for A, (r + 1) u sum_c |P[i,c] Q[j,c]|.

#include <algorithm>
#include <cstddef>
#include <span>
#include <vector>

#include "../../error.hpp"
#include "simd.hpp"

namespace commpact::host {

namespace detail {

inline void check_lowrank(const char* fn, std::size_t msize, std::size_t n, std::size_t m, std::size_t psize,
                          std::size_t qsize, std::size_t r) {
  require(r >= 1, "commpact::host::", fn, ": rank r = 0; pass r >= 1.");
  require(msize == n * m, "commpact::host::", fn, ": the matrix span holds ", msize, " floats but n x m = ", n, " x ",
          m, " needs ", n * m, "; pass the row-major n x m matrix.");
  require(psize == n * r, "commpact::host::", fn, ": P holds ", psize, " floats but n x r = ", n, " x ", r,
          " needs ", n * r, "; pass the column-major n x r factor.");
  require(qsize == m * r, "commpact::host::", fn, ": Q holds ", qsize, " floats but m x r = ", m, " x ", r,
          " needs ", m * r, "; pass the column-major m x r factor.");
}

//! One row's dot products with R columns of Q (leading dimension m), order as documented.
template <int R>
inline void row_dots(const float* row, std::size_t m, const float* q, float* out) noexcept {
  const std::size_t m8 = m - m % 8;
#if COMMPACT_HOST_SIMD
  // Eight partial sums per column, as 8 / lanes vectors (one with AVX, two with SSE2).
  constexpr std::size_t L = simd::lanes, H = 8 / L;
  simd::vf acc[R][H] = {};
  for (std::size_t j = 0; j < m8; j += 8) {
    simd::vf a[H];
    COMMPACT_UNROLL
    for (std::size_t h = 0; h < H; ++h) a[h] = simd::load<simd::vf>(row + j + h * L);
    COMMPACT_UNROLL
    for (int c = 0; c < R; ++c)
      COMMPACT_UNROLL
      for (std::size_t h = 0; h < H; ++h) {
        simd::vf p = a[h] * simd::load<simd::vf>(q + static_cast<std::size_t>(c) * m + j + h * L);
        simd::opaque(p);
        acc[c][h] += p;
      }
  }
  for (int c = 0; c < R; ++c) {
    float v[8];
    for (std::size_t l = 0; l < 8; ++l) v[l] = acc[c][l / L][l % L];
    out[c] = ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
  }
#else
  for (int c = 0; c < R; ++c) {
    float s[8] = {};
    for (std::size_t j = 0; j < m8; j += 8)
      for (int l = 0; l < 8; ++l) {
        float p = row[j + l] * q[static_cast<std::size_t>(c) * m + j + l];
        simd::opaque(p);
        s[l] += p;
      }
    out[c] = ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
  }
#endif
  for (std::size_t j = m8; j < m; ++j)
    for (int c = 0; c < R; ++c) {
      float p = row[j] * q[static_cast<std::size_t>(c) * m + j];
      simd::opaque(p);
      out[c] += p;
    }
}

//! P[:, 0..R) = M Q[:, 0..R) with M in g; with Ef, first g = src + e row by row (M =
//! the new g; src == g in place).
template <int R, bool Ef>
inline void project_cols(float* g, const float* src, const float* e, std::size_t n, std::size_t m, const float* q,
                         float* p) noexcept {
  float out[R];
  for (std::size_t i = 0; i < n; ++i) {
    float* row = g + i * m;
    if constexpr (Ef) {
      const float* sr = src + i * m;
      const float* er = e + i * m;
      std::size_t j = 0;
#if COMMPACT_HOST_SIMD
      for (; j + simd::lanes <= m; j += simd::lanes)
        simd::store(row + j, simd::load<simd::vf>(sr + j) + simd::load<simd::vf>(er + j));
#endif
      for (; j < m; ++j) row[j] = sr[j] + er[j];
    }
    row_dots<R>(row, m, q, out);
    for (int c = 0; c < R; ++c) p[static_cast<std::size_t>(c) * n + i] = out[c];
  }
}

//! With Ef: g = src + e (src may be g) and P = g Q; else P = g Q.
template <bool Ef>
inline void project_dispatch(float* g, const float* src, const float* e, std::size_t n, std::size_t m, const float* q,
                             std::size_t r, float* p) noexcept {
  // Columns are independent: groups of at most 8 (more than 8 reads M again per group).
  for (std::size_t c0 = 0; c0 < r; c0 += 8) {
    const std::size_t w = r - c0 < 8 ? r - c0 : 8;
    const float* qc = q + c0 * m;
    float* pc = p + c0 * n;
    const bool ef = Ef && c0 == 0;
    switch (w) {
#define COMMPACT_LOWRANK_CASE(W)                                       \
  case W:                                                              \
    if (ef)                                                            \
      project_cols<W, true>(g, src, e, n, m, qc, pc);                  \
    else                                                               \
      project_cols<W, false>(g, nullptr, nullptr, n, m, qc, pc);       \
    break;
      COMMPACT_LOWRANK_CASE(1)
      COMMPACT_LOWRANK_CASE(2)
      COMMPACT_LOWRANK_CASE(3)
      COMMPACT_LOWRANK_CASE(4)
      COMMPACT_LOWRANK_CASE(5)
      COMMPACT_LOWRANK_CASE(6)
      COMMPACT_LOWRANK_CASE(7)
      COMMPACT_LOWRANK_CASE(8)
#undef COMMPACT_LOWRANK_CASE
      default: break;
    }
  }
}

//! Rows per block of back_project: Q is loaded and stored once per block.
inline constexpr std::size_t back_rows = 4;
//! back_project's tree (see the file comment): rows per first-level sum, and sums per
//! node of each level above.
inline constexpr std::size_t back_chunk = 128;

//! The number of levels of back_project's tree over n rows (1 for n <= back_chunk).
constexpr int back_levels(std::size_t n) {
  int l = 1;
  for (std::size_t w = (n + back_chunk - 1) / back_chunk; w > 1; w = (w + back_chunk - 1) / back_chunk) ++l;
  return l;
}

//! Q[j, c] += sum over rows i0 .. i0 + B - 1 (in order) of M[i, j] P[i, c], for j in
//! [0, m) and the W <= 8 columns c of P and Q given. Each vector of M is loaded once
//! and used for every column.
template <std::size_t W, std::size_t B>
inline void back_block(const float* M, std::size_t n, std::size_t m, std::size_t i0, const float* p,
                       float* q) noexcept {
  float pc[W][B];
  for (std::size_t c = 0; c < W; ++c)
    for (std::size_t b = 0; b < B; ++b) pc[c][b] = p[c * n + i0 + b];
  const float* rows = M + i0 * m;
  std::size_t j = 0;
#if COMMPACT_HOST_SIMD
  constexpr std::size_t L = simd::lanes;
  simd::vf pv[W][B];
  for (std::size_t c = 0; c < W; ++c)
    for (std::size_t b = 0; b < B; ++b) pv[c][b] = simd::vf{} + pc[c][b];
  for (; j + L <= m; j += L) {
    simd::vf a[B];
    COMMPACT_UNROLL
    for (std::size_t b = 0; b < B; ++b) a[b] = simd::load<simd::vf>(rows + b * m + j);
    COMMPACT_UNROLL
    for (std::size_t c = 0; c < W; ++c) {
      simd::vf acc = simd::load<simd::vf>(q + c * m + j);
      COMMPACT_UNROLL
      for (std::size_t b = 0; b < B; ++b) {
        simd::vf t = a[b] * pv[c][b];
        simd::opaque(t);
        acc += t;
      }
      simd::store(q + c * m + j, acc);
    }
  }
#endif
  for (; j < m; ++j)
    for (std::size_t c = 0; c < W; ++c) {
      float acc = q[c * m + j];
      for (std::size_t b = 0; b < B; ++b) {
        float t = rows[b * m + j] * pc[c][b];
        simd::opaque(t);
        acc += t;
      }
      q[c * m + j] = acc;
    }
}

//! q += rows [i0, i1) of M^T P, row by row in increasing order, for the W <= 8 columns given.
template <std::size_t W>
inline void back_range(const float* M, std::size_t n, std::size_t m, std::size_t i0, std::size_t i1, const float* p,
                       float* q) noexcept {
  std::size_t i = i0;
  for (; i + back_rows <= i1; i += back_rows) back_block<W, back_rows>(M, n, m, i, p, q);
  for (; i < i1; ++i) back_block<W, 1>(M, n, m, i, p, q);
}

//! back_project for the W <= 8 columns of P and Q given (q zero on entry), in the tree of
//! the file comment: the first-level sums one after another, each added to the open node
//! of the level above (whose sums start from 0), a node passed up once its last child is
//! in. tmp: (back_levels(n) - 1) W m floats (none for n <= back_chunk).
template <std::size_t W>
inline void back_cols(const float* M, std::size_t n, std::size_t m, const float* p, float* q, float* tmp) noexcept {
  const int L = back_levels(n);
  if (L == 1) return back_range<W>(M, n, m, 0, n, p, q);
  const std::size_t wm = W * m;
  std::size_t width[8], count[8] = {}, node[8] = {};  // 128^8 > 2^53 rows
  width[0] = n;
  for (int l = 1; l <= L; ++l) width[l] = (width[l - 1] + back_chunk - 1) / back_chunk;
  // tmp[(l - 1) wm ...]: the sum being built at level l < L; level L's is q.
  auto level = [&](int l) { return l == L ? q : tmp + static_cast<std::size_t>(l - 1) * wm; };
  for (int l = 1; l < L; ++l) std::fill(level(l), level(l) + wm, 0.0f);
  for (std::size_t c = 0; c < width[1]; ++c) {
    float* first = level(1);
    back_range<W>(M, n, m, c * back_chunk, std::min(n, c * back_chunk + back_chunk), p, first);
    for (int l = 2; l <= L; ++l) {  // pass the finished sum of level l - 1 up
      const float* child = level(l - 1);
      float* parent = level(l);
      for (std::size_t k = 0; k < wm; ++k) parent[k] += child[k];
      std::fill(level(l - 1), level(l - 1) + wm, 0.0f);
      const std::size_t lo = node[l] * back_chunk, have = std::min(back_chunk, width[l - 1] - lo);
      if (++count[l] < have) break;
      count[l] = 0, ++node[l];
    }
  }
}

//! A[i, j] for j in [j, j + lanes) of one row: sum over c in order. pv[c] holds P[i, c]
//! (broadcast); R = 0 means a run-time r.
template <int R, class V>
inline V approx_at(const V* pv, const float* q, std::size_t m, std::size_t r, std::size_t j) noexcept {
  const std::size_t rr = R > 0 ? static_cast<std::size_t>(R) : r;
  V a = simd::load<V>(q + j) * pv[0];
  simd::opaque(a);
  COMMPACT_UNROLL
  for (std::size_t c = 1; c < rr; ++c) {
    V t = simd::load<V>(q + c * m + j) * pv[c];
    simd::opaque(t);
    a += t;
  }
  return a;
}

//! Rows of A = P Q^T; with Residual, e = M - A (M read from src, which may be g or e:
//! each element is read before it is written) and g = A, else g = A.
template <int R, bool Residual>
inline void approx_rows(float* g, const float* src, float* e, std::size_t n, std::size_t m, const float* p,
                        const float* q, std::size_t r) noexcept {
  constexpr std::size_t cap = R > 0 ? static_cast<std::size_t>(R) : 1;
  const std::size_t rr = R > 0 ? static_cast<std::size_t>(R) : r;
  for (std::size_t i = 0; i < n; ++i) {
    float* gr = g + i * m;
    float* er = Residual ? e + i * m : e;  // e may be null without Residual: no offset on null (UB)
    const float* mr = Residual ? src + i * m : src;
    const float* pi = p + i;
    std::size_t j = 0;
#if COMMPACT_HOST_SIMD
    if constexpr (R > 0) {
      simd::vf pv[cap];
      COMMPACT_UNROLL
      for (std::size_t c = 0; c < cap; ++c) pv[c] = simd::vf{} + pi[c * n];
      for (; j + simd::lanes <= m; j += simd::lanes) {
        const simd::vf a = approx_at<R>(pv, q, m, rr, j);
        if constexpr (Residual) simd::store(er + j, simd::load<simd::vf>(mr + j) - a);
        simd::store(gr + j, a);
      }
    }
#endif
    for (; j < m; ++j) {
      float a = q[j] * pi[0];
      simd::opaque(a);
      for (std::size_t c = 1; c < rr; ++c) {
        float t = q[c * m + j] * pi[c * n];
        simd::opaque(t);
        a += t;
      }
      if constexpr (Residual) er[j] = mr[j] - a;
      gr[j] = a;
    }
  }
}

template <bool Residual>
inline void approx_dispatch(float* g, const float* src, float* e, std::size_t n, std::size_t m, const float* p,
                            const float* q, std::size_t r) noexcept {
  switch (r) {
    case 1: approx_rows<1, Residual>(g, src, e, n, m, p, q, r); break;
    case 2: approx_rows<2, Residual>(g, src, e, n, m, p, q, r); break;
    case 3: approx_rows<3, Residual>(g, src, e, n, m, p, q, r); break;
    case 4: approx_rows<4, Residual>(g, src, e, n, m, p, q, r); break;
    case 5: approx_rows<5, Residual>(g, src, e, n, m, p, q, r); break;
    case 6: approx_rows<6, Residual>(g, src, e, n, m, p, q, r); break;
    case 7: approx_rows<7, Residual>(g, src, e, n, m, p, q, r); break;
    case 8: approx_rows<8, Residual>(g, src, e, n, m, p, q, r); break;
    default: approx_rows<0, Residual>(g, src, e, n, m, p, q, r); break;  // r > 8: scalar loop
  }
}

}  // namespace detail

//! P = M Q: M row-major n x m, Q column-major m x r, P column-major n x r (written).
inline void lowrank_project(std::span<const float> M, std::size_t n, std::size_t m, std::span<const float> Q,
                            std::size_t r, std::span<float> P) {
  detail::check_lowrank("lowrank_project", M.size(), n, m, P.size(), Q.size(), r);
  // Without error feedback the matrix is only read (the cast serves the shared signature).
  detail::project_dispatch<false>(const_cast<float*>(M.data()), nullptr, nullptr, n, m, Q.data(), r, P.data());
}

//! Error feedback fused with the first product: g = g + e (g[k] + e[k] per element; g
//! then holds M), and P = M Q, in one pass over the rows.
inline void lowrank_project_ef(std::span<float> g, std::span<const float> e, std::size_t n, std::size_t m,
                               std::span<const float> Q, std::size_t r, std::span<float> P) {
  detail::check_lowrank("lowrank_project_ef", g.size(), n, m, P.size(), Q.size(), r);
  require(e.size() == g.size(), "commpact::host::lowrank_project_ef: the residual holds ", e.size(),
          " floats but the gradient ", g.size(), "; pass a residual of the gradient's shape.");
  simd::check_no_partial_overlap("lowrank_project_ef", "g", g.data(), g.size(), "e", e.data(), e.size());
  detail::project_dispatch<true>(g.data(), g.data(), e.data(), n, m, Q.data(), r, P.data());
}

//! The same product out of place, for a step that must leave g untouched (the space
//! form, ops<Space>::lowrank_project): M = g + e (g[k] + e[k] per element), or M = g
//! when e is empty, then P = M Q; the same bits as lowrank_project_ef / lowrank_project.
inline void lowrank_project_into(std::span<const float> g, std::span<const float> e, std::span<float> M,
                                 std::size_t n, std::size_t m, std::span<const float> Q, std::size_t r,
                                 std::span<float> P) {
  detail::check_lowrank("lowrank_project_into", g.size(), n, m, P.size(), Q.size(), r);
  require(M.size() == g.size() && (e.empty() || e.size() == g.size()),
          "commpact::host::lowrank_project_into: M holds ", M.size(), " floats and the residual ", e.size(),
          " but the gradient ", g.size(), "; pass M (and a non-empty residual) of the gradient's shape.");
  simd::check_no_partial_overlap("lowrank_project_into", "g", g.data(), g.size(), "M", M.data(), M.size());
  simd::check_no_partial_overlap("lowrank_project_into", "e", e.data(), e.size(), "M", M.data(), M.size());
  if (e.empty()) {
    if (M.data() != g.data()) std::copy(g.begin(), g.end(), M.begin());
    detail::project_dispatch<false>(M.data(), nullptr, nullptr, n, m, Q.data(), r, P.data());
  } else {
    detail::project_dispatch<true>(M.data(), g.data(), e.data(), n, m, Q.data(), r, P.data());
  }
}

//! Q = M^T P: M row-major n x m, P column-major n x r, Q column-major m x r (written).
inline void lowrank_back_project(std::span<const float> M, std::size_t n, std::size_t m, std::span<const float> P,
                                 std::size_t r, std::span<float> Q) {
  detail::check_lowrank("lowrank_back_project", M.size(), n, m, P.size(), Q.size(), r);
  for (auto& v : Q) v = 0.0f;
  // The open sums of the tree's levels below the top (none for n <= back_chunk); grown once per thread.
  thread_local std::vector<float> tmp;
  const std::size_t need = static_cast<std::size_t>(detail::back_levels(n) - 1) * std::min<std::size_t>(r, 8) * m;
  if (tmp.size() < need) tmp.resize(need);
  // Columns are independent: groups of at most 8 (more than 8 reads M again per group).
  for (std::size_t c0 = 0; c0 < r; c0 += 8) {
    const std::size_t w = r - c0 < 8 ? r - c0 : 8;
    const float* pc = P.data() + c0 * n;
    float* qc = Q.data() + c0 * m;
    switch (w) {
      case 1: detail::back_cols<1>(M.data(), n, m, pc, qc, tmp.data()); break;
      case 2: detail::back_cols<2>(M.data(), n, m, pc, qc, tmp.data()); break;
      case 3: detail::back_cols<3>(M.data(), n, m, pc, qc, tmp.data()); break;
      case 4: detail::back_cols<4>(M.data(), n, m, pc, qc, tmp.data()); break;
      case 5: detail::back_cols<5>(M.data(), n, m, pc, qc, tmp.data()); break;
      case 6: detail::back_cols<6>(M.data(), n, m, pc, qc, tmp.data()); break;
      case 7: detail::back_cols<7>(M.data(), n, m, pc, qc, tmp.data()); break;
      default: detail::back_cols<8>(M.data(), n, m, pc, qc, tmp.data()); break;
    }
  }
}

//! The approximation and the residual in one pass: with M the row-major n x m matrix in
//! g, A = P Q^T, e = M - A and g = A (e and g row-major n x m, distinct buffers).
inline void lowrank_approx_residual(std::span<float> g, std::span<float> e, std::size_t n, std::size_t m,
                                    std::span<const float> P, std::span<const float> Q, std::size_t r) {
  detail::check_lowrank("lowrank_approx_residual", g.size(), n, m, P.size(), Q.size(), r);
  require(e.size() == g.size() && (e.data() != g.data() || g.empty()),
          "commpact::host::lowrank_approx_residual: the residual must be a separate buffer of the gradient's size (",
          g.size(), " floats; got ", e.size(), (e.data() == g.data() ? ", the same buffer" : ""), ").");
  simd::check_no_partial_overlap("lowrank_approx_residual", "g", g.data(), g.size(), "e", e.data(), e.size());
  detail::approx_dispatch<true>(g.data(), g.data(), e.data(), n, m, P.data(), Q.data(), r);
}

//! The approximation with the residual in place of M (the space form,
//! ops<Space>::lowrank_approx_residual): with M the row-major n x m matrix in `me`,
//! A = P Q^T, me = M - A and g = A; the same bits as lowrank_approx_residual.
inline void lowrank_approx_residual_inplace(std::span<float> g, std::span<float> me, std::size_t n, std::size_t m,
                                            std::span<const float> P, std::span<const float> Q, std::size_t r) {
  detail::check_lowrank("lowrank_approx_residual_inplace", g.size(), n, m, P.size(), Q.size(), r);
  require(me.size() == g.size() && (me.data() != g.data() || g.empty()),
          "commpact::host::lowrank_approx_residual_inplace: M must be a separate buffer of the gradient's size (",
          g.size(), " floats; got ", me.size(), ").");
  simd::check_no_partial_overlap("lowrank_approx_residual_inplace", "g", g.data(), g.size(), "M", me.data(),
                                 me.size());
  detail::approx_dispatch<true>(g.data(), me.data(), me.data(), n, m, P.data(), Q.data(), r);
}

//! A = P Q^T only (row-major n x m), same arithmetic as lowrank_approx_residual.
inline void lowrank_approx(std::span<float> A, std::size_t n, std::size_t m, std::span<const float> P,
                           std::span<const float> Q, std::size_t r) {
  detail::check_lowrank("lowrank_approx", A.size(), n, m, P.size(), Q.size(), r);
  detail::approx_dispatch<false>(A.data(), nullptr, nullptr, n, m, P.data(), Q.data(), r);
}

}  // namespace commpact::host
