// SPDX-License-Identifier: Apache-2.0
// PowerSGD's products on cuBLAS (power_options::products = power_products::blas;
// kernels/cuda/blas.cuh) against the host's exact order, within docs/cuda.md's bound:
// - the rows lowrank_project, lowrank_back_project and lowrank_approx_residual with blas
//   against ops<host_space> on the same inputs (shapes with n = 1, m = 1, r = 1..4 and 9,
//   a 2100 x 2100 matrix whose approximation takes two scratch tiles; +-0, denormals):
//   M = g + res bit for bit, |P_blas - P_host| <= 2 gamma_m |M||Q| (and Q, A alike),
//   the residual = M - A exactly as computed, nothing written when a status word is set,
//   the same bits on a second run;
// - PowerCompressor<1..4, cuda_space> with blas over NcclComm::single() (P = 1) and
//   CudaStagedComm<ThreadComm> (P = 2, 3) against PowerCompressor<1..4> on the host for 5
//   steps: before each step the host compressor loads the device one's state, so each
//   step starts from the same residual and Q, and every output (grad, residual, Q) is
//   within the one-step bound propagated from the products' bound (docs/cuda.md),
//   elementwise from the magnitudes; the dense tensors bit for bit; every rank's grad
//   and Q bit-identical to every other rank's; a second run bit-identical to the first;
//   no reallocation after step one and no cuBLAS handle or scratch made by a step.
// The default (exact) path stays the host's bits: tests/cuda/test_cuda_rows_power.cu and
// tests/cuda/test_cuda_staged_comm.cu.
//
// Without a device it exits 77 (skipped); docs/cuda.md, "Status", says where it has run.

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <mutex>
#include <random>
#include <span>
#include <vector>

#include "commpact/comm/cuda_staged_comm.hpp"
#include "commpact/comm/nccl_comm.hpp"
#include "commpact/comm/thread_comm.hpp"
#include "commpact/compress/compressors/power.hpp"
#include "commpact/kernels/cuda/ops.cuh"
#include "commpact/kernels/host/ops.hpp"
#include "cuda_test_common.cuh"

namespace cp = commpact;
using D = cp::ops<cp::cuda_space>;
using H = cp::ops<cp::host_space>;
using SC = cp::CudaStagedComm<cp::ThreadComm>;
constexpr auto kBlas = cp::power_products::blas;

static_assert(cp::power_options{}.products == cp::power_products::exact, "the default must stay the exact order");

namespace {

// EXPECT_MT (cuda_test_common.cuh): EXPECT from the rank threads.

constexpr double u = 0x1p-24;       // float's unit roundoff
//! Per term of a sum: room for underflow, subnormals included (cuBLAS's kernels may flush
//! them to zero; a subnormal times a value below 64 is below 2^-120).
constexpr double tiny = 0x1p-120;
//! gamma_k = k u / (1 - k u) (Higham, Accuracy and Stability of Numerical Algorithms, 3.1).
double gamma(std::size_t k) { return static_cast<double>(k) * u / (1.0 - static_cast<double>(k) * u); }
//! The bound 2 gamma_k sum_l t(l) + tiny k on one element of a product whose k terms have
//! the magnitudes t(0), ..., t(k - 1) (docs/cuda.md).
template <class Terms>
double product_bound(std::size_t k, Terms t) {
  double s = 0;
  for (std::size_t l = 0; l < k; ++l) s += t(l);
  return 2 * gamma(k) * s + tiny * double(k);
}

using commpact_test::download;
using commpact_test::same;
using commpact_test::sprinkle;
using commpact_test::upload;
using commpact_test::values;

//! How many |a[i] - b[i]| > bound[i] (and a non-finite value counts); worst: the largest ratio.
std::size_t outside(const std::vector<float>& a, const std::vector<float>& b, const std::vector<double>& bound,
                    double* worst = nullptr) {
  if (a.size() != b.size() || a.size() != bound.size()) return 1 + a.size() + b.size();
  std::size_t bad = 0;
  double w = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
    if (!std::isfinite(d) || d > bound[i]) ++bad;
    if (bound[i] > 0) w = std::max(w, d / bound[i]);
  }
  if (worst) *worst = w;
  return bad;
}

// ---- the rows -------------------------------------------------------------------------

struct shape {
  std::size_t n, m;
};

void check_rows(const cp::cuda_space::exec& E) {
  std::mt19937_64 rng(20261219);
  const shape shapes[] = {{1, 1}, {1, 9}, {7, 1}, {13, 8}, {33, 17}, {100, 257}, {1000, 31}, {5, 3000}, {2100, 2100}};
  for (const auto [n, m] : shapes)
    for (std::size_t r : {1u, 2u, 3u, 4u, 9u}) {
      if (n * m > 1000000 && r != 2) continue;  // the two-tile matrix once
      for (int mode = 0; mode < 3; ++mode) {    // 0: residual; 1: no residual; 2: in place (M = g)
        auto g = values(rng(), n * m), res = values(rng(), n * m), q = values(rng(), m * r);
        sprinkle(g);
        const bool ef = mode == 0, inplace = mode == 2;
        std::vector<float> M(n * m, 0.0f), P(n * r, 0.0f);
        auto dg = upload(E, g), dres = upload(E, res), dq = upload(E, q), dM = upload(E, M), dP = upload(E, P);
        const auto hres = ef ? std::span<const float>(res) : std::span<const float>{};
        const auto dresv = ef ? dres.cview() : cp::cuda_span<const float>{};
        auto hM = inplace ? g : M;
        H::lowrank_project({}, std::span<const float>(g), hres, std::span<float>(hM), n, m, std::span<const float>(q),
                           r, std::span<float>(P));
        if (inplace) D::lowrank_project(E, dg.cview(), dresv, dg.view(), n, m, dq.cview(), r, dP.view(), kBlas);
        else D::lowrank_project(E, dg.cview(), dresv, dM.view(), n, m, dq.cview(), r, dP.view(), kBlas);
        const auto dMh = download(E, inplace ? dg.cview() : dM.cview());
        EXPECT(same(dMh, hM), "blas project %zux%zu r=%zu mode %d: M = g + res differs from the host", n, m, r, mode);
        // |P_blas - P_host| <= 2 gamma_m |M||Q|.
        std::vector<double> bp(n * r);
        for (std::size_t c = 0; c < r; ++c)
          for (std::size_t i = 0; i < n; ++i)
            bp[c * n + i] = product_bound(
                m, [&](std::size_t j) { return std::fabs(double(hM[i * m + j])) * std::fabs(double(q[c * m + j])); });
        const auto dPh = download(E, dP.cview());
        double worst = 0;
        EXPECT(outside(dPh, P, bp, &worst) == 0, "blas project %zux%zu r=%zu mode %d: P outside the bound (worst %.3g)",
               n, m, r, mode, worst);
        if (mode != 0) continue;
        // Q = M^T P.
        auto Mf = values(rng(), n * m), Pf = values(rng(), n * r);
        sprinkle(Mf);
        std::vector<float> Q(m * r, 0.0f);
        auto dMf = upload(E, Mf), dPf = upload(E, Pf), dQ = upload(E, Q);
        H::lowrank_back_project({}, std::span<const float>(Mf), n, m, std::span<const float>(Pf), r,
                                std::span<float>(Q));
        D::lowrank_back_project(E, dMf.cview(), n, m, dPf.cview(), r, dQ.view(), kBlas);
        std::vector<double> bq(m * r);
        for (std::size_t c = 0; c < r; ++c)
          for (std::size_t j = 0; j < m; ++j)
            bq[c * m + j] = product_bound(
                n, [&](std::size_t i) { return std::fabs(double(Mf[i * m + j])) * std::fabs(double(Pf[c * n + i])); });
        const auto dQh = download(E, dQ.cview());
        EXPECT(outside(dQh, Q, bq, &worst) == 0, "blas back_project %zux%zu r=%zu: Q outside the bound (worst %.3g)", n,
               m, r, worst);
        D::lowrank_back_project(E, dMf.cview(), n, m, dPf.cview(), r, dQ.view(), kBlas);
        EXPECT(same(download(E, dQ.cview()), dQh), "blas back_project %zux%zu r=%zu: a second run differs", n, m, r);
        // A = P Q^T (with the device's Q), residual M - A, gated by the status.
        for (std::uint32_t w2 : {0u, 1u}) {
          std::vector<std::uint32_t> st{0, 0, w2};
          std::vector<float> out(n * m, 7.0f), Mr = Mf;
          auto dout = upload(E, out), dMr = upload(E, Mr);
          auto dst = upload(E, st);
          H::lowrank_approx_residual({}, std::span<float>(out), std::span<float>(Mr), n, m,
                                     std::span<const float>(Pf), std::span<const float>(dQh), r,
                                     std::span<const std::uint32_t>(st));
          D::lowrank_approx_residual(E, dout.view(), dMr.view(), n, m, dPf.cview(), dQ.cview(), r, dst.cview(), kBlas);
          const auto go = download(E, dout.cview()), ge = download(E, dMr.cview());
          if (w2 != 0) {
            EXPECT(same(go, out) && same(ge, Mr), "blas approx_residual %zux%zu r=%zu: wrote with a status word set",
                   n, m, r);
            continue;
          }
          std::vector<double> ba(n * m);
          std::size_t bad_e = 0;
          for (std::size_t i = 0; i < n; ++i)
            for (std::size_t j = 0; j < m; ++j) {
              ba[i * m + j] = product_bound(r, [&](std::size_t c) {
                return std::fabs(double(Pf[c * n + i])) * std::fabs(double(dQh[c * m + j]));
              });
              // The residual is M - A, one float subtraction of what was written to g.
              const float want = Mf[i * m + j] - go[i * m + j];
              bad_e += std::memcmp(&want, &ge[i * m + j], sizeof(float)) != 0;
            }
          EXPECT(outside(go, out, ba, &worst) == 0, "blas approx %zux%zu r=%zu: A outside the bound (worst %.3g)", n, m,
                 r, worst);
          EXPECT(bad_e == 0, "blas approx %zux%zu r=%zu: the residual is not M - A in %zu places", n, m, r, bad_e);
        }
      }
    }
}

// ---- the compressor: a one-step bound, propagated ------------------------------------

//! Eigenvalues of the symmetric r x r matrix a (row-major), by cyclic Jacobi.
std::vector<double> eigenvalues(std::vector<double> a, std::size_t r) {
  for (int sweep = 0; sweep < 60; ++sweep) {
    double off = 0;
    for (std::size_t p = 0; p < r; ++p)
      for (std::size_t q = p + 1; q < r; ++q) off += a[p * r + q] * a[p * r + q];
    if (off < 1e-300) break;
    for (std::size_t p = 0; p < r; ++p)
      for (std::size_t q = p + 1; q < r; ++q) {
        if (a[p * r + q] == 0) continue;
        const double th = (a[q * r + q] - a[p * r + p]) / (2 * a[p * r + q]);
        const double t = (th >= 0 ? 1 : -1) / (std::fabs(th) + std::sqrt(th * th + 1));
        const double c = 1 / std::sqrt(t * t + 1), s = t * c;
        for (std::size_t k = 0; k < r; ++k) {  // columns p, q
          const double akp = a[k * r + p], akq = a[k * r + q];
          a[k * r + p] = c * akp - s * akq;
          a[k * r + q] = s * akp + c * akq;
        }
        for (std::size_t k = 0; k < r; ++k) {  // rows p, q
          const double apk = a[p * r + k], aqk = a[q * r + k];
          a[p * r + k] = c * apk - s * aqk;
          a[q * r + k] = s * apk + c * aqk;
        }
      }
  }
  std::vector<double> ev(r);
  for (std::size_t k = 0; k < r; ++k) ev[k] = a[k * r + k];
  return ev;
}

//! The bounds of one compressed matrix's step (docs/cuda.md): A (n x m row-major), Q
//! (m x r column-major), valid = false when P is too ill-conditioned for the first-order
//! bound (eta >= 1/8).
struct step_bound {
  std::vector<double> a, q;
  bool valid = true;
};

//! Ms: every rank's M = g + e (float, n x m row-major), Q0: the start Q (m x r).
step_bound bound_step(const std::vector<std::vector<float>>& Ms, const std::vector<float>& Q0, std::size_t n,
                      std::size_t m, std::size_t r) {
  const std::size_t R = Ms.size();
  std::vector<double> P(n * r, 0), SP(n * r, 0);
  for (const auto& M : Ms)
    for (std::size_t c = 0; c < r; ++c)
      for (std::size_t i = 0; i < n; ++i) {
        double s = 0, sa = 0;
        for (std::size_t j = 0; j < m; ++j) {
          s += double(M[i * m + j]) * double(Q0[c * m + j]);
          sa += std::fabs(double(M[i * m + j])) * std::fabs(double(Q0[c * m + j]));
        }
        P[c * n + i] += s;
        SP[c * n + i] += sa;
      }
  // |P_blas - P_host| <= 2 gamma_{m + R} sum_k |M_k||Q0| (the products, then the allreduce).
  double bpf = 0;
  for (double v : SP) bpf += std::pow(2 * gamma(m + R) * v + tiny * double(m + R), 2);
  bpf = std::sqrt(bpf);
  // sigma_min and ||P||_2 from the Gram matrix P^T P.
  std::vector<double> G(r * r, 0);
  for (std::size_t a = 0; a < r; ++a)
    for (std::size_t b = 0; b < r; ++b)
      for (std::size_t i = 0; i < n; ++i) G[a * r + b] += P[a * n + i] * P[b * n + i];
  const auto ev = eigenvalues(G, r);
  const double smin = std::sqrt(std::max(0.0, *std::min_element(ev.begin(), ev.end())));
  const double smax = std::sqrt(std::max(0.0, *std::max_element(ev.begin(), ev.end())));
  step_bound out;
  // P-hat: 4 (||dP||_F + 8 r sqrt(n) u ||P||_2) / sigma_min(P) for every entry.
  const double eta = smin > 0 ? (bpf + 8 * double(r) * std::sqrt(double(n)) * u * smax) / smin : 1.0;
  if (!(eta < 0.125)) out.valid = false;
  const double bph = 4 * eta;
  // P-hat itself (Gram-Schmidt in double) for the magnitudes.
  std::vector<double> Ph = P;
  for (std::size_t c = 0; c < r; ++c) {
    double* pc = Ph.data() + c * n;
    for (int pass = 0; pass < 2; ++pass)
      for (std::size_t k = 0; k < c; ++k) {
        const double* pk = Ph.data() + k * n;
        double d = 0;
        for (std::size_t i = 0; i < n; ++i) d += pk[i] * pc[i];
        for (std::size_t i = 0; i < n; ++i) pc[i] -= d * pk[i];
      }
    double nn = 0;
    for (std::size_t i = 0; i < n; ++i) nn += pc[i] * pc[i];
    nn = nn > 0 ? 1 / std::sqrt(nn) : 0;
    for (std::size_t i = 0; i < n; ++i) pc[i] *= nn;
  }
  // Q = (1/R) sum_k M_k^T P-hat: |dQ| <= (1/R) sum_k (|M_k|^T 1 bph + 2 gamma_{n+R+1} |M_k|^T |P-hat|).
  std::vector<double> Q(m * r, 0);
  out.q.assign(m * r, 0);
  for (const auto& M : Ms)
    for (std::size_t c = 0; c < r; ++c)
      for (std::size_t j = 0; j < m; ++j) {
        double s = 0, col = 0, sa = 0;
        for (std::size_t i = 0; i < n; ++i) {
          const double x = double(M[i * m + j]);
          s += x * Ph[c * n + i];
          col += std::fabs(x);
          sa += std::fabs(x) * (std::fabs(Ph[c * n + i]) + bph);
        }
        Q[c * m + j] += s / double(R);
        out.q[c * m + j] += (col * bph + 2 * gamma(n + R + 1) * sa + tiny * double(n + R)) / double(R);
      }
  for (std::size_t k = 0; k < m * r; ++k) out.q[k] += 2 * u * std::fabs(Q[k]);  // the mean's division
  // A = P-hat Q^T: |dA| <= bph |Q|^T + |P-hat| |dQ|^T + 2 gamma_r (|P-hat| + bph)(|Q| + |dQ|)^T.
  out.a.assign(n * m, 0);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < m; ++j) {
      double s = 0;
      for (std::size_t c = 0; c < r; ++c) {
        const double ph = std::fabs(Ph[c * n + i]), qa = std::fabs(Q[c * m + j]), dq = out.q[c * m + j];
        s += bph * (qa + dq) + ph * dq + 2 * gamma(r) * (ph + bph) * (qa + dq);
      }
      out.a[i * m + j] = s + tiny * double(r);
    }
  return out;
}

struct tensor_at {
  std::size_t off, n, m;
};

//! One rank's part of the compressor check; tc: the host ranks (also the gather).
template <int R, class Dev>
void compressor_rank(const char* name, Dev make_dev, const cp::cuda_space::exec& e, cp::ThreadComm& tc) {
  const cp::tensor_layout layout = {{24, 18}, {18}, {7, 5}, {300, 40}, {1, 9}, {16, 16}, {64, 3 * 3 * 8}};
  cp::power_options opt;
  opt.min_compression_rate = 1.0;
  opt.products = kBlas;
  const int P = tc.size(), me = tc.rank();
  constexpr int steps = 5;
  std::vector<tensor_at> at;
  std::size_t total = 0;
  for (const auto& s : layout) {
    at.push_back({total, static_cast<std::size_t>(s.rows), static_cast<std::size_t>(s.cols)});
    total += static_cast<std::size_t>(s.rows * s.cols);
  }
  auto dev = make_dev(layout, opt);
  cp::PowerCompressor<R> host{cp::any_communicator(tc), layout, opt};
  // Made by set_layout, never by a step.
  const void* handle0 = e.s->blas;
  const std::size_t scratch0 = e.scratch_allocations();
  const std::size_t scratch_bytes0 = e.scratch_bytes();
  EXPECT_MT(handle0 != nullptr, "%s rank %d: set_layout made no cuBLAS handle for products = blas", name, me);
  const auto start_q = [&](auto& c) {
    for (std::size_t i = 0; i < layout.size(); ++i)
      if (c.is_compressed(i)) c.set_q_factor(i, values(7000 + i, at[i].m * c.rank_of(i)));
  };
  start_q(dev);
  start_q(host);
  std::vector<std::vector<float>> run_out;  // grad, then every residual and Q, per step
  std::vector<std::pair<const void*, std::size_t>> sig;
  std::size_t unchecked = 0;
  for (int s = 0; s < steps; ++s) {
    if (s > 0) {  // the host starts this step from the device's residual and Q
      std::vector<std::byte> st;
      dev.save_state(st);
      host.load_state(st);
    }
    std::vector<std::vector<float>> e0(layout.size()), q0(layout.size());
    for (std::size_t i = 0; i < layout.size(); ++i) {
      e0[i] = download(e, dev.residual(i));
      q0[i] = download(e, dev.q_factor(i));
    }
    const auto g = values(1000 * s + me, total);
    auto dg = upload(e, g);
    dev.reduce(dg.view());
    const auto gd = download(e, dg.cview());
    auto gh = g;
    host.reduce(std::span<float>(gh));
    run_out.push_back(gd);
    for (std::size_t i = 0; i < layout.size(); ++i) {
      const auto [off, n, m] = at[i];
      const std::vector<float> od(gd.begin() + off, gd.begin() + off + n * m), oh(gh.begin() + off, gh.begin() + off + n * m);
      if (!dev.is_compressed(i)) {
        EXPECT_MT(same(od, oh), "%s<%d> P=%d rank %d step %d tensor %zu (dense): differs from the host", name, R, P, me,
                  s, i);
        continue;
      }
      const std::size_t r = dev.rank_of(i);
      // Every rank's M = g + e, gathered on every rank.
      std::vector<float> M(n * m), all(n * m * P);
      for (std::size_t k = 0; k < n * m; ++k) M[k] = g[off + k] + (e0[i].empty() ? 0.0f : e0[i][k]);
      tc.allgather(std::span<const float>(M), std::span<float>(all));
      std::vector<std::vector<float>> Ms(P);
      for (int k = 0; k < P; ++k) Ms[k].assign(all.begin() + k * n * m, all.begin() + (k + 1) * n * m);
      const auto b = bound_step(Ms, q0[i], n, m, r);
      const auto rd = download(e, dev.residual(i)), qd = download(e, dev.q_factor(i));
      const auto hr = host.residual(i), hq = host.q_factor(i);
      const std::vector<float> rh(hr.begin(), hr.end()), qh(hq.begin(), hq.end());
      run_out.push_back(rd);
      run_out.push_back(qd);
      // The residual is M - A, one float subtraction of the grad written, on every rank.
      std::size_t bad_e = 0;
      std::vector<double> be(n * m);
      for (std::size_t k = 0; k < n * m; ++k) {
        const float want = M[k] - od[k];
        bad_e += std::memcmp(&want, &rd[k], sizeof(float)) != 0;
        be[k] = b.a[k] * (1 + 2 * u) + 2 * u * (std::fabs(double(rd[k])) + std::fabs(double(rh[k]))) + tiny;
      }
      EXPECT_MT(bad_e == 0, "%s<%d> P=%d rank %d step %d tensor %zu: the residual is not M - grad in %zu places", name,
                R, P, me, s, i, bad_e);
      if (!b.valid) {
        ++unchecked;
        continue;
      }
      double wa = 0, we = 0, wq = 0;
      EXPECT_MT(outside(od, oh, b.a, &wa) == 0, "%s<%d> P=%d rank %d step %d tensor %zu: grad outside the bound (worst %.3g)",
                name, R, P, me, s, i, wa);
      EXPECT_MT(outside(rd, rh, be, &we) == 0,
                "%s<%d> P=%d rank %d step %d tensor %zu: residual outside the bound (worst %.3g)", name, R, P, me, s, i, we);
      EXPECT_MT(outside(qd, qh, b.q, &wq) == 0, "%s<%d> P=%d rank %d step %d tensor %zu: Q outside the bound (worst %.3g)",
                name, R, P, me, s, i, wq);
    }
    // Every rank's grad and Q bit-identical to rank 0's.
    std::vector<float> qall_mine;
    for (std::size_t i = 0; i < layout.size(); ++i) {
      const auto q = download(e, dev.q_factor(i));
      qall_mine.insert(qall_mine.end(), q.begin(), q.end());
    }
    std::vector<float> gall(gd.size() * P), qall(qall_mine.size() * P);
    tc.allgather(std::span<const float>(gd), std::span<float>(gall));
    tc.allgather(std::span<const float>(qall_mine), std::span<float>(qall));
    for (int k = 1; k < P; ++k) {
      EXPECT_MT(std::memcmp(gall.data(), gall.data() + k * gd.size(), gd.size() * 4) == 0,
                "%s<%d> P=%d step %d: rank %d's grad differs from rank 0's", name, R, P, s, k);
      EXPECT_MT(std::memcmp(qall.data(), qall.data() + k * qall_mine.size(), qall_mine.size() * 4) == 0,
                "%s<%d> P=%d step %d: rank %d's Q differs from rank 0's", name, R, P, s, k);
    }
    if (s == 1) sig = dev.workspace_signature();
    if (s > 1) EXPECT_MT(dev.workspace_signature() == sig, "%s<%d> rank %d step %d: reallocated", name, R, me, s);
    EXPECT_MT(e.s->blas == handle0 && e.scratch_allocations() == scratch0 && e.scratch_bytes() == scratch_bytes0,
              "%s<%d> rank %d step %d: a step made a cuBLAS handle or grew the scratch", name, R, me, s);
  }
  if (unchecked)
    std::printf("note: %s<%d> P=%d rank %d: %zu matrix steps too ill-conditioned for the bound (conservation "
                "checked only)\n",
                name, R, P, me, unchecked);
  // A second run from the same start: the same bits.
  auto again = make_dev(layout, opt);
  start_q(again);
  std::size_t k = 0;
  for (int s = 0; s < steps; ++s) {
    auto dg = upload(e, values(1000 * s + me, total));
    again.reduce(dg.view());
    EXPECT_MT(same(download(e, dg.cview()), run_out[k++]), "%s<%d> P=%d rank %d step %d: a second run's grad differs",
              name, R, P, me, s);
    for (std::size_t i = 0; i < layout.size(); ++i) {
      if (!again.is_compressed(i)) continue;
      EXPECT_MT(same(download(e, again.residual(i)), run_out[k]) && same(download(e, again.q_factor(i)), run_out[k + 1]),
                "%s<%d> P=%d rank %d step %d tensor %zu: a second run's residual or Q differs", name, R, P, me, s, i);
      k += 2;
    }
  }
}

template <int R>
void check_compressor() {
  cp::run_threads(1, [&](cp::ThreadComm& tc) {
    auto nc = cp::NcclComm::single();
    compressor_rank<R>(
        "NcclComm::single",
        [&](const cp::tensor_layout& l, const cp::power_options& o) {
          return cp::PowerCompressor<R, cp::cuda_space>{cp::any_space_communicator<cp::cuda_space>(nc), l, o};
        },
        nc.exec(), tc);
  });
  for (int P : {2, 3})
    cp::run_threads(P, [&](cp::ThreadComm& tc) {
      SC c{tc};
      compressor_rank<R>(
          "CudaStagedComm",
          [&](const cp::tensor_layout& l, const cp::power_options& o) {
            return cp::PowerCompressor<R, cp::cuda_space>{c, l, o};
          },
          c.exec(), tc);
    });
}

}  // namespace

int main() {
  if (!commpact_test::have_cuda_device()) return commpact_test::exit_skipped;
  try {
    check_rows(cp::cuda_space::make_exec());
    check_compressor<1>();
    check_compressor<2>();
    check_compressor<3>();
    check_compressor<4>();
  } catch (const std::exception& ex) {
    std::printf("FAILED with exception: %s\n", ex.what());
    return 1;
  }
  std::printf(commpact_test::failures == 0 ? "all PowerSGD cuBLAS checks passed\n" : "FAILED: %d checks\n",
              commpact_test::failures);
  return commpact_test::failures == 0 ? 0 : 1;
}
