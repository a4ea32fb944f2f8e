// ops<cuda_space> against ops<host_space>, row by row, on fresh random inputs with
// poisoned outputs: fill/copy/to_host/from_host, mean, mean_into, ef_accumulate, sub, add, sgd_step
// (bits and status; a NaN made by arithmetic only as a NaN), clip_scale
// (within one float ulp: the device sums squares in another order), topk_abs (bits:
// indices and values; Gaussian, tied, all-equal, +-0, denormals, +-Inf and NaN inputs;
// n from 1 to 3e6, k from 0 to n), scatter_mean, zero_delivered, and gTop-k's tree kernels
// run for P simulated ranks in lockstep (P = 1..8; frames byte for byte, meta, sets,
// scatter and residual against the host's), with a corrupted frame and a NaN gradient.
// Also checks cuda_space against the Space concept at compile time.
//
// Without a device it exits 77 (skipped); docs/cuda.md, "Status", says where it has run.
// Built by CMake (tests/cuda) and by scripts/device-check with nvcc alone.

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <span>
#include <vector>

#include "commpact/comm/tree_comm.hpp"
#include "commpact/concepts/space.hpp"
#include "commpact/kernels/cuda/ops.cuh"
#include "commpact/kernels/host/ops.hpp"
#include "commpact/space/cuda.hpp"
#include "commpact/topology/hypercube.hpp"

#include "cuda_test_common.cuh"

static_assert(commpact::diagnose_space<commpact::cuda_space>());
static_assert(!commpact::cuda_space::host_accessible);

using commpact_test::failures;
namespace cp = commpact;
using D = cp::ops<cp::cuda_space>;
using H = cp::ops<cp::host_space>;

std::size_t sparse_wire_body_offset();
namespace {

cp::cuda_space::exec E;

std::uint32_t bits(float v) {
  std::uint32_t b;
  std::memcpy(&b, &v, 4);
  return b;
}

template <class T>
void upload(cp::cuda_buffer<T>& b, const std::vector<T>& h) {
  b.resize(h.size());
  D::from_host(E, std::span<const T>(h), b.view());
}
template <class T>
std::vector<T> download(const cp::cuda_buffer<T>& b, std::size_t n = std::size_t(-1)) {
  if (n == std::size_t(-1)) n = b.size();
  std::vector<T> h(n);
  D::to_host(E, b.cview().first(n), std::span<T>(h));
  cp::cuda_space::fence(E, cp::no_deadline());
  return h;
}

template <class T>
std::size_t count_diff_bytes(const std::vector<T>& a, const std::vector<T>& b) {
  std::size_t d = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) d += std::memcmp(&a[i], &b[i], sizeof(T)) != 0;
  return d + (a.size() > b.size() ? a.size() - b.size() : b.size() - a.size());
}

//! As count_diff_bytes, but any NaN equals any NaN (GPU arithmetic returns the canonical
//! NaN where x86 keeps the operand's payload; ops.cuh says so).
std::size_t count_diff_nan(const std::vector<float>& a, const std::vector<float>& b) {
  std::size_t d = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i)
    d += !(bits(a[i]) == bits(b[i]) || (std::isnan(a[i]) && std::isnan(b[i])));
  return d + (a.size() > b.size() ? a.size() - b.size() : b.size() - a.size());
}

void check_table_ef(std::mt19937_64& rng) {
  std::normal_distribution<float> d;
  const std::size_t n = 70001;
  for (float m : {0.0f, 0.9f})
    for (bool scaled : {false, true})
      for (bool inject : {false, true}) {
        std::vector<float> r(n), g(n), u(n), acc(n, 1.0f), un(n, 1.0f), sc{0.37f};
        for (auto* v : {&r, &g, &u})
          for (auto& x : *v) x = d(rng);
        if (inject) g[n - 5] = std::numeric_limits<float>::infinity();
        cp::cuda_buffer<float> dr, dg, du, dacc, dun, dsc;
        cp::cuda_buffer<std::uint32_t> st;
        upload(dr, r), upload(dg, g), upload(du, u), upload(dsc, sc), upload(st, std::vector<std::uint32_t>{0});
        dacc.resize(n), dun.resize(n);
        std::vector<std::uint32_t> hs{0};
        const auto hsc = scaled ? std::span<const float>(sc) : std::span<const float>{};
        H::ef_accumulate({}, std::span<float>(acc), std::span<float>(un), std::span<const float>(u),
                         std::span<const float>(r), std::span<const float>(g), m, hsc, std::span<std::uint32_t>(hs));
        D::ef_accumulate(E, dacc.view(), dun.view(), du.cview(), dr.cview(), dg.cview(), m,
                         scaled ? dsc.cview() : cp::cuda_span<const float>{}, st.view());
        EXPECT(count_diff_nan(download(dacc), acc) == 0, "ef_accumulate m=%g scaled=%d: acc differs", m, int(scaled));
        if (m > 0) EXPECT(count_diff_nan(download(dun), un) == 0, "ef_accumulate m=%g: u_next differs", m);
        EXPECT(download(st)[0] == hs[0], "ef_accumulate status %u vs host %u", download(st)[0], hs[0]);
      }
  // sub and mean_into (with and without a non-finite source)
  std::vector<float> y(5003), x(5003);
  for (auto& v : y) v = d(rng);
  for (auto& v : x) v = d(rng);
  cp::cuda_buffer<float> dy, dx;
  upload(dy, y), upload(dx, x);
  D::sub(E, dy.view(), dx.cview());
  H::sub({}, std::span<float>(y), std::span<const float>(x));
  EXPECT(count_diff_bytes(download(dy), y) == 0, "sub differs from the host");
  // add and sgd_step (DataParallel and Sgd over a space)
  D::add(E, dy.view(), dx.cview());
  H::add({}, std::span<float>(y), std::span<const float>(x));
  EXPECT(count_diff_bytes(download(dy), y) == 0, "add differs from the host");
  for (float mu : {0.0f, 0.9f}) {
    std::vector<float> v(mu > 0 ? y.size() : 0);
    for (auto& e : v) e = d(rng);
    cp::cuda_buffer<float> dv;
    upload(dv, v);
    for (int it = 0; it < 3; ++it) {
      D::sgd_step(E, dy.view(), dv.view(), dx.cview(), 0.05f, mu, 1e-2f);
      H::sgd_step({}, std::span<float>(y), std::span<float>(v), std::span<const float>(x), 0.05f, mu, 1e-2f);
    }
    EXPECT(count_diff_bytes(download(dy), y) == 0, "sgd_step (mu=%g) x differs from the host", mu);
    EXPECT(count_diff_bytes(download(dv), v) == 0, "sgd_step (mu=%g) v differs from the host", mu);
  }
  for (bool inject : {false, true}) {
    std::vector<float> src = x, dst(x.size(), 4.0f);
    if (inject) src[17] = std::numeric_limits<float>::quiet_NaN();
    cp::cuda_buffer<float> ds, dd;
    cp::cuda_buffer<std::uint32_t> st;
    upload(ds, src), upload(dd, dst), upload(st, std::vector<std::uint32_t>{0});
    std::vector<std::uint32_t> hs{0};
    H::mean_into({}, std::span<const float>(src), std::span<float>(dst), 6, std::span<std::uint32_t>(hs));
    D::mean_into(E, ds.cview(), dd.view(), 6, st.view());
    EXPECT(count_diff_bytes(download(dd), dst) == 0, "mean_into (inject=%d) differs from the host", int(inject));
    EXPECT(download(st)[0] == hs[0], "mean_into status %u vs host %u", download(st)[0], hs[0]);
  }
}

void check_basic(std::mt19937_64& rng) {
  std::normal_distribution<float> d;
  std::vector<float> h(12345);
  for (auto& v : h) v = d(rng);
  cp::cuda_buffer<float> a, b;
  upload(a, h);
  b.resize(h.size());
  D::copy(E, a.cview(), b.view());
  EXPECT(count_diff_bytes(download(b), h) == 0, "copy/from_host/to_host round trip differs");
  D::fill(E, b.view(), 2.5f);
  const auto f = download(b);
  EXPECT(std::all_of(f.begin(), f.end(), [](float v) { return v == 2.5f; }), "fill");
}

void check_mean(std::mt19937_64& rng) {
  for (int P : {1, 3, 7, 64}) {
    for (bool inject : {false, true}) {
      std::normal_distribution<float> d(0.0f, 100.0f);
      std::vector<float> h(100003);
      for (auto& v : h) v = d(rng);
      if (inject) h[777] = std::numeric_limits<float>::infinity();
      cp::cuda_buffer<float> dv;
      cp::cuda_buffer<std::uint32_t> st;
      upload(dv, h);
      upload(st, std::vector<std::uint32_t>{0});
      D::mean(E, dv.view(), P, st.view());
      std::vector<std::uint32_t> hs{0};
      H::mean({}, std::span<float>(h), P, std::span<std::uint32_t>(hs));
      EXPECT(count_diff_bytes(download(dv), h) == 0, "mean P=%d differs from the host", P);
      EXPECT(download(st)[0] == hs[0], "mean P=%d status %u vs host %u", P, download(st)[0], hs[0]);
    }
  }
}

// Sizes on both sides of each level of kernels/fixed_sum.hpp's shape (1, 2 and 3 levels).
//! frame_gate against the host row: clean headers, then one word of one rank's header
//! changed at random (a flag, the magic, the payload, n, the step...), many times.
void check_frame_gate(std::mt19937_64& rng) {
  const std::size_t bw = 20;
  for (int trial = 0; trial < 200; ++trial) {
    const std::size_t P = 1 + rng() % 6;
    std::vector<float> b(P * bw, 0.0f);
    for (std::size_t r = 0; r < P; ++r)
      cp::frame::write(std::as_writable_bytes(std::span<float>(b).subspan(r * bw, 12)),
                       cp::frame::header{.payload = 16, .n = 64, .agreement = 5, .step = 3, .capacity = 80});
    if (trial % 4 != 0) {
      const std::size_t at = (rng() % P) * bw + rng() % 12;
      const std::uint32_t v = trial % 3 ? 1u : static_cast<std::uint32_t>(rng());
      std::uint32_t w;
      std::memcpy(&w, &b[at], 4);
      w ^= v ? v : 1u;
      std::memcpy(&b[at], &w, 4);
    }
    std::vector<float> sum(7, 2.0f);
    std::vector<std::uint32_t> hs(1, 0u);
    H::frame_gate({}, std::span<const float>(b), bw, std::span<float>(sum), std::span<std::uint32_t>(hs));
    cp::cuda_buffer<float> db, ds;
    cp::cuda_buffer<std::uint32_t> st;
    upload(db, b), upload(ds, std::vector<float>(7, 2.0f)), upload(st, std::vector<std::uint32_t>(1, 0u));
    D::frame_gate(E, db.cview(), bw, ds.view(), st.view());
    EXPECT(download(st)[0] == hs[0], "frame_gate trial %d: status %u vs host %u", trial, download(st)[0], hs[0]);
    EXPECT(count_diff_nan(download(ds), sum) == 0, "frame_gate trial %d: sum differs from the host", trial);
  }
}

void check_clip(std::mt19937_64& rng) {
  for (std::size_t n : {std::size_t{1}, std::size_t{2048}, std::size_t{2049}, std::size_t{1} << 18,
                        (std::size_t{1} << 22) + 3})
    for (float clip : {0.0f, 0.5f, 1e6f}) {
      std::normal_distribution<float> d;
      std::vector<float> h(n);
      for (auto& v : h) v = d(rng);
      cp::cuda_buffer<float> g, s;
      upload(g, h);
      s.resize(1);
      D::clip_scale(E, g.cview(), clip, 4, s.view());
      std::vector<float> hs(1);
      H::clip_scale({}, std::span<const float>(h), clip, 4, std::span<float>(hs));
      const float ds = download(s)[0];
      EXPECT(bits(ds) == bits(hs[0]), "clip_scale(n=%zu, clip=%g): device %a vs host %a", n, clip, ds, hs[0]);
    }
}

void check_topk_one(const char* what, const std::vector<float>& x, std::size_t k, D::topk_workspace& ws) {
  cp::cuda_buffer<float> dx, dval;
  cp::cuda_buffer<std::int32_t> didx;
  upload(dx, x);
  didx.resize(k);  // poisoned (0xFF)
  dval.resize(k);
  D::topk_abs(E, dx.cview(), k, didx.view(), dval.view(), ws);
  std::vector<std::int32_t> hi(k);
  std::vector<float> hv(k);
  cp::host::topk_workspace hws;
  H::topk_abs({}, std::span<const float>(x), k, std::span<std::int32_t>(hi), std::span<float>(hv), hws);
  const auto gi = download(didx);
  const auto gv = download(dval);
  const std::size_t bi = count_diff_bytes(gi, hi), bv = count_diff_bytes(gv, hv);
  EXPECT(bi == 0 && bv == 0, "topk %s n=%zu k=%zu: %zu indices and %zu values differ from the host", what, x.size(), k,
         bi, bv);
}

void check_topk(std::mt19937_64& rng) {
  D::topk_workspace ws;
  for (std::size_t n : {std::size_t{1}, std::size_t{2}, std::size_t{17}, std::size_t{1000}, std::size_t{65537},
                        std::size_t{1} << 20, std::size_t{3000017}}) {
    std::normal_distribution<float> d;
    std::vector<std::size_t> ks = {0, 1, n, n > 1 ? n - 1 : 1, std::uniform_int_distribution<std::size_t>(0, n)(rng)};
    if (n >= 1000) ks.insert(ks.end(), {n / 1000, n / 100, n / 2});
    std::vector<float> x(n);
    for (auto& v : x) v = d(rng);
    for (auto k : ks) check_topk_one("gaussian", x, k, ws);
    for (auto& v : x) v = std::round(d(rng) * 2.0f) * 0.5f;  // many ties, +-0
    for (std::size_t i = 0; i < n; i += 101) x[i] = (i % 2) ? std::numeric_limits<float>::infinity() : -0.0f;
    x[n / 2] = std::numeric_limits<float>::quiet_NaN();
    for (auto k : ks) check_topk_one("tied+inf+nan", x, k, ws);
    std::fill(x.begin(), x.end(), -3.0f);  // all equal
    for (auto k : ks) check_topk_one("all-equal", x, k, ws);
    std::uniform_int_distribution<std::uint32_t> den(0, 0x007fffffu);
    for (auto& v : x) {
      std::uint32_t b = den(rng) | ((rng() & 1u) << 31);
      std::memcpy(&v, &b, 4);
    }
    for (auto k : ks) check_topk_one("denormal", x, k, ws);
  }
  {  // n = 1e8 (the largest size the benchmarks use): Gaussian and tied values, k = 1, 0.1 %, 1 % and n
    const std::size_t n = 100000000;
    std::normal_distribution<float> d;
    std::vector<float> x(n);
    for (auto& v : x) v = d(rng);
    for (std::size_t k : {std::size_t{1}, n / 1000, n / 100, n}) check_topk_one("gaussian 1e8", x, k, ws);
    for (auto& v : x) v = std::round(d(rng) * 4.0f) * 0.25f;  // about 30 distinct magnitudes: ties at the k-th
    for (std::size_t k : {n / 1000, n / 100}) check_topk_one("tied 1e8", x, k, ws);
  }
  // No allocation after the first call of a size.
  std::vector<float> x(1 << 16, 1.0f);
  check_topk_one("reuse", x, 100, ws);
  const auto a = ws.allocations();
  check_topk_one("reuse", x, 100, ws);
  EXPECT(ws.allocations() == a, "the top-k workspace allocated again for the same size");
}

void check_scatter(std::mt19937_64& rng) {
  const std::size_t n = 50000, k = 731;
  std::vector<std::int32_t> idx(n);
  for (std::size_t i = 0; i < n; ++i) idx[i] = static_cast<std::int32_t>(i);
  std::shuffle(idx.begin(), idx.end(), rng);
  idx.resize(k);
  std::sort(idx.begin(), idx.end());
  std::normal_distribution<float> d;
  std::vector<float> val(k), res(n), vel(n);
  for (auto& v : val) v = d(rng);
  for (auto& v : res) v = d(rng);
  for (auto& v : vel) v = d(rng);
  std::vector<std::uint8_t> alive(k);
  for (auto& a : alive) a = rng() & 1u;
  cp::cuda_buffer<float> out, dval, dres, dvel;
  cp::cuda_buffer<std::int32_t> didx;
  cp::cuda_buffer<std::uint8_t> dalive;
  out.resize(n);
  upload(dval, val), upload(didx, idx), upload(dres, res), upload(dvel, vel), upload(dalive, alive);
  D::scatter_mean(E, out.view(), didx.cview(), dval.cview(), 3);
  std::vector<float> hout(n, 7.0f);
  H::scatter_mean({}, std::span<float>(hout), std::span<const std::int32_t>(idx), std::span<const float>(val), 3);
  EXPECT(count_diff_bytes(download(out), hout) == 0, "scatter_mean differs from the host");
  D::zero_delivered(E, dres.view(), dvel.view(), didx.cview(), dalive.cview());
  H::zero_delivered({}, std::span<float>(res), std::span<float>(vel), std::span<const std::int32_t>(idx),
                    std::span<const std::uint8_t>(alive));
  EXPECT(count_diff_bytes(download(dres), res) == 0, "zero_delivered (residual) differs from the host");
  EXPECT(count_diff_bytes(download(dvel), vel) == 0, "zero_delivered (velocity) differs from the host");
}

// ---- the sparse merge (cub::DeviceMerge + ReduceByKey + select) against the host's ----
//! A strictly increasing set of m indices below n with values; `share` of them drawn from
//! `from` (the partner's set), so that equal indices meet; some values are the negation
//! of the partner's (they sum to zero) and some repeat a magnitude (ties).
void random_set(std::size_t m, std::int32_t n, const std::vector<std::int32_t>& from, const std::vector<float>& fromv,
                double share, std::vector<std::int32_t>& idx, std::vector<float>& val, std::mt19937_64& rng) {
  std::set<std::int32_t> s;
  std::bernoulli_distribution take(share);
  for (std::size_t j = 0; j < from.size() && s.size() < m; ++j)
    if (take(rng)) s.insert(from[j]);
  std::uniform_int_distribution<std::int32_t> u(0, n - 1);
  while (s.size() < m) s.insert(u(rng));
  idx.assign(s.begin(), s.end());
  std::normal_distribution<float> d;
  std::uniform_int_distribution<int> kind(0, 9);
  val.resize(m);
  for (std::size_t j = 0; j < m; ++j) {
    const auto it = std::lower_bound(from.begin(), from.end(), idx[j]);
    const int c = kind(rng);
    if (it != from.end() && *it == idx[j] && c == 0) val[j] = -fromv[it - from.begin()];  // sums to zero
    else if (c == 1) val[j] = 0.5f;                                                        // a tie
    else val[j] = d(rng);
  }
}

void check_merge(std::mt19937_64& rng) {
  namespace ck = cp::cuda_kernels;
  D::merge_workspace dmws;
  cp::host::merge_workspace hmws;
  struct shape {
    std::uint32_t cap, na, nb, k;
    bool gate;
  };
  const shape shapes[] = {{1, 1, 1, 1, true},       {1, 0, 1, 1, true},         {1, 0, 0, 1, true},
                          {37, 37, 37, 37, true},   {37, 20, 37, 37, true},     {37, 3, 5, 37, true},
                          {37, 37, 37, 10, true},   {1000, 1000, 1000, 1000, true}, {1000, 999, 400, 1000, true},
                          {1000, 1000, 1000, 1, true}, {1000, 1000, 1000, 1000, false}, {4096, 4000, 4096, 4096, true}};
  for (const shape& sh : shapes)
    for (const double share : {0.0, 0.5, 1.0}) {
      std::vector<std::int32_t> ia, ib;
      std::vector<float> va, vb;
      const std::int32_t n = static_cast<std::int32_t>(4 * sh.cap + 10);
      random_set(sh.na, n, {}, {}, 0.0, ia, va, rng);
      random_set(sh.nb, n, ia, va, share, ib, vb, rng);
      // Host: the live sets (none when the gate is shut).
      std::vector<std::int32_t> hio(sh.k);
      std::vector<float> hvo(sh.k);
      const std::size_t hm =
          sh.gate ? cp::host::sparse_merge_topk(ia, va, ib, vb, sh.k, hio, hvo, hmws) : std::size_t{0};
      hio.resize(hm), hvo.resize(hm);
      // Device: the sets fill buffers of the capacity, the rest garbage the merge must ignore.
      std::vector<std::int32_t> pa(sh.cap, -7), pb(sh.cap, 3);
      std::vector<float> pva(sh.cap, 1e30f), pvb(sh.cap, -1e30f);
      std::copy(ia.begin(), ia.end(), pa.begin()), std::copy(va.begin(), va.end(), pva.begin());
      std::copy(ib.begin(), ib.end(), pb.begin()), std::copy(vb.begin(), vb.end(), pvb.begin());
      cp::cuda_buffer<std::int32_t> dia, dib, dio;
      cp::cuda_buffer<float> dva, dvb, dvo;
      cp::cuda_buffer<std::uint32_t> dn;
      upload(dia, pa), upload(dib, pb), upload(dva, pva), upload(dvb, pvb);
      upload(dn, std::vector<std::uint32_t>{sh.na, sh.nb, sh.gate ? 1u : 0u});
      dio.resize(sh.k), dvo.resize(sh.k);
      ck::merge_scratch& ms = dmws.get(sh.cap, E);
      std::uint32_t* out = nullptr;
      const std::uint32_t* np = cp::cuda_access::ptr(dn.view());
      const cudaError_t err = ck::sparse_merge_topk(
          ms, cp::cuda_access::ptr(dia.view()), cp::cuda_access::ptr(dva.view()), np,
          cp::cuda_access::ptr(dib.view()), cp::cuda_access::ptr(dvb.view()), np + 1, sh.k,
          cp::cuda_access::ptr(dio.view()), cp::cuda_access::ptr(dvo.view()), out, E.stream(), np + 2);
      EXPECT(err == cudaSuccess, "sparse_merge_topk: %s", cudaGetErrorString(err));
      std::uint32_t dm = 0;
      EXPECT(cudaMemcpyAsync(&dm, out, 4, cudaMemcpyDeviceToHost, E.stream()) == cudaSuccess, "count copy");
      cp::cuda_space::fence(E, cp::no_deadline());
      EXPECT(dm == hm, "merge cap %u (%u + %u, k %u, share %.1f, gate %d): %u entries, the host %zu", sh.cap, sh.na,
             sh.nb, sh.k, share, int(sh.gate), dm, hm);
      if (dm == hm) {
        EXPECT(count_diff_bytes(download(dio, hm), hio) == 0, "merge cap %u k %u share %.1f: the indices differ",
               sh.cap, sh.k, share);
        EXPECT(count_diff_bytes(download(dvo, hm), hvo) == 0, "merge cap %u k %u share %.1f: the values differ",
               sh.cap, sh.k, share);
      }
    }
}

// ---- gTop-k's tree kernels over P simulated ranks -------------------------------------
struct rank_state {
  // host
  std::vector<std::int32_t> hi[5];
  std::vector<float> hv[3];
  std::vector<std::uint8_t> ha[3];
  cp::host_tree_views hb;
  cp::sparse_tree_meta hm{};
  std::vector<float> hacc, hun, hres, hvel, hg;
  std::vector<std::byte> hsend, hrecv;
  cp::host::topk_workspace hws;
  cp::host::merge_workspace hmws;
  // device
  cp::cuda_buffer<std::int32_t> di[5];
  cp::cuda_buffer<float> dv[3];
  cp::cuda_buffer<std::uint8_t> da[3];
  D::tree_views db;
  cp::cuda_buffer<cp::sparse_tree_meta> dm;
  cp::cuda_buffer<float> dacc, dun, dres, dvel, dg, dscale;
  cp::cuda_buffer<std::byte> dsend, drecv;
  D::topk_workspace dws;
  D::merge_workspace dmws;

  void size(std::size_t kc, std::size_t fb) {
    for (auto& v : hi) v.assign(kc, 0);
    for (auto& v : hv) v.assign(kc, 0.0f);
    for (auto& v : ha) v.assign(kc, 0);
    hb = {hi[0], hi[1], hi[2], hi[3], hi[4], hv[0], hv[1], hv[2], ha[0], ha[1], ha[2]};
    for (auto& v : di) v.resize(kc);
    for (auto& v : dv) v.resize(kc);
    for (auto& v : da) v.resize(kc);
    db = {di[0].view(), di[1].view(), di[2].view(), di[3].view(), di[4].view(), dv[0].view(),
          dv[1].view(), dv[2].view(), da[0].view(), da[1].view(), da[2].view()};
    dm.resize(1);
    hsend.assign(fb, std::byte{0}), hrecv.assign(fb, std::byte{0});
    dsend.resize(fb), drecv.resize(fb);
  }
};

bool same_meta(const cp::sparse_tree_meta& a, const cp::sparse_tree_meta& b) {
  return a.cur.flags == b.cur.flags && a.cur.n_min == b.cur.n_min && a.cur.n_max == b.cur.n_max &&
         a.cur.k_min == b.cur.k_min && a.cur.k_max == b.cur.k_max && a.cur_count == b.cur_count &&
         a.mine_count == b.mine_count && a.extra_count == b.extra_count && a.status == b.status &&
         a.wire_peer == b.wire_peer && a.n == b.n && a.k == b.k;
}

//! One gTop-k step on P simulated ranks, host and device side by side. corrupt: the rank
//! whose first received frame gets a flipped byte (-1: none); nan_rank: a NaN in its g.
void check_tree(int P, std::size_t n, std::size_t k, bool momentum, bool with_residual, int corrupt, int nan_rank,
                std::mt19937_64& rng) {
  const cp::Hypercube cube(P);
  std::vector<rank_state> R(P);
  const std::size_t fb = cp::sparse_tree_frame_bytes(k, true);
  std::normal_distribution<float> d;
  for (int r = 0; r < P; ++r) {
    auto& s = R[r];
    s.size(k, fb);
    s.hg.resize(n);
    for (auto& v : s.hg) v = d(rng);
    // sparse-ish gradients with repeated indices across ranks: some exact ties and sums
    for (std::size_t i = 0; i < n; i += 7) s.hg[i] = std::round(s.hg[i]);
    if (r == nan_rank) s.hg[n / 3] = std::numeric_limits<float>::quiet_NaN();
    if (with_residual) {
      s.hres.resize(n);
      for (auto& v : s.hres) v = 0.1f * d(rng);
    }
    if (momentum && with_residual) {
      s.hvel.resize(n);
      for (auto& v : s.hvel) v = 0.1f * d(rng);
    }
    s.hacc.assign(n, 0.0f);
    if (momentum) s.hun.assign(n, 0.0f);
    upload(s.dg, s.hg);
    upload(s.dres, s.hres);
    upload(s.dvel, s.hvel);
    s.dacc.resize(n);
    if (momentum) s.dun.resize(n);
    // local
    H::tree_local({}, std::span<cp::sparse_tree_meta>(&s.hm, 1), std::int64_t(n), std::int64_t(k), 0, s.hacc, s.hun,
                  s.hres, s.hvel, s.hg, 0.9f, {}, s.hb, s.hws);
    D::tree_local(E, s.dm.view(), std::int64_t(n), std::int64_t(k), 0, s.dacc.view(),
                  momentum ? s.dun.view() : cp::cuda_span<float>{}, s.dres.cview(), s.dvel.cview(), s.dg.cview(), 0.9f,
                  {}, s.db, s.dws);
    EXPECT(count_diff_nan(download(s.dacc), s.hacc) == 0, "P=%d rank %d: acc differs", P, r);
  }
  // The schedule in phases: fold, exchange rounds, unfold; senders' payloads first.
  const int phases = cube.rounds() + 2;
  std::vector<std::vector<cp::tree_step>> steps(P);
  for (int r = 0; r < P; ++r) steps[r] = cp::tree_schedule(cube, r);
  auto phase_of = [&](const cp::tree_step& s) {
    if (s.stage == cp::tree_stage::fold_send || s.stage == cp::tree_stage::fold_recv) return 0;
    if (s.stage == cp::tree_stage::exchange) return 1 + s.round;
    return phases - 1;
  };
  bool corrupted = false;
  for (int ph = 0; ph < phases; ++ph) {
    std::vector<const cp::tree_step*> now(P, nullptr);
    for (int r = 0; r < P; ++r)
      for (const auto& s : steps[r])
        if (phase_of(s) == ph) now[r] = &s;
    auto fbytes = [&](const cp::tree_step& s) {
      const bool unfold = s.stage == cp::tree_stage::unfold_send || s.stage == cp::tree_stage::unfold_recv;
      return cp::sparse_tree_frame_bytes(k, unfold);
    };
    for (int r = 0; r < P; ++r) {
      if (!now[r] || !now[r]->sends()) continue;
      auto& s = R[r];
      const std::size_t b = fbytes(*now[r]);
      H::tree_payload({}, std::span<const cp::sparse_tree_meta>(&s.hm, 1), now[r]->stage,
                      std::span<std::byte>(s.hsend).first(b), s.hb);
      D::tree_payload(E, cp::cuda_span<const cp::sparse_tree_meta>(s.dm.view()), now[r]->stage, s.dsend.view().first(b),
                      s.db);
      auto got = download(s.dsend, b);
      EXPECT(count_diff_bytes(got, std::vector<std::byte>(s.hsend.begin(), s.hsend.begin() + b)) == 0,
             "P=%d rank %d phase %d: the device frame differs from the host's", P, r, ph);
    }
    for (int r = 0; r < P; ++r) {
      if (!now[r] || !now[r]->receives()) continue;
      auto& s = R[r];
      const auto& st = *now[r];
      const std::size_t b = fbytes(st);
      auto& src = R[st.peer];
      std::copy_n(src.hsend.begin(), b, s.hrecv.begin());
      if (r == corrupt && !corrupted) {
        s.hrecv[sparse_wire_body_offset()] ^= std::byte{0x40};
        corrupted = true;
      }
      D::from_host(E, std::span<const std::byte>(s.hrecv).first(b), s.drecv.view().first(b));
      H::tree_absorb({}, std::span<cp::sparse_tree_meta>(&s.hm, 1), st.stage, r < st.peer, st.peer,
                     std::span<const std::byte>(s.hrecv).first(b), s.hb, s.hmws);
      D::tree_absorb(E, s.dm.view(), st.stage, r < st.peer, st.peer, cp::cuda_span<const std::byte>(s.drecv.view().first(b)),
                     s.db, s.dmws);
      const auto dmeta = download(s.dm)[0];
      EXPECT(same_meta(dmeta, s.hm), "P=%d rank %d phase %d: meta differs (count %u vs %u, status %u vs %u, flags %u vs %u)",
             P, r, ph, dmeta.cur_count, s.hm.cur_count, dmeta.status, s.hm.status, dmeta.cur.flags, s.hm.cur.flags);
    }
  }
  for (int r = 0; r < P; ++r) {
    auto& s = R[r];
    const auto dmeta = download(s.dm)[0];
    EXPECT(same_meta(dmeta, s.hm), "P=%d rank %d: final meta differs", P, r);
    const std::size_t c = s.hm.cur_count;
    auto di = download(s.di[1], c);
    auto dv = download(s.dv[0], c);
    EXPECT(count_diff_bytes(di, std::vector<std::int32_t>(s.hi[1].begin(), s.hi[1].begin() + c)) == 0 &&
               count_diff_bytes(dv, std::vector<float>(s.hv[0].begin(), s.hv[0].begin() + c)) == 0,
           "P=%d rank %d: the global set differs", P, r);
    const std::size_t mc = s.hm.mine_count;
    auto dal = download(s.da[0], mc);
    EXPECT(count_diff_bytes(dal, std::vector<std::uint8_t>(s.ha[0].begin(), s.ha[0].begin() + mc)) == 0,
           "P=%d rank %d: the alive flags differ", P, r);
    // scatter into a poisoned output, then the residual commit
    std::vector<float> hout(n, 5.0f);
    cp::cuda_buffer<float> dout;
    upload(dout, hout);
    H::tree_scatter({}, std::span<const cp::sparse_tree_meta>(&s.hm, 1), std::span<float>(hout), s.hb, P);
    D::tree_scatter(E, cp::cuda_span<const cp::sparse_tree_meta>(s.dm.view()), dout.view(), s.db, P);
    EXPECT(count_diff_bytes(download(dout), hout) == 0, "P=%d rank %d: tree_scatter differs", P, r);
    std::vector<float> hvel2 = momentum ? s.hun : std::vector<float>{};
    H::tree_zero_delivered({}, std::span<const cp::sparse_tree_meta>(&s.hm, 1), std::span<float>(s.hacc),
                           std::span<float>(hvel2), s.hb);
    D::tree_zero_delivered(E, cp::cuda_span<const cp::sparse_tree_meta>(s.dm.view()), s.dacc.view(),
                           momentum ? s.dun.view() : cp::cuda_span<float>{}, s.db);
    EXPECT(count_diff_nan(download(s.dacc), s.hacc) == 0, "P=%d rank %d: the residual after the commit differs", P, r);
    if (momentum) EXPECT(count_diff_nan(download(s.dun), hvel2) == 0, "P=%d rank %d: the velocity differs", P, r);
  }
}

}  // namespace

// The byte the corruption test flips: inside the first entry's index (a sorted-order or
// range violation the decoder must catch).
std::size_t sparse_wire_body_offset() { return cp::sparse_wire::header_bytes + 3; }

int main() {
  return commpact_test::run_checks("all ops<cuda_space> checks passed\n", "%d ops<cuda_space> checks failed\n", [] {
    E = cp::cuda_space::make_exec();
    auto rng = commpact_test::seeded_rng();
    check_basic(rng);
    check_mean(rng);
    check_clip(rng);
    check_frame_gate(rng);
    check_table_ef(rng);
    check_topk(rng);
    check_scatter(rng);
    check_merge(rng);
    for (int P : {1, 2, 3, 4, 5, 8})
      for (std::size_t k : {std::size_t{1}, std::size_t{37}, std::size_t{1000}}) {
        check_tree(P, 20011, k, false, true, -1, -1, rng);
        check_tree(P, 20011, k, true, true, -1, -1, rng);
      }
    check_tree(4, 5000, 50, false, false, -1, -1, rng);  // first step: no residual
    check_tree(3, 5000, 50, true, false, -1, -1, rng);   // first step with momentum
    check_tree(4, 5000, 50, false, true, 1, -1, rng);    // a corrupted frame
    check_tree(5, 5000, 50, false, true, -1, 2, rng);    // a NaN gradient
    check_tree(8, 5000, 50, false, true, 6, -1, rng);
  });
}
