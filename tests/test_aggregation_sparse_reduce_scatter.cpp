// SPDX-License-Identifier: Apache-2.0
// SparseReduceScatter<C> (compress/aggregations/sparse_reduce_scatter.hpp), Ok-Topk's
// aggregation, driven directly as an Aggregation on host_space and on the deferred space:
// - random sparse sets per rank (values that tie and cancel) against a brute-force
//   Ok-Topk selection at an estimation step (rank-order sums, the global top-k of the
//   nonzero sums, ties to the smaller index), P = 1..5;
// - blocks holding each rank's top-k of (g + residual), with the residual kept by
//   clear_selected, against OkTopK's fused path for 5 steps (outputs, residuals, regions
//   and theta bit for bit, re-estimating theta every second step);
// - a flagged, malformed or mismatched block flags the step alike on every rank;
// - a block too small for k is refused with the fix.

#include <catch2/catch.hpp>
#include <commpact/comm/deferred_comm.hpp>
#include <commpact/comm/thread_comm.hpp>
#include <commpact/compress/aggregations/sparse_reduce_scatter.hpp>
#include <commpact/compress/compressors/oktopk.hpp>
#include <commpact/kernels/host/topk.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <span>
#include <vector>

#include "common/bits.hpp"
#include "common/random.hpp"
#include "common/sparse_sets.hpp"

using namespace commpact;
using DC = DeferredComm<ThreadComm>;
using commpact_test::random_set;
using commpact_test::sparse_block;
using commpact_test::sparse_set;

static_assert(diagnose_aggregation<SparseReduceScatter<ThreadComm>>());
static_assert(diagnose_aggregation<SparseReduceScatter<DC>>());
static_assert(std::is_same_v<OkTopK<DC>::aggregation_type, SparseReduceScatter<DC>>);

namespace {

// Ok-Topk's first step (an estimation step) by brute force: rank-order sums, then the
// global top-k of the nonzero sums (ties to the smaller index), output the means.
std::vector<float> reference(const std::vector<sparse_set>& sets, std::int64_t n, std::size_t k) {
  const int P = static_cast<int>(sets.size());
  std::vector<float> sum(static_cast<std::size_t>(n), 0.0f);
  for (const auto& s : sets)  // rank order
    for (std::size_t e = 0; e < s.idx.size(); ++e) sum[s.idx[e]] += s.val[e];
  std::vector<std::int64_t> pass;
  for (std::int64_t i = 0; i < n; ++i)
    if (sum[i] != 0.0f) pass.push_back(i);
  std::stable_sort(pass.begin(), pass.end(), [&](auto a, auto b) { return std::fabs(sum[a]) > std::fabs(sum[b]); });
  if (pass.size() > k) pass.resize(k);
  std::vector<float> out(static_cast<std::size_t>(n), 0.0f);
  for (auto i : pass) out[i] = mean_of(sum[i], P);
  return out;
}

struct result {
  std::vector<float> out;
  std::uint32_t flags = 0, status = 0;
};

// One step of the aggregation on one rank from a block: begin, block, exchange, then
// combine when no rank flagged the step; out starts at 7.
template <class S, class C>
result drive(SparseReduceScatter<C>& agg, const std::vector<float>& block, std::size_t n, std::size_t k,
             std::int64_t step) {
  const auto e = comm_exec(agg.comm());
  typename S::template buffer<float> out;
  typename S::template buffer<std::uint32_t> st;
  out.resize(n), st.resize(2);
  ops<S>::fill(e, out.view(), 7.0f);
  ops<S>::fill(e, st.view(), std::uint32_t{0});
  agg.begin(n, k, step, 0, st.view());
  ops<S>::from_host(e, std::span<const float>(block), agg.block(block.size() * 4));
  agg.exchange();
  result r;
  r.flags = agg.flags();
  if (r.flags == 0) agg.combine(0, out.view(), st.view());
  r.out.resize(n);
  ops<S>::to_host(e, out.cview(), std::span<float>(r.out));
  ops<S>::to_host(e, st.cview().first(1), std::span<std::uint32_t>(&r.status, 1));
  S::fence(e, no_deadline());
  return r;
}

template <class C>
result drive_once(C comm, const std::vector<float>& block, std::size_t n, std::size_t k) {
  SparseReduceScatter<C> agg{std::move(comm)};
  return drive<comm_space_t<C>>(agg, block, n, k, 0);
}

// Five steps of OkTopK (fused) and of the aggregation fed by blocks of top-k(g + r), r
// kept through clear_selected; true when outputs, residuals, regions and theta agree.
template <class C>
bool same_as_oktopk(C comm, std::size_t n, int rank) {
  using S = comm_space_t<C>;
  OkTopK<C> ok{comm, {.density = 0.04, .period = 2}};
  SparseReduceScatter<C> agg{comm, 2};
  const auto e = comm_exec(comm);
  typename S::template buffer<float> acc, res, grad;
  typename S::template buffer<std::uint32_t> st;
  acc.resize(n), res.resize(n), grad.resize(n), st.resize(2);
  ops<S>::fill(e, res.view(), 0.0f);
  bool same = true;
  for (std::int64_t step = 0; step < 5; ++step) {
    const auto g = commpact_test::normal(100 * static_cast<std::uint64_t>(step) + static_cast<std::uint64_t>(rank), n);
    ops<S>::from_host(e, std::span<const float>(g), grad.view());
    ok.reduce(grad.view());
    const std::size_t k = ok.k(n);
    // This rank's block: top-k of acc = r + g, read on the host.
    std::vector<float> r(n), a(n);
    ops<S>::to_host(e, res.cview(), std::span<float>(r));
    S::fence(e, no_deadline());
    for (std::size_t i = 0; i < n; ++i) a[i] = r[i] + g[i];
    sparse_set s{std::vector<std::int32_t>(k), std::vector<float>(k)};
    host::topk_workspace ws;
    host::topk_abs(std::span<const float>(a), k, std::span<std::int32_t>(s.idx), std::span<float>(s.val), ws);
    ops<S>::from_host(e, std::span<const float>(a), acc.view());
    const auto got = drive<S>(agg, sparse_block(s, static_cast<std::int64_t>(n), static_cast<std::int64_t>(k), k), n, k, step);
    ops<S>::fill(e, st.view(), std::uint32_t{0});
    agg.clear_selected(acc.view(), st.cview());
    std::vector<float> want(n), kept(n), ok_res(n);
    ops<S>::to_host(e, grad.cview(), std::span<float>(want));
    ops<S>::to_host(e, acc.cview(), std::span<float>(kept));
    ops<S>::to_host(e, ok.residual(), std::span<float>(ok_res));
    S::fence(e, no_deadline());
    agg.commit(true);
    ops<S>::copy(e, acc.cview(), res.view());
    same = same && got.flags == 0 && got.status == 0 && commpact_test::same_bits(got.out, want) &&
           commpact_test::same_bits(kept, ok_res) && std::ranges::equal(agg.bounds(), ok.bounds()) &&
           std::bit_cast<std::uint32_t>(agg.theta()) == std::bit_cast<std::uint32_t>(ok.theta());
  }
  return same;
}

}  // namespace

TEST_CASE("SparseReduceScatter: random sparse sets per rank give the brute-force Ok-Topk selection, host and "
          "deferred alike",
          "[aggregation][oktopk]") {
  const int P = GENERATE(1, 2, 3, 4, 5);
  const std::size_t k = GENERATE(1, 3, 8);
  const std::int64_t n = 41;
  const std::size_t kcap = k + 2;  // blocks may be larger than a frame of k
  for (std::uint64_t trial = 0; trial < 20; ++trial) {
    CAPTURE(P, k, trial);
    std::vector<sparse_set> sets;
    for (int r = 0; r < P; ++r) sets.push_back(random_set(1000 * trial + 17 * k + r, n, k));
    const auto want = reference(sets, n, k);
    std::vector<result> host(P), def(P);
    run_threads(P, [&](ThreadComm& comm) {
      const auto blk = sparse_block(sets[comm.rank()], n, static_cast<std::int64_t>(k), kcap);
      host[comm.rank()] = drive_once(comm, blk, static_cast<std::size_t>(n), k);
      def[comm.rank()] = drive_once(DC{comm}, blk, static_cast<std::size_t>(n), k);
    });
    for (int r = 0; r < P; ++r) {
      CHECK(host[r].flags == 0);
      CHECK(def[r].flags == 0);
      CHECK(host[r].status == 0);
      CHECK(def[r].status == 0);
      CHECK(commpact_test::same_bits(host[r].out, want));
      CHECK(commpact_test::same_bits(def[r].out, want));
    }
  }
}

TEST_CASE("SparseReduceScatter fed by blocks of top-k(g + residual) gives OkTopK's steps bit for bit (outputs, "
          "residuals, regions, theta), host and deferred",
          "[aggregation][oktopk]") {
  const int P = GENERATE(1, 2, 3, 5);
  const std::size_t n = 400;
  CAPTURE(P);
  std::vector<int> host(P, 0), def(P, 0);
  run_threads(P, [&](ThreadComm& comm) {
    host[comm.rank()] = same_as_oktopk(comm, n, comm.rank());
    def[comm.rank()] = same_as_oktopk(DC{comm}, n, comm.rank());
  });
  for (int r = 0; r < P; ++r) {
    CHECK(host[r] == 1);
    CHECK(def[r] == 1);
  }
}

TEST_CASE("SparseReduceScatter: a flagged, malformed or mismatched block flags the step alike on every rank and "
          "nothing is combined",
          "[aggregation][oktopk]") {
  const int P = GENERATE(2, 3, 5);
  const int bad = P - 1;
  const std::int64_t n = 30;
  const std::int64_t k = 4;
  enum class fault { nonfinite, failed, unsorted, length, too_many };
  const auto f = GENERATE(fault::nonfinite, fault::failed, fault::unsorted, fault::length, fault::too_many);
  CAPTURE(P, static_cast<int>(f));
  std::vector<result> host(P), def(P);
  run_threads(P, [&](ThreadComm& comm) {
    sparse_set s{{3, 9, 11}, {1.0f, 2.0f, 3.0f}};
    std::vector<float> blk = sparse_block(s, n, k, 6);
    if (comm.rank() == bad) {
      switch (f) {
        case fault::nonfinite: blk = sparse_block(s, n, k, 6, sparse_wire::flag_nonfinite); break;
        case fault::failed: blk = sparse_block(s, n, k, 6, sparse_wire::flag_failed); break;
        case fault::unsorted: std::swap(s.idx[0], s.idx[1]), blk = sparse_block(s, n, k, 6); break;
        case fault::length: blk = sparse_block(s, n + 1, k, 6); break;
        case fault::too_many: blk = sparse_block({{1, 2, 3, 4, 5}, {1, 1, 1, 1, 1}}, n, k, 6); break;
      }
    }
    host[comm.rank()] = drive_once(comm, blk, static_cast<std::size_t>(n), static_cast<std::size_t>(k));
    def[comm.rank()] = drive_once(DC{comm}, blk, static_cast<std::size_t>(n), static_cast<std::size_t>(k));
  });
  const std::vector<float> untouched(static_cast<std::size_t>(n), 7.0f);
  const std::uint32_t want = f == fault::nonfinite ? 1u : 2u;
  for (int r = 0; r < P; ++r) {
    CAPTURE(r);
    CHECK(host[r].flags == want);
    CHECK(def[r].flags == want);
    CHECK(commpact_test::same_bits(host[r].out, untouched));
    CHECK(commpact_test::same_bits(def[r].out, untouched));
  }
}

TEST_CASE("SparseReduceScatter::block refuses a capacity that cannot hold k entries, naming the fix",
          "[aggregation][oktopk]") {
  run_threads(1, [&](ThreadComm& comm) {
    SparseReduceScatter<ThreadComm> agg{comm};
    std::vector<std::uint32_t> st(2, 0);
    agg.begin(20, 3, 0, 0, std::span<std::uint32_t>(st));
    CHECK_THROWS_WITH(agg.block(48 + 8 * 2), Catch::Contains("48 + 8k = 72"));
    CHECK_THROWS_AS(agg.block(74), invalid_argument);
    CHECK_NOTHROW(agg.block(72));
    CHECK_THROWS_WITH((SparseReduceScatter<ThreadComm>{comm, 0}), Catch::Contains("period = 0"));
  });
}
