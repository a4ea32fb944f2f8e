// SPDX-License-Identifier: Apache-2.0
// Bucketed<C> (overlap of the reduction with backward) over the deferred space: the
// buckets of a deferred gradient run through compressors of DeferredComm<ThreadComm> on
// the worker thread, and give the host's bits, with and without overlap (begin/ready in
// a backward order), for Dense, TopK, gTopK and PowerCompressor<2, deferred_space>, at
// P = 1..3 over 3 steps; a NaN in one bucket raises on every rank and leaves every
// bucket's state as it was, and the gradient too (but Dense's, which holds the mean); DataParallel's begin_backward /
// grad_ready / step over the deferred space equals the host run bit for bit.

#include <catch2/catch.hpp>
#include <commpact/comm/deferred_comm.hpp>
#include <commpact/comm/thread_comm.hpp>
#include <commpact/compress/compressors/bucketed.hpp>
#include <commpact/compress/compressors/dense.hpp>
#include <commpact/compress/compressors/gtopk.hpp>
#include <commpact/compress/compressors/power.hpp>
#include <commpact/compress/compressors/topk.hpp>
#include <commpact/sync/policies.hpp>
#include <commpact/train/data_parallel.hpp>
#include <commpact/train/sgd.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <span>
#include <vector>

#include "common/layers.hpp"
#include "common/random.hpp"
#include "common/space_copies.hpp"

using namespace commpact;
using DC = DeferredComm<ThreadComm>;
using commpact_test::same_bits;

namespace {

const std::vector<tensor_shape> kShapes = {{24, 17}, {24, 1}, {16, 24}, {16, 1}, {5, 16}, {5, 1}};

std::vector<std::size_t> layer_sizes() { return commpact_test::layer_sizes(kShapes); }
std::size_t model_size() { return commpact_test::model_size(kShapes); }
std::vector<float> gradient(int rank, int step) {
  return commpact_test::normal(static_cast<std::uint64_t>(rank * 7919 + step * 104729 + 3), model_size());
}
tensor_layout layout_of(const bucket_info& b) { return commpact_test::layout_of(kShapes, b); }

// One compressor family per kind, for a host (ThreadComm) or deferred (DC) communicator.
struct dense_kind {  // Dense reduces in place: after a NaN, grad holds the mean (dense.hpp)
  static constexpr bool keeps_grad = false;
  template <class C>
  static auto make(C c, const bucket_info&) { return Dense<C>{std::move(c)}; }
};
struct topk_kind {
  static constexpr bool keeps_grad = true;
  template <class C>
  static auto make(C c, const bucket_info&) { return TopK<C>{std::move(c), {.density = 0.1}}; }
};
struct gtopk_kind {
  static constexpr bool keeps_grad = true;
  template <class C>
  static auto make(C c, const bucket_info&) { return gTopK<TreeComm<C>>{std::move(c), {.density = 0.1}}; }
};
struct power_kind {
  static constexpr bool keeps_grad = true;
  template <class C>
  static auto make(C c, const bucket_info& b) {
    if constexpr (std::is_same_v<C, DC>)
      return PowerCompressor<2, deferred_space>{std::move(c), layout_of(b), {.min_compression_rate = 1.0}};
    else
      return PowerCompressor<2>{std::move(c), layout_of(b), {.min_compression_rate = 1.0}};
  }
};

template <class K, class C>
auto make_bucketed(C c) {
  using T = decltype(K::make(c, bucket_info{}));
  return Bucketed<T>{layer_sizes(), [c](const bucket_info& b) { return K::make(c, b); }, {.cap_bytes = 800}};
}

struct run_result {
  std::vector<std::vector<float>> out;  // every step's reduced gradient
  bool raised_alike = false, untouched = false, state_kept = false;
};

// Three steps (the second overlapped when `overlap`), then a NaN step on rank 1 that
// must raise numeric_error and change nothing.
template <class K, class C>
run_result run(C comm, bool overlap) {
  using S = comm_space_t<C>;
  auto b = make_bucketed<K>(comm);
  const auto e = comm_exec(comm);
  const int r = comm.rank();
  typename S::template buffer<float> g;
  g.resize(model_size());
  run_result res;
  for (int step = 0; step < 3; ++step) {
    const auto h = gradient(r, step);
    ops<S>::from_host(e, std::span<const float>(h), g.view());
    if (overlap && step == 1) {
      b.begin(g.view());
      for (std::size_t l = kShapes.size(); l-- > 0;) b.ready(l);
    }
    b.reduce(g.view());
    std::vector<float> out(model_size());
    ops<S>::to_host(e, g.cview(), std::span<float>(out));
    S::fence(e, no_deadline());
    res.out.push_back(out);
  }
  std::vector<std::byte> before, after;
  b.save_state(before);
  auto bad = gradient(r, 3);
  if (r == 1) bad[model_size() - 3] = std::numeric_limits<float>::quiet_NaN();
  ops<S>::from_host(e, std::span<const float>(bad), g.view());
  try {
    if (overlap) {
      b.begin(g.view());
      for (std::size_t l = kShapes.size(); l-- > 0;) b.ready(l);
    }
    b.reduce(g.view());
  } catch (const numeric_error&) {
    res.raised_alike = true;
  }
  std::vector<float> seen(model_size());
  ops<S>::to_host(e, g.cview(), std::span<float>(seen));
  S::fence(e, no_deadline());
  res.untouched = same_bits(seen, bad);
  b.save_state(after);
  res.state_kept = before == after && !b.in_flight();
  return res;
}

}  // namespace

TEMPLATE_TEST_CASE("Bucketed over the deferred space gives the host's bits, with and without overlap; a NaN step "
                   "raises alike and changes nothing",
                   "[space][overlap]", dense_kind, topk_kind, gtopk_kind, power_kind) {
  const int P = GENERATE(1, 2, 3);
  const bool overlap = GENERATE(false, true);
  CAPTURE(P, overlap);
  std::vector<run_result> host(P), def(P);
  run_threads(P, [&](ThreadComm& comm) {
    host[comm.rank()] = run<TestType>(comm, overlap);
    def[comm.rank()] = run<TestType>(DC{comm}, overlap);
  });
  for (int r = 0; r < P; ++r) {
    CAPTURE(r);
    REQUIRE(host[r].out.size() == def[r].out.size());
    for (std::size_t s = 0; s < host[r].out.size(); ++s) CHECK(same_bits(host[r].out[s], def[r].out[s]));
    CHECK(host[r].out == host[0].out);  // the same result on every rank
    if (P > 1) {  // rank 1 sends the NaN
      CHECK(host[r].raised_alike);
      CHECK(def[r].raised_alike);
      CHECK(host[r].state_kept);
      CHECK(def[r].untouched == host[r].untouched);
      if (TestType::keeps_grad) CHECK(def[r].untouched);
      CHECK(def[r].state_kept);
    }
  }
}

TEST_CASE("DataParallel with a Bucketed compressor over the deferred space: begin_backward, grad_ready and step "
          "give the host run's parameters bit for bit",
          "[space][overlap][train]") {
  const int P = GENERATE(1, 2, 3);
  CAPTURE(P);
  std::vector<std::vector<float>> host(P), def(P);
  auto train = [](auto comm) {
    using C = decltype(comm);
    using S = comm_space_t<C>;
    const auto e = comm_exec(comm);
    DataParallel dp{make_bucketed<topk_kind>(comm), EveryStep{}, 4};
    BasicSgd<S> sgd{model_size(), {.momentum = 0.9}, e};
    typename S::template buffer<float> x, g;
    x.resize(model_size()), g.resize(model_size());
    const auto x0 = gradient(99, 0);
    ops<S>::from_host(e, std::span<const float>(x0), x.view());
    for (int step = 0; step < 4; ++step) {
      const auto h = gradient(comm.rank(), 10 + step);
      ops<S>::from_host(e, std::span<const float>(h), g.view());
      dp.begin_backward(g.view(), 0.05);
      for (std::size_t l = kShapes.size(); l-- > 0;) dp.grad_ready(l);
      dp.step(x.view(), g.view(), 0.05, sgd);
    }
    std::vector<float> out(model_size());
    ops<S>::to_host(e, x.cview(), std::span<float>(out));
    S::fence(e, no_deadline());
    return out;
  };
  run_threads(P, [&](ThreadComm& comm) {
    host[comm.rank()] = train(comm);
    def[comm.rank()] = train(DC{comm});
  });
  for (int r = 0; r < P; ++r) {
    CHECK(same_bits(host[r], def[r]));
    CHECK(same_bits(host[r], host[0]));
  }
}
