// SPDX-License-Identifier: Apache-2.0
// ops<cuda_space>'s PowerCompressor and PowerGossip rows (kernels/cuda/rows_power.cuh)
// against their host twins (ops<host_space>), bit for bit (any NaN equals any NaN: GPU
// arithmetic returns the canonical NaN), on fresh random inputs with NaN-poisoned
// outputs: check_finite, copy_if_clear, lowrank_project (with and without a residual,
// in place), lowrank_back_project, lowrank_approx_residual (status clear and not),
// orthonormalize, gaussian, redraw_zero_columns, power_gossip_orthonormalize,
// power_gossip_update (both phases, both ends, a failed round) and power_gossip_vectors;
// shapes with n = 1, m = 1, r = 1..4 and 9 (two column groups), zero and dependent
// columns, +-0, denormals and non-finite inputs (status). Then PowerCompressor<1..4,
// cuda_space> over NcclComm::single() against PowerCompressor<1..4> over a one-rank
// ThreadComm for 5 steps (output, residual and Q bits), warm start on and off; and
// PowerGossip's algorithm instantiated over NcclComm (compile check).
//
// Without a device it exits 77 (skipped); docs/cuda.md, "Status", says where it has run.

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <vector>

#include "commpact/comm/nccl_comm.hpp"
#include "commpact/comm/thread_comm.hpp"
#include "commpact/compress/compressors/power.hpp"
#include "commpact/gossip/power_gossip.hpp"
#include "commpact/kernels/cuda/ops.cuh"
#include "commpact/kernels/host/ops.hpp"
#include "cuda_test_common.cuh"
#include "instantiations.cuh"  // PowerGossip's algorithm over NcclComm, every member

namespace cp = commpact;
using commpact_test::failures;
using commpact_test::sprinkle;
using D = cp::ops<cp::cuda_space>;
using H = cp::ops<cp::host_space>;

namespace {

cp::cuda_space::exec E;
std::mt19937_64 rng(20261201);
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<float> randn(std::size_t n) {
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}
template <class T>
cp::cuda_buffer<T> dev(const std::vector<T>& h) {
  cp::cuda_buffer<T> b;
  b.resize(h.size());  // poisoned, then overwritten
  if (!h.empty()) D::from_host(E, std::span<const T>(h), b.view());
  cp::cuda_space::fence(E, cp::no_deadline());  // complete before another stream (NcclComm's) reads it
  return b;
}
template <class T>
std::vector<T> host(const cp::cuda_buffer<T>& b) {
  std::vector<T> h(b.size());
  if (!h.empty()) D::to_host(E, b.cview(), std::span<T>(h));
  cp::cuda_space::fence(E, cp::no_deadline());
  return h;
}
template <class T>
std::size_t diff(const std::vector<T>& a, const std::vector<T>& b) {
  std::size_t d = a.size() == b.size() ? 0 : 1 + a.size() + b.size();
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if constexpr (std::is_floating_point_v<T>)
      if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    d += std::memcmp(&a[i], &b[i], sizeof(T)) != 0;
  }
  return d;
}
template <class T>
std::span<T> hs(std::vector<T>& v) {
  return std::span<T>(v);
}
template <class T>
std::span<const T> hc(const std::vector<T>& v) {
  return std::span<const T>(v);
}

void check_status_rows() {
  for (std::size_t n : {1u, 1000u, 70001u})
    for (int inject = 0; inject < 4; ++inject) {
      auto v = randn(n);
      if (inject == 1) v[n / 2] = kNaN;
      if (inject == 2) v[n - 1] = -kInf;
      std::vector<std::uint32_t> st{inject == 3 ? 4u : 0u};
      auto dv = dev(v);
      auto dst = dev(st);
      H::check_finite({}, hc(v), hs(st));
      D::check_finite(E, dv.cview(), dst.view());
      EXPECT(host(dst) == st, "check_finite n=%zu inject=%d: status %u vs host %u", n, inject, host(dst)[0], st[0]);
      for (std::uint32_t w1 : {0u, 2u}) {
        std::vector<std::uint32_t> s3{0, w1, 0};
        std::vector<float> out(n, kNaN);
        auto dout = dev(out);
        auto ds3 = dev(s3);
        H::copy_if_clear({}, hc(v), hs(out), hc(s3));
        D::copy_if_clear(E, dv.cview(), dout.view(), ds3.cview());
        EXPECT(diff(host(dout), out) == 0, "copy_if_clear n=%zu word1=%u differs", n, w1);
      }
    }
}

struct shape {
  std::size_t n, m;
};
// n up to 20000: 1, 2 and 3 levels of lowrank_back_project's tree (chunks of 128 rows).
const shape kShapes[] = {{1, 1}, {1, 9}, {7, 1}, {13, 8}, {33, 17}, {100, 257}, {128, 5}, {129, 40}, {1000, 31}, {5, 3000}, {20000, 3}};

void check_lowrank_rows() {
  for (const auto [n, m] : kShapes)
    for (std::size_t r : {1u, 2u, 3u, 4u, 9u})
      for (int mode = 0; mode < 3; ++mode) {  // 0: residual; 1: no residual; 2: in place (M = g)
        auto g = randn(n * m), res = randn(n * m), q = randn(m * r);
        sprinkle(g);
        if (r > 1)
          for (std::size_t j = 0; j < m; ++j) q[m + j] = 0.0f;  // a zero column of Q
        if (n * m > 20) g[n * m / 3] = kInf;                    // non-finite input propagates alike
        std::vector<float> M(n * m, kNaN), P(n * r, kNaN);
        auto dg = dev(g), dres = dev(res), dq = dev(q), dM = dev(M), dP = dev(P);
        const bool ef = mode == 0, inplace = mode == 2;
        const auto hres = ef ? hc(res) : std::span<const float>{};
        const auto dresv = ef ? dres.cview() : cp::cuda_span<const float>{};
        if (inplace) {
          H::lowrank_project({}, hc(g), hres, hs(g), n, m, hc(q), r, hs(P));
          D::lowrank_project(E, dg.cview(), dresv, dg.view(), n, m, dq.cview(), r, dP.view());
          EXPECT(diff(host(dg), g) == 0, "project in place %zux%zu r=%zu: M differs", n, m, r);
        } else {
          H::lowrank_project({}, hc(g), hres, hs(M), n, m, hc(q), r, hs(P));
          D::lowrank_project(E, dg.cview(), dresv, dM.view(), n, m, dq.cview(), r, dP.view());
          EXPECT(diff(host(dM), M) == 0, "project %zux%zu r=%zu ef=%d: M differs", n, m, r, int(ef));
        }
        EXPECT(diff(host(dP), P) == 0, "project %zux%zu r=%zu mode=%d: P differs in %zu", n, m, r, mode,
               diff(host(dP), P));
        if (mode != 0) continue;
        // Q = M^T P on a finite M, then the approximation and residual.
        auto Mf = randn(n * m), Pf = randn(n * r);
        sprinkle(Mf);
        std::vector<float> Q(m * r, kNaN);
        auto dMf = dev(Mf), dPf = dev(Pf), dQ = dev(Q);
        H::lowrank_back_project({}, hc(Mf), n, m, hc(Pf), r, hs(Q));
        D::lowrank_back_project(E, dMf.cview(), n, m, dPf.cview(), r, dQ.view());
        EXPECT(diff(host(dQ), Q) == 0, "back_project %zux%zu r=%zu: Q differs in %zu", n, m, r, diff(host(dQ), Q));
        for (std::uint32_t w2 : {0u, 1u}) {
          std::vector<std::uint32_t> st{0, 0, w2};
          std::vector<float> out(n * m, kNaN), Mr = Mf;
          auto dout = dev(out), dMr = dev(Mr);
          auto dst = dev(st);
          H::lowrank_approx_residual({}, hs(out), hs(Mr), n, m, hc(Pf), hc(Q), r, hc(st));
          D::lowrank_approx_residual(E, dout.view(), dMr.view(), n, m, dPf.cview(), dQ.cview(), r, dst.cview());
          EXPECT(diff(host(dout), out) == 0 && diff(host(dMr), Mr) == 0,
                 "approx_residual %zux%zu r=%zu word2=%u: g or the residual differs", n, m, r, w2);
        }
      }
}

void check_orthonormalize_rows() {
  // Rows on both sides of the levels of the dot products' shape (kernels/fixed_sum.hpp).
  for (std::size_t rows : {1u, 2u, 5u, 64u, 1000u, 2048u, 2049u, 4099u})
    for (std::size_t cols = 1; cols <= 4; ++cols)
      for (int kind = 0; kind < 4; ++kind) {  // 0 random, 1 a zero column, 2 duplicate columns, 3 a NaN
        auto a = randn(rows * cols);
        if (kind == 1) std::fill(a.begin() + (cols - 1) * rows, a.end(), -0.0f);
        if (kind == 2 && cols > 1) std::copy(a.begin(), a.begin() + rows, a.begin() + rows);
        if (kind == 3) a[rows * cols / 2] = kNaN;
        auto b = a;
        auto da = dev(a), db = dev(b);
        H::orthonormalize({}, hs(a), rows, cols);
        D::orthonormalize(E, da.view(), rows, cols);
        EXPECT(diff(host(da), a) == 0, "orthonormalize %zux%zu kind %d differs", rows, cols, kind);
        const std::uint64_t seed = rng(), t = kind, step = rows;
        H::power_gossip_orthonormalize({}, hs(b), rows, cols, seed, t, step);
        D::power_gossip_orthonormalize(E, db.view(), rows, cols, seed, t, step);
        EXPECT(diff(host(db), b) == 0, "power_gossip_orthonormalize %zux%zu kind %d differs", rows, cols, kind);
        std::vector<float> q = randn(rows * cols);
        for (std::size_t c = 0; c < cols; c += 2)
          std::fill(q.begin() + c * rows, q.begin() + (c + 1) * rows, c ? -0.0f : 0.0f);
        auto dq = dev(q);
        H::redraw_zero_columns({}, hs(q), rows, cols, seed, t, step);
        D::redraw_zero_columns(E, dq.view(), rows, cols, seed, t, step);
        EXPECT(diff(host(dq), q) == 0, "redraw_zero_columns %zux%zu differs", rows, cols);
      }
  // Three levels of the dot products' shape (no redraws: a drawn value may differ in its last bit).
  for (std::size_t cols : {1u, 3u}) {
    const std::size_t rows = (std::size_t{1} << 22) + 5;
    auto a = randn(rows * cols);
    auto da = dev(a);
    H::orthonormalize({}, hs(a), rows, cols);
    D::orthonormalize(E, da.view(), rows, cols);
    EXPECT(diff(host(da), a) == 0, "orthonormalize %zux%zu differs", rows, cols);
  }
  for (std::size_t n : {1u, 2u, 3u, 1001u, 1u << 20})
    for (std::uint64_t seed : {0ull, 42ull, ~0ull}) {
      std::vector<float> v(n, kNaN);
      auto dv = dev(v);
      H::gaussian({}, hs(v), seed);
      D::gaussian(E, dv.view(), seed);
      EXPECT(diff(host(dv), v) == 0, "gaussian n=%zu seed=%llu differs in %zu (CUDA's log/sin/cos: see rows_power.cuh)",
             n, static_cast<unsigned long long>(seed), diff(host(dv), v));
    }
}

void check_gossip_rows() {
  for (const auto [n, m] : kShapes)
    for (std::size_t r : {1u, 2u, 3u, 4u})
      for (int phase = 0; phase < 2; ++phase)
        for (int variant = 0; variant < 3; ++variant) {  // 0 lower, 1 higher, 2 a failed round (lower)
          const bool lower = variant != 1;
          const std::size_t len = phase == 0 ? n : m, dl = (phase == 0 ? m : n) * r;
          auto X = randn(n * m), S = randn(len * r), mine = randn(dl), th = randn(dl);
          sprinkle(X);
          std::vector<std::byte> theirs(4 * dl);
          std::memcpy(theirs.data(), th.data(), 4 * dl);
          std::vector<float> d(dl, kNaN), upd(n * m, kNaN);
          std::vector<std::int64_t> words{variant == 2 ? 1 : 0, 0, 0};
          auto dX = dev(X), dS = dev(S), dmine = dev(mine), dd = dev(d), dupd = dev(upd);
          auto dth = dev(theirs);
          auto dw = dev(words);
          const float coef = (lower ? 1.0f : -1.0f) * 0.37f;
          H::power_gossip_update({}, hs(X), n, m, hc(S), hc(mine), hc(theirs), hs(d), r, phase, lower, coef, hs(upd),
                                 hc(words));
          D::power_gossip_update(E, dX.view(), n, m, dS.cview(), dmine.cview(), dth.cview(), dd.view(), r, phase, lower,
                                 coef, dupd.view(), dw.cview());
          EXPECT(diff(host(dX), X) == 0 && diff(host(dd), d) == 0 && diff(host(dupd), upd) == 0,
                 "power_gossip_update %zux%zu r=%zu phase %d variant %d: X, d or upd differs", n, m, r, phase, variant);
        }
  for (std::size_t len : {1u, 9u, 4097u})
    for (std::size_t nb = 0; nb <= 3; ++nb)
      for (std::int64_t w2 : {0, 2}) {
        const std::size_t offset = 4 * 5, stride = 4 * (len + 7);
        auto x = randn(len), blocks = randn(nb * (len + 7));
        std::vector<std::byte> recv(4 * blocks.size());
        if (!recv.empty()) std::memcpy(recv.data(), blocks.data(), recv.size());
        std::vector<double> w(nb), acc(len, std::nan(""));
        for (auto& v : w) v = std::uniform_real_distribution<double>(0.1, 0.4)(rng);
        std::vector<std::int64_t> words{0, static_cast<std::int64_t>(len), w2};
        auto dx = dev(x);
        auto drecv = dev(recv);
        auto dw = dev(w), dacc = dev(acc);
        auto dwords = dev(words);
        H::power_gossip_vectors({}, hs(x), hc(recv), stride, offset, hc(w), 0.31, hs(acc), hc(words));
        D::power_gossip_vectors(E, dx.view(), drecv.cview(), stride, offset, dw.cview(), 0.31, dacc.view(),
                                dwords.cview());
        EXPECT(diff(host(dx), x) == 0 && diff(host(dacc), acc) == 0,
               "power_gossip_vectors len=%zu neighbours=%zu words[2]=%lld: x or acc differs", len, nb,
               static_cast<long long>(w2));
      }
}

//! Argument errors raise invalid_argument on the host, before anything is queued.
void check_argument_errors() {
  auto a = dev(randn(12)), b = dev(randn(4)), c = dev(randn(3));
  auto st = dev(std::vector<std::uint32_t>{0});
  auto raises = [](auto f) {
    try {
      f();
    } catch (const cp::invalid_argument&) {
      return true;
    }
    return false;
  };
  EXPECT(raises([&] { D::lowrank_project(E, a.cview(), {}, a.view(), 4, 3, c.cview(), 1, c.view()); }),
         "lowrank_project with P of 3 floats for n = 4 did not raise");
  EXPECT(raises([&] { D::lowrank_back_project(E, a.cview(), 4, 3, b.cview(), 2, c.view()); }),
         "lowrank_back_project with r = 2 and 4 + 3 floats of factors did not raise");
  EXPECT(raises([&] { D::lowrank_approx_residual(E, a.view(), a.view(), 4, 3, b.cview(), c.cview(), 1, st.cview()); }),
         "lowrank_approx_residual with M the same buffer as g did not raise");
  EXPECT(raises([&] { D::orthonormalize(E, a.view(), 5, 3); }), "orthonormalize 5 x 3 on 12 floats did not raise");
  EXPECT(raises([&] { D::copy_if_clear(E, a.cview(), b.view(), st.cview()); }),
         "copy_if_clear 12 into 4 did not raise");
}

//! PowerCompressor<R, cuda_space> over one NCCL rank against PowerCompressor<R> over one
//! ThreadComm rank: output, residual and Q bits after each of 5 steps.
template <int R>
void check_compressor(bool warm) {
  const cp::tensor_layout layout = {{24, 18}, {18}, {7, 5}, {300, 40}, {1, 9}, {16, 16}, {64, 3 * 3 * 8}};
  std::size_t total = 0;
  for (const auto& s : layout) total += static_cast<std::size_t>(s.rows * s.cols);
  cp::power_options opt;
  opt.min_compression_rate = 1.0;
  opt.warm_start = warm;
  std::vector<std::vector<float>> grads(5);
  for (auto& g : grads) g = randn(total);
  std::vector<std::vector<float>> out(5), res(5), qs(5);
  cp::run_threads(1, [&](cp::ThreadComm& tc) {
    cp::PowerCompressor<R> h{cp::any_communicator(tc), layout, opt};
    for (int s = 0; s < 5; ++s) {
      out[s] = grads[s];
      h.reduce(std::span<float>(out[s]));
      for (std::size_t i = 0; i < layout.size(); ++i) {
        res[s].insert(res[s].end(), h.residual(i).begin(), h.residual(i).end());
        qs[s].insert(qs[s].end(), h.q_factor(i).begin(), h.q_factor(i).end());
      }
    }
  });
  auto nc = cp::NcclComm::single();
  cp::PowerCompressor<R, cp::cuda_space> d{cp::any_space_communicator<cp::cuda_space>(nc), layout, opt};
  const auto e = nc.exec();
  for (int s = 0; s < 5; ++s) {
    auto g = dev(grads[s]);
    d.reduce(g.view());
    std::vector<float> r, q;
    for (std::size_t i = 0; i < layout.size(); ++i) {
      for (auto [src, dst] : {std::pair{d.residual(i), &r}, std::pair{d.q_factor(i), &q}}) {
        std::vector<float> h(src.size());
        if (!h.empty()) D::to_host(e, src, std::span<float>(h));
        cp::cuda_space::fence(e, cp::no_deadline());
        dst->insert(dst->end(), h.begin(), h.end());
      }
    }
    EXPECT(diff(host(g), out[s]) == 0, "PowerCompressor<%d> warm=%d step %d: output differs in %zu", R, int(warm), s,
           diff(host(g), out[s]));
    EXPECT(diff(r, res[s]) == 0, "PowerCompressor<%d> warm=%d step %d: residual differs", R, int(warm), s);
    EXPECT(diff(q, qs[s]) == 0, "PowerCompressor<%d> warm=%d step %d: Q differs", R, int(warm), s);
  }
}

}  // namespace

int main() {
  return commpact_test::run_checks("all PowerSGD/PowerGossip row checks passed\n", "%d checks failed\n", [] {
    E = cp::cuda_space::make_exec();
    check_status_rows();
    check_lowrank_rows();
    check_orthonormalize_rows();
    check_gossip_rows();
    check_argument_errors();
    for (bool warm : {true, false}) {
      check_compressor<1>(warm);
      check_compressor<2>(warm);
      check_compressor<3>(warm);
      check_compressor<4>(warm);
    }
  });
}
