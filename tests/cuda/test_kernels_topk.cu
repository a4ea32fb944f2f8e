// commpact::cuda_kernels::topk_abs against a brute-force reference (stable sort by (abs_key desc,
// index asc)) and against its host twin commpact::host::topk_abs, on the same random, tied
// and ReLU-like inputs (mostly exact zeros), by every selection (sampled, its keyed variant,
// and radix): indices and value bits must be identical. The sampled path's bound must equal
// the host plan's; an input built against the sample must take (and survive) its fallback,
// and one where most entries pass the bound the keyed variant's. Exits 77
// (CTest: skipped) when no GPU is present. COMMPACT_TEST_MAX_N caps the sizes (device-check's
// racecheck pass). CUDA code is always built as C++20 (the commpact::cuda target and
// scripts/device-check say so), which the host kernels need.

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "commpact/kernels/cuda/topk.cuh"
#include "commpact/kernels/host/topk.hpp"

#include "cuda_test_common.cuh"

using commpact_test::failures;

namespace {

std::uint32_t bits_of(float v) {
  std::uint32_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

// Brute force: all indices stably sorted by abs key descending, first k, sorted by index.
void reference(const std::vector<float>& x, std::size_t k, std::vector<std::int32_t>& idx, std::vector<float>& val) {
  std::vector<std::int32_t> order(x.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) {
    return (bits_of(x[a]) & 0x7fffffffu) > (bits_of(x[b]) & 0x7fffffffu);
  });
  order.resize(k);
  std::sort(order.begin(), order.end());
  idx = order;
  val.resize(k);
  for (std::size_t i = 0; i < k; ++i) val[i] = x[idx[i]];
}

std::size_t count_diff(const std::vector<std::int32_t>& ia, const std::vector<float>& va,
                       const std::vector<std::int32_t>& ib, const std::vector<float>& vb) {
  std::size_t bad = 0;
  for (std::size_t i = 0; i < ia.size(); ++i) bad += ia[i] != ib[i] || bits_of(va[i]) != bits_of(vb[i]);
  return bad;
}

template <class T>
struct device_buffer {
  T* p = nullptr;
  explicit device_buffer(std::size_t n) {
    commpact::cuda_kernels::detail::check(cudaMalloc(&p, (n == 0 ? 1 : n) * sizeof(T)), "cudaMalloc");
  }
  ~device_buffer() { cudaFree(p); }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
};

// What the last run of dws did, read from its device state after a fence.
commpact::cuda_kernels::detail::select_state last_state(const commpact::cuda_kernels::topk_workspace& dws) {
  commpact::cuda_kernels::detail::select_state st{};
  commpact::cuda_kernels::detail::check(
      cudaMemcpy(&st, dws.device_state(), sizeof st, cudaMemcpyDeviceToHost), "cudaMemcpy (state)");
  return st;
}

// The device result by dws's current method against the reference and the host kernel.
void compare_one(const char* what, const char* method, const std::vector<float>& x, std::size_t k,
                 const std::vector<std::int32_t>& ridx, const std::vector<float>& rval,
                 const std::vector<std::int32_t>& hidx, const std::vector<float>& hval,
                 commpact::cuda_kernels::topk_workspace& dws) {
  const std::size_t n = x.size();
  device_buffer<float> dx(n), dval(k);
  device_buffer<std::int32_t> didx(k);
  commpact::cuda_kernels::detail::check(cudaMemcpy(dx.p, x.data(), n * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
  dws.run(dx.p, n, k, didx.p, dval.p);
  commpact::cuda_kernels::detail::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  std::vector<std::int32_t> gidx(k);
  std::vector<float> gval(k);
  commpact::cuda_kernels::detail::check(cudaMemcpy(gidx.data(), didx.p, k * sizeof(std::int32_t), cudaMemcpyDeviceToHost),
                                "cudaMemcpy");
  commpact::cuda_kernels::detail::check(cudaMemcpy(gval.data(), dval.p, k * sizeof(float), cudaMemcpyDeviceToHost),
                                "cudaMemcpy");
  const std::size_t bad = count_diff(gidx, gval, ridx, rval);
  EXPECT(bad == 0, "%s (%s path): n=%zu k=%zu: %zu of %zu entries differ from the reference", what, method, n, k, bad,
         k);
  const std::size_t bad_host = count_diff(gidx, gval, hidx, hval);
  EXPECT(bad_host == 0, "%s (%s path): n=%zu k=%zu: %zu of %zu entries differ from the host kernel", what, method, n, k,
         bad_host, k);
}

// Every selection (the sampled path where it applies, keyed and not, and the radix path)
// against the reference and the host; on the sampled path, its bound must be the host
// plan's (the j-th largest key of the same sample) and its candidates those passing the
// bound, or the whole set where it falls back: fewer than k passing, all passing, or (keyed)
// more than n / 2 passing, where its keys would not fit beside the positions.
void compare(const char* what, const std::vector<float>& x, std::size_t k, commpact::cuda_kernels::topk_workspace& dws) {
  using commpact::cuda_kernels::topk_method;
  namespace hd = commpact::host::detail;
  const std::size_t n = x.size();
  std::vector<std::int32_t> ridx, hidx(k);
  std::vector<float> rval, hval(k);
  reference(x, k, ridx, rval);
  commpact::host::topk_workspace hws;
  commpact::host::topk_abs(x, k, hidx, hval, hws);
  dws.set_method(topk_method::radix);
  compare_one(what, "radix", x, k, ridx, rval, hidx, hval, dws);
  dws.set_method(topk_method::sampled_keyed);
  compare_one(what, "sampled_keyed", x, k, ridx, rval, hidx, hval, dws);
  const auto keyed = last_state(dws);
  dws.set_method(topk_method::automatic);
  compare_one(what, "automatic", x, k, ridx, rval, hidx, hval, dws);
  hd::topk_impl::sample_plan plan{};
  if (k == 0 || k >= n || !hd::topk_impl::plan_sampled(n, k, plan)) return;
  const auto st = last_state(dws);
  const std::uint32_t bound = hd::topk_impl::sample_bound(hws, n, plan, [&](std::size_t i) {
    return commpact::host::abs_key(x[i]);
  });
  EXPECT(st.bound == bound, "%s: n=%zu k=%zu: the device's sample bound is %u, the host plan's %u", what, n, k,
         st.bound, bound);
  std::size_t passing = 0;
  for (float v : x) passing += commpact::host::abs_key(v) >= bound;
  if (passing >= k) {  // every entry passing: the candidates are the whole set (ident), listed or not
    const std::uint32_t ident = passing == n ? 1u : 0u;
    EXPECT(st.ident == ident && st.m == passing, "%s: n=%zu k=%zu: %zu keys pass the bound, but the device kept %u "
           "candidates (whole set: %u)", what, n, k, passing, st.m, st.ident);
  } else {
    EXPECT(st.ident == 1 && st.m == n, "%s: n=%zu k=%zu: only %zu keys pass the bound, but the device did not fall "
           "back to every entry (ident %u, m %u)", what, n, k, passing, st.ident, st.m);
  }
  // keyed: the same bound; its keys used exactly when k <= passing <= n / 2
  EXPECT(keyed.bound == bound, "%s (keyed): n=%zu k=%zu: the device's sample bound is %u, the host plan's %u", what,
         n, k, keyed.bound, bound);
  const bool keys_fit = passing >= k && passing <= n / 2;
  if (keys_fit) {
    EXPECT(keyed.ident == 0 && keyed.m == passing && keyed.keys_at == n - n / 2,
           "%s (keyed): n=%zu k=%zu: %zu keys pass the bound, but the device kept %u candidates (whole set: %u, "
           "keys at %u, expected %zu)", what, n, k, passing, keyed.m, keyed.ident, keyed.keys_at, n - n / 2);
  } else {
    EXPECT(keyed.ident == 1 && keyed.m == n && keyed.keys_at == 0,
           "%s (keyed): n=%zu k=%zu: %zu keys pass the bound, so the candidates must be the whole set, but the "
           "device has ident %u, m %u, keys at %u", what, n, k, passing, keyed.ident, keyed.m, keyed.keys_at);
  }
}

// Most entries at the top key: 70% are +-1 (random signs), the rest in (-0.5, 0.5), so with
// k = n / 100 the sample's bound is 1 and 70% of the entries pass it: more than the keyed
// path's n / 2 key slots, so it must fall back to the whole set (and still be exact).
std::vector<float> mostly_at_the_top(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(0.0f, 1.0f), small(-0.5f, 0.5f);
  std::vector<float> x(n);
  for (auto& v : x) v = u(rng) < 0.7f ? (u(rng) < 0.5f ? -1.0f : 1.0f) : small(rng);
  return x;
}

// An input built against the sample: every sampled entry large, every other one small,
// so only the sample's top j keys reach its bound; with k above j (the plan's rank), fewer
// than k candidates pass and the sampled path must fall back to every entry.
std::vector<float> against_the_sample(std::size_t n, std::size_t k, std::uint64_t seed) {
  namespace hd = commpact::host::detail;
  hd::topk_impl::sample_plan plan{};
  if (!hd::topk_impl::plan_sampled(n, k, plan)) return {};
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> small(-1.0f, 1.0f), big(100.0f, 200.0f);
  std::vector<float> x(n);
  for (auto& v : x) v = small(rng);
  commpact::host::topk_workspace hws;
  hd::topk_impl::sample_bound(hws, n, plan, [&](std::size_t i) {
    x[i] = big(rng);
    return commpact::host::abs_key(x[i]);
  });
  return x;
}

}  // namespace

int main() {
  return commpact_test::run_checks("all device top-k checks passed\n", "%d device top-k checks failed\n", [] {
    commpact::cuda_kernels::topk_workspace dws;
    for (std::size_t n : {std::size_t{1}, std::size_t{17}, std::size_t{1000}, std::size_t{100003}, std::size_t{1} << 20,
                          std::size_t{3000017}}) {
      if (n > commpact_test::max_n()) continue;
      for (std::uint64_t seed : {1u, 2u}) {
        std::mt19937_64 rng(seed);
        std::normal_distribution<float> d(0.0f, 1.0f);
        std::vector<float> x(n);
        for (auto& v : x) v = d(rng);
        std::vector<std::size_t> ks = {0, 1, n, std::uniform_int_distribution<std::size_t>(0, n)(rng)};
        if (n >= 1000) ks.insert(ks.end(), {n / 1000, n / 100});
        for (std::size_t k : ks) compare("gaussian", x, k, dws);
        // ties: quantised magnitudes with random signs, zeros, +-Inf and a NaN
        for (auto& v : x) v = std::round(d(rng) * 2.0f) * 0.5f;
        for (std::size_t i = 0; i < n; i += 101) x[i] = (i % 2) ? std::numeric_limits<float>::infinity() : -0.0f;
        x[n / 2] = std::numeric_limits<float>::quiet_NaN();
        for (std::size_t k : ks) compare("tied", x, k, dws);
        // ReLU-like (a DDP bucket's gradient): exact zeros, so the k-th key may be 0 and the
        // selection runs among the zeros' ties (smaller index first); up to 2^20 entries (the
        // reference sort's time; 1e6 shows the shape)
        if (n > (std::size_t{1} << 20)) continue;
        if (n >= 20) ks.push_back(n / 20);
        for (double z : {0.5, 0.97, 0.999}) {
          x = commpact_test::relu_values(seed * 7 + static_cast<std::uint64_t>(z * 1000), n, z, 1e-3f);
          for (std::size_t k : ks) compare("relu-like", x, k, dws);
        }
      }
    }
    // The sampled path's fallback: built against the sample, checked to fall back.
    for (std::size_t n : {std::size_t{1} << 15, std::size_t{1} << 20}) {
      if (n > commpact_test::max_n()) continue;
      const std::size_t k = n / 50;
      const std::vector<float> x = against_the_sample(n, k, 7);
      EXPECT(!x.empty(), "n=%zu k=%zu: the host plan does not sample, so the fallback is not exercised", n, k);
      if (x.empty()) continue;
      compare("against the sample", x, k, dws);
      EXPECT(last_state(dws).ident == 1, "n=%zu k=%zu: the sampled path did not fall back", n, k);
    }
    // More than half the entries pass the bound: the keyed path's fallback (compare checks it).
    for (std::size_t n : {std::size_t{1} << 15, std::size_t{1} << 20}) {
      if (n > commpact_test::max_n()) continue;
      const std::vector<float> x = mostly_at_the_top(n, 11);
      compare("mostly at the top", x, n / 100, dws);
      const std::uint32_t m = last_state(dws).m;
      EXPECT(m > n / 2, "n=%zu: only %u candidates passed the bound; the input no longer exercises the keyed path's "
             "fallback", n, m);
    }
    // Workspace reuse: the same sizes do not allocate again.
    std::vector<float> x(100000, 1.0f);
    compare("reuse", x, 1000, dws);
    const std::size_t allocs = dws.allocations();
    compare("reuse", x, 1000, dws);
    EXPECT(dws.allocations() == allocs, "workspace allocated again for the same sizes");
  });
}
