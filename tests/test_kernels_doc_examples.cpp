// The code examples of docs/kernels.md, compiled and run: each block between "docs/kernels.md
// begins" and "ends" is the page's example verbatim (keep the two in sync), wrapped in
// the declarations it assumes; the checks after it say what the page says it does.

#include <catch2/catch.hpp>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <vector>

#include <commpact/kernels/host/sparse_merge.hpp>   // includes topk.hpp
#include <commpact/kernels/host/scatter.hpp>
#include <commpact/kernels/host/topk_fused.hpp>
#include <commpact/kernels/host/vector_ops.hpp>

namespace {

std::vector<float> gaussian(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (auto& x : v) x = d(gen);
  return v;
}

bool index_sorted(std::span<const std::int32_t> idx) {
  for (std::size_t i = 1; i < idx.size(); ++i)
    if (idx[i - 1] >= idx[i]) return false;
  return true;
}

}  // namespace

TEST_CASE("docs/kernels.md: top-k, a gTop-k merge round and the scatter of its result",
          "[kernels][docs]") {
  const std::size_t n = 100000, k = 100;
  const int P = 2;
  std::vector<float> acc = gaussian(n, 1);
  // The two partners' sets of a gTop-k round, index-sorted, as topk_abs writes them.
  std::vector<std::int32_t> ia(k), ib(k);
  std::vector<float> va(k), vb(k);
  {
    commpact::host::topk_workspace ws;
    commpact::host::topk_abs(gaussian(n, 2), k, ia, va, ws);
    commpact::host::topk_abs(gaussian(n, 3), k, ib, vb, ws);
  }
  std::vector<std::int32_t> io(k);
  std::vector<float> vo(k);
  std::vector<float> dense(n, 0.0f);

  // ---- docs/kernels.md begins ----
commpact::host::topk_workspace tws;      // keep them across steps: no allocation after
commpact::host::merge_workspace mws;     // the first call of a given size

std::vector<std::int32_t> idx(k);
std::vector<float> val(k);
commpact::host::topk_abs(acc, k, idx, val, tws);       // k largest |acc|, sorted by index

// gTopKAllReduce round: both partners pass (lower rank's set, higher rank's set)
std::size_t m = commpact::host::sparse_merge_topk(ia, va, ib, vb, k, io, vo, mws);

commpact::host::scatter_add(dense, std::span(io).first(m), std::span(vo).first(m), 1.0f / P);
  // ---- docs/kernels.md ends ----

  CHECK(index_sorted(idx));
  for (std::size_t i = 0; i < k; ++i) CHECK(val[i] == acc[static_cast<std::size_t>(idx[i])]);
  REQUIRE(m == k);
  CHECK(index_sorted(std::span<const std::int32_t>(io).first(m)));
  for (std::size_t i = 0; i < m; ++i)
    CHECK(dense[static_cast<std::size_t>(io[i])] == 0.0f + (1.0f / P) * vo[i]);
  // Reuse: the same sizes again allocate nothing.
  const auto grown = tws.allocations();
  commpact::host::topk_abs(acc, k, idx, val, tws);
  CHECK(tws.allocations() == grown);
}

TEST_CASE("docs/kernels.md: the fused local phase equals ef_accumulate + topk_abs",
          "[kernels][docs]") {
  const std::size_t n = (std::size_t{1} << 16) + 3, k = 65;
  const std::vector<float> residual = gaussian(n, 4), g = gaussian(n, 5);
  std::vector<float> acc(n), acc2(n);
  std::vector<std::int32_t> idx(k), idx2(k);
  std::vector<float> val(k), val2(k);
  commpact::host::topk_workspace ws, ws2;

  // ---- docs/kernels.md begins ----
std::size_t bad = commpact::host::ef_accumulate_topk_abs(acc, residual, g, std::nullopt,
                                                         k, idx, val, ws);
if (bad != acc.size()) { /* acc[bad] is the first Inf or NaN: skip or raise */ }
  // ---- docs/kernels.md ends ----

  const std::size_t bad2 = commpact::host::ef_accumulate(acc2, residual, g);
  commpact::host::topk_abs(acc2, k, idx2, val2, ws2);
  CHECK(bad == n);
  CHECK(bad2 == n);
  CHECK(acc == acc2);
  CHECK(idx == idx2);
  CHECK(val == val2);
}
