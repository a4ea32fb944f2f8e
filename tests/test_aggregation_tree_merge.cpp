// SPDX-License-Identifier: Apache-2.0
// TreeMerge<Tree> (compress/aggregations/tree_merge.hpp) driven directly as an Aggregation:
// each rank writes a hand-made sparse set into its block, exchange() walks the tree,
// combine() writes G / P; compared bit for bit with a brute-force serial merge over the
// same recursive-doubling schedule, on host_space and on the deferred space, P = 1..5.
// Also: a flagged, a malformed and a mismatched block leave out untouched and set the
// status bits every rank expects.

#include <catch2/catch.hpp>
#include <commpact/comm/deferred_comm.hpp>
#include <commpact/comm/thread_comm.hpp>
#include <commpact/compress/aggregations/tree_merge.hpp>
#include <commpact/compress/compressors/gtopk.hpp>
#include <commpact/kernels/host/topk.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <map>
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

static_assert(diagnose_aggregation<TreeMerge<TreeComm<ThreadComm>>>());
static_assert(diagnose_aggregation<TreeMerge<TreeComm<DC>>>());
static_assert(Aggregation<TreeMerge<TreeComm<ThreadComm>>> && Aggregation<TreeMerge<TreeComm<DC>>>);

namespace {

// The brute-force merge: union (a + b at equal indices), the k largest |v| (ties to the
// smaller index), sorted by index.
sparse_set merge(const sparse_set& a, const sparse_set& b, std::size_t k) {
  std::map<std::int32_t, float> u;
  for (std::size_t e = 0; e < a.idx.size(); ++e) u[a.idx[e]] = a.val[e];
  for (std::size_t e = 0; e < b.idx.size(); ++e) {
    auto it = u.find(b.idx[e]);
    if (it == u.end()) u[b.idx[e]] = b.val[e];
    else it->second = it->second + b.val[e];
  }
  std::vector<std::pair<std::int32_t, float>> v(u.begin(), u.end());
  std::stable_sort(v.begin(), v.end(),
                   [](const auto& x, const auto& y) { return std::fabs(x.second) > std::fabs(y.second); });
  if (v.size() > k) v.resize(k);
  std::sort(v.begin(), v.end());
  sparse_set s;
  for (const auto& [i, x] : v) s.idx.push_back(i), s.val.push_back(x);
  return s;
}

// The serial recursive doubling of TreeComm: fold the extra ranks, exchange rounds
// (lower rank's set as a), every core rank ends with G.
std::vector<float> reference(const std::vector<sparse_set>& sets, std::int64_t n, std::size_t k) {
  const int P = static_cast<int>(sets.size());
  const int p2 = static_cast<int>(std::bit_floor(static_cast<unsigned>(P)));
  std::vector<sparse_set> s(sets.begin(), sets.begin() + p2);
  for (int r = 0; r + p2 < P; ++r) s[r] = merge(s[r], sets[r + p2], k);
  for (int bit = 1; bit < p2; bit <<= 1)
    for (int r = 0; r < p2; ++r)
      if ((r & bit) == 0) s[r] = s[r | bit] = merge(s[r], s[r | bit], k);
  std::vector<float> out(static_cast<std::size_t>(n), 0.0f);
  for (std::size_t e = 0; e < s[0].idx.size(); ++e) out[s[0].idx[e]] = mean_of(s[0].val[e], P);
  return out;
}

struct result {
  std::vector<float> out;
  std::uint32_t status = 0;
  bool shape = false;  // the block had the asked size and sources() == P
};

// Drives TreeMerge<TreeComm<C>> on one rank: block, exchange, combine; out starts at 7.
template <class C>
result drive(C comm, const std::vector<float>& block, std::size_t n) {
  using S = comm_space_t<C>;
  TreeMerge<TreeComm<C>> agg{TreeComm<C>{std::move(comm)}};
  const auto e = comm_exec(agg.comm());
  typename S::template buffer<float> out;
  typename S::template buffer<std::uint32_t> st;
  out.resize(n);
  st.resize(1);
  ops<S>::fill(e, out.view(), 7.0f);
  ops<S>::fill(e, st.view(), std::uint32_t{0});
  auto b = agg.block(block.size() * 4);
  result r;
  r.shape = b.size() == block.size() && agg.sources() == agg.comm().size();
  ops<S>::from_host(e, std::span<const float>(block), b);
  agg.exchange();
  agg.combine(0, out.view(), st.view());
  r.out.resize(n);
  ops<S>::to_host(e, out.cview(), std::span<float>(r.out));
  ops<S>::to_host(e, st.cview(), std::span<std::uint32_t>(&r.status, 1));
  S::fence(e, no_deadline());
  return r;
}

}  // namespace

TEST_CASE("TreeMerge: random sparse sets per rank merge as the brute-force serial tree, host and deferred alike",
          "[aggregation][tree_merge]") {
  const int P = GENERATE(1, 2, 3, 4, 5);
  const std::size_t k = GENERATE(1, 3, 8);
  const std::int64_t n = 40;
  const std::size_t kcap = k + 2;  // frames may be larger than k
  for (std::uint64_t trial = 0; trial < 20; ++trial) {
    CAPTURE(P, k, trial);
    std::vector<sparse_set> sets;
    for (int r = 0; r < P; ++r) sets.push_back(random_set(1000 * trial + 17 * k + r, n, k));
    const auto want = reference(sets, n, k);
    std::vector<result> host(P), def(P);
    run_threads(P, [&](ThreadComm& comm) {
      const auto blk = sparse_block(sets[comm.rank()], n, static_cast<std::int64_t>(k), kcap);
      host[comm.rank()] = drive(comm, blk, static_cast<std::size_t>(n));
      def[comm.rank()] = drive(DC{comm}, blk, static_cast<std::size_t>(n));
    });
    for (int r = 0; r < P; ++r) {
      CHECK((host[r].shape && def[r].shape));
    CHECK(host[r].status == 0);
      CHECK(def[r].status == 0);
      CHECK(commpact_test::same_bits(host[r].out, want));
      CHECK(commpact_test::same_bits(def[r].out, want));
    }
  }
}

TEST_CASE("TreeMerge: a flagged, malformed or mismatched block leaves out untouched and sets the status on every "
          "rank, host and deferred alike",
          "[aggregation][tree_merge]") {
  const int P = GENERATE(2, 3, 5);
  const int bad = P - 1;
  const std::int64_t n = 30;
  const std::int64_t k = 4;
  enum class fault { nonfinite, failed, unsorted, length };
  const auto f = GENERATE(fault::nonfinite, fault::failed, fault::unsorted, fault::length);
  CAPTURE(P, static_cast<int>(f));
  std::vector<result> host(P), def(P);
  run_threads(P, [&](ThreadComm& comm) {
    sparse_set s{{3, 9, 11}, {1.0f, 2.0f, 3.0f}};
    std::vector<float> blk = sparse_block(s, n, k, std::size_t{4});
    if (comm.rank() == bad) {
      switch (f) {
        case fault::nonfinite: blk = sparse_block(s, n, k, std::size_t{4}, sparse_wire::flag_nonfinite); break;
        case fault::failed: blk = sparse_block(s, n, k, std::size_t{4}, sparse_wire::flag_failed); break;
        case fault::unsorted: std::swap(s.idx[0], s.idx[1]), blk = sparse_block(s, n, k, std::size_t{4}); break;
        case fault::length: blk = sparse_block(s, n + 1, k, std::size_t{4}); break;
      }
    }
    host[comm.rank()] = drive(comm, blk, static_cast<std::size_t>(n));
    def[comm.rank()] = drive(DC{comm}, blk, static_cast<std::size_t>(n));
  });
  const std::vector<float> untouched(static_cast<std::size_t>(n), 7.0f);
  for (int r = 0; r < P; ++r) {
    CAPTURE(r);
    std::uint32_t want = 0;
    switch (f) {
      case fault::nonfinite: want = status_nonfinite; break;
      case fault::failed:
      case fault::length: want = status_rejected; break;
      case fault::unsorted: want = r == bad ? (status_wire | status_rejected) : status_rejected; break;
    }
    CHECK(host[r].status == want);
    CHECK(def[r].status == want);
    CHECK(commpact_test::same_bits(host[r].out, untouched));
    CHECK(commpact_test::same_bits(def[r].out, untouched));
  }
}

TEST_CASE("TreeMerge::block rejects a capacity that is not a sparse frame's, naming the fix",
          "[aggregation][tree_merge]") {
  run_threads(1, [&](ThreadComm& comm) {
    TreeMerge<TreeComm<ThreadComm>> agg{TreeComm<ThreadComm>{comm}};
    CHECK_THROWS_WITH(agg.block(52), Catch::Contains("sparse_tree_frame_bytes"));
    CHECK_NOTHROW(agg.block(sparse_tree_frame_bytes(3, false)));
  });
}

TEST_CASE("TreeMerge fed by blocks of each rank's top-k gives gTopK's first step bit for bit (the fused local "
          "phase and the block path merge alike)",
          "[aggregation][tree_merge]") {
  const int P = GENERATE(1, 2, 3, 5);
  const std::size_t n = 300;
  CAPTURE(P);
  std::vector<int> ok(P, 0);
  run_threads(P, [&](ThreadComm& comm) {
    const auto g = commpact_test::normal(77 + comm.rank(), n);
    gTopK<TreeComm<ThreadComm>> gt{comm, {.density = 0.05}};
    auto grad = g;
    const bool delivered = gt.reduce(std::span<float>(grad));
    const auto k = static_cast<std::size_t>(gt.k());
    sparse_set s{std::vector<std::int32_t>(k), std::vector<float>(k)};
    host::topk_workspace ws;
    host::topk_abs(std::span<const float>(g), k, std::span<std::int32_t>(s.idx), std::span<float>(s.val), ws);
    const auto blk = sparse_block(s, static_cast<std::int64_t>(n), static_cast<std::int64_t>(k), k);
    const auto r = drive(comm, blk, n);
    ok[comm.rank()] = delivered && r.shape && r.status == 0 && commpact_test::same_bits(r.out, grad);
  });
  for (int r = 0; r < P; ++r) CHECK(ok[r] == 1);
}
