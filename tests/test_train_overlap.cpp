// Overlap of the gradient reduction with backward: the bucket plan
// against a brute-force rule, Bucketed with begin/ready in random orders against
// Bucketed without overlap and against each bucket's compressor run by hand (bit for
// bit, for Dense, TopK, gTopK and PowerSGD at P = 1..4), DataParallel with
// begin_backward/grad_ready against plain step() (EveryStep, Local SGD, QSR), rollback
// of every bucket on an error or a skipped step, misuse errors, and a rank that fails
// with buckets in flight. Per-rank results are asserted after run_threads.
#include <commpact/comm/counting_comm.hpp>
#include <commpact/comm/thread_comm.hpp>
#include <commpact/comm/tree_comm.hpp>
#include <commpact/compress/compressors/bucketed.hpp>
#include <commpact/compress/compressors/dense.hpp>
#include <commpact/compress/compressors/gtopk.hpp>
#include <commpact/compress/compressors/power.hpp>
#include <commpact/compress/compressors/topk.hpp>
#include <commpact/sync/policies.hpp>
#include <commpact/train/data_parallel.hpp>
#include <commpact/train/sgd.hpp>

#include <catch2/catch.hpp>

#include "common/layers.hpp"
#include "common/random.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

using namespace commpact;

namespace {

// Layers of a small MLP-like model: (rows, cols) matrices and bias vectors.
const std::vector<tensor_shape> kShapes = {{24, 17}, {24, 1}, {16, 24}, {16, 1}, {5, 16}, {5, 1}};

std::vector<std::size_t> layer_sizes() { return commpact_test::layer_sizes(kShapes); }
std::size_t model_size() { return commpact_test::model_size(kShapes); }

std::vector<float> gradient(int rank, int step, std::size_t n) {
  return commpact_test::normal(static_cast<std::uint64_t>(rank * 7919 + step * 104729 + 1), n);
}

tensor_layout layout_of(const bucket_info& b) { return commpact_test::layout_of(kShapes, b); }

// One compressor family per kind, each built for one bucket.
struct dense_kind {
  using type = Dense<ThreadComm>;
  static type make(ThreadComm c, const bucket_info&) { return type{c}; }
};
struct topk_kind {
  using type = TopK<ThreadComm>;
  static type make(ThreadComm c, const bucket_info&) { return type{c, {.density = 0.1}}; }
};
struct gtopk_kind {
  using type = gTopK<TreeComm<ThreadComm>>;
  static type make(ThreadComm c, const bucket_info&) { return type{c, {.density = 0.1}}; }
};
struct power_kind {
  using type = PowerCompressor<2>;
  static type make(ThreadComm c, const bucket_info& b) {
    return type{c, layout_of(b), {.min_compression_rate = 1.0}};
  }
};

template <class K>
auto make_bucketed(ThreadComm c, std::size_t cap, bool transactional = true) {
  return Bucketed<typename K::type>{layer_sizes(), [c](const bucket_info& b) { return K::make(c, b); },
                                    {.cap_bytes = cap, .transactional = transactional}};
}

// Reports layers last-first with a random swap, as a backward with parallel branches might.
std::vector<std::size_t> ready_order(std::uint64_t seed, std::size_t L) {
  std::vector<std::size_t> o(L);
  for (std::size_t i = 0; i < L; ++i) o[i] = L - 1 - i;
  std::mt19937_64 g(seed);
  for (std::size_t i = 0; i + 1 < L; ++i)
    if (g() % 3 == 0) std::swap(o[i], o[i + 1]);
  return o;
}

}  // namespace

TEST_CASE("plan_buckets follows DDP's rule: last layers first, each bucket just reaches the cap",
          "[train][overlap]") {
  std::mt19937_64 g(5);
  for (int trial = 0; trial < 300; ++trial) {
    const std::size_t L = 1 + g() % 12;
    std::vector<std::size_t> sizes(L);
    for (auto& s : sizes) s = 1 + g() % 5000;
    const std::size_t cap = (g() % 4 == 0) ? 0 : (g() % 40000);
    const auto plan = plan_buckets(sizes, cap);
    std::size_t end = L, offset_end = std::accumulate(sizes.begin(), sizes.end(), std::size_t{0});
    for (std::size_t b = 0; b < plan.size(); ++b) {
      const auto& p = plan[b];
      REQUIRE(p.index == b);
      REQUIRE(p.end_layer == end);  // contiguous, from the last layer backwards
      REQUIRE(p.first_layer < p.end_layer);
      std::size_t elems = 0;
      for (std::size_t l = p.first_layer; l < p.end_layer; ++l) elems += sizes[l];
      REQUIRE(p.size == elems);
      REQUIRE(p.offset + p.size == offset_end);
      const std::size_t bytes = elems * sizeof(float);
      const std::size_t without_first = bytes - sizes[p.first_layer] * sizeof(float);
      if (p.first_layer > 0) REQUIRE(bytes >= cap);  // only the bucket holding layer 0 may stay below
      REQUIRE((without_first < cap || p.end_layer - p.first_layer == 1));  // minimal
      end = p.first_layer;
      offset_end = p.offset;
    }
    REQUIRE(end == 0);
  }
  REQUIRE_THROWS_AS(plan_buckets(std::vector<std::size_t>{}, 10), invalid_argument);
  REQUIRE_THROWS_AS(plan_buckets(std::vector<std::size_t>{3, 0, 2}, 10), invalid_argument);
}

TEMPLATE_TEST_CASE("Bucketed: overlapped, not overlapped and bucket by bucket by hand agree bit for bit",
                   "[train][overlap]", dense_kind, topk_kind, gtopk_kind, power_kind) {
  const int P = GENERATE(1, 2, 3, 4);
  const std::size_t cap = GENERATE(std::size_t{0}, std::size_t{600}, std::size_t{1} << 20);
  const std::size_t n = model_size();
  std::vector<int> ok(P, 0);
  run_threads(P, [&](ThreadComm& comm) {
    const int r = comm.rank();
    auto overlapped = make_bucketed<TestType>(comm, cap);
    auto plain = make_bucketed<TestType>(comm, cap);
    std::vector<typename TestType::type> by_hand;
    for (std::size_t b = 0; b < plain.buckets(); ++b) by_hand.push_back(TestType::make(comm, plain.bucket(b)));
    bool good = overlapped.buckets() == plain.buckets();
    for (int step = 0; step < 4; ++step) {
      auto g1 = gradient(r, step, n), g2 = g1, g3 = g1;
      overlapped.begin(g1);
      for (auto l : ready_order(static_cast<std::uint64_t>(step), kShapes.size())) overlapped.ready(l);
      good = good && overlapped.reduce(g1);
      good = good && plain.reduce(g2);
      for (std::size_t b = 0; b < by_hand.size(); ++b) {
        const auto& i = plain.bucket(b);
        by_hand[b].reduce(std::span<float>(g3).subspan(i.offset, i.size));
      }
      good = good && g1 == g2 && g2 == g3;
    }
    std::vector<std::byte> s1, s2;
    overlapped.save_state(s1);
    plain.save_state(s2);
    ok[r] = good && s1 == s2;
  });
  for (int r = 0; r < P; ++r) REQUIRE(ok[r] == 1);
}

TEST_CASE("Bucketed Dense equals unbucketed Dense bit for bit", "[train][overlap]") {
  const int P = GENERATE(2, 3);
  const std::size_t n = model_size();
  std::vector<int> ok(P, 0);
  run_threads(P, [&](ThreadComm& comm) {
    auto b = make_bucketed<dense_kind>(comm, 256);
    Dense<ThreadComm> whole{comm};
    auto g1 = gradient(comm.rank(), 0, n), g2 = g1;
    b.begin(g1);
    for (std::size_t l = kShapes.size(); l-- > 0;) b.ready(l);
    b.reduce(g1);
    whole.reduce(g2);
    ok[comm.rank()] = b.buckets() > 2 && g1 == g2;
  });
  for (int r = 0; r < P; ++r) REQUIRE(ok[r] == 1);
}

// begin(), ready() for every layer, then finish() and commit() (no start()): finish()
// starts what ready() did not, at a held step (the first: its buckets agree first) as at
// a later one, so both steps equal reduce()'s.
TEST_CASE("Bucketed: begin, ready and finish without start reduce every bucket, at the first step and after",
          "[train][overlap]") {
  const int P = 3;
  const std::size_t n = model_size();
  std::vector<int> ok(P, 0);
  run_threads(P, [&](ThreadComm& comm) {
    auto b = make_bucketed<dense_kind>(comm, 256), ref = make_bucketed<dense_kind>(comm, 256);
    bool good = b.buckets() > 2;
    for (int t = 0; t < 2; ++t) {
      auto g = gradient(comm.rank(), t, n), h = g;
      b.begin(g);
      for (std::size_t l = kShapes.size(); l-- > 0;) b.ready(l);
      good = good && b.finish();
      b.commit();
      good = good && ref.reduce(h) && g == h;
    }
    ok[comm.rank()] = good && b.compressor(0).steps() == 2;
  });
  for (int r = 0; r < P; ++r) REQUIRE(ok[r] == 1);
}

// The bytes of Bucketed<Dense>, exactly: each bucket's Dense (its ring allreduce of the
// bucket's floats and its 6-float step check every step, its 3-int64 first-step
// agreement) plus Bucketed's own 7-int64 agreement, once. So over S steps it sends
//   sum_b [S (ring(n_b) + ring(6 floats)) + ring(3 int64)] + ring(7 int64)
// where unbucketed Dense sends S (ring(n) + ring(6 floats)) + ring(3 int64): the demo's
// extra bytes with --overlap (docs/communicators.md). With and without overlap alike.
TEST_CASE("Bucketed<Dense> sends each bucket's Dense bytes plus its one agreement, exactly", "[train][overlap]") {
  const int P = GENERATE(2, 3, 4);
  const bool overlap = GENERATE(false, true);
  const int S = 5;
  const std::vector<std::size_t> layers = layer_sizes();
  const std::size_t n = model_size(), cap = 256;
  const auto plan = plan_buckets(layers, cap);
  REQUIRE(plan.size() > 2);
  std::vector<std::uint64_t> sent(P), expect(P), whole(P), whole_expect(P);
  run_threads(P, [&](ThreadComm& comm) {
    using Counted = CountingComm<ThreadComm>;
    Counted counted{comm}, counted_whole{comm};
    Bucketed<Dense<Counted>> b{layers, [&](const bucket_info&) { return Dense<Counted>{counted}; }, {.cap_bytes = cap}};
    Dense<Counted> d{counted_whole};
    for (int t = 0; t < S; ++t) {
      auto g = gradient(comm.rank(), t, n), g2 = g;
      if (overlap) {
        b.begin(g);
        for (std::size_t l = layers.size(); l-- > 0;) b.ready(l);
      }
      b.reduce(g);
      d.reduce(g2);
    }
    const int r = comm.rank();
    auto ring = [&](std::uint64_t m, std::uint64_t esz) { return wire::ring_allreduce(r, P, m, esz).bytes_sent; };
    std::uint64_t e = ring(7, 8);
    for (const auto& bk : plan) e += S * (ring(bk.size, 4) + ring(6, 4)) + ring(3, 8);
    sent[r] = counted.stats().bytes_sent;
    expect[r] = e;
    whole[r] = counted_whole.stats().bytes_sent;
    whole_expect[r] = S * (ring(n, 4) + ring(6, 4)) + ring(3, 8);
  });
  for (int r = 0; r < P; ++r) {
    CHECK(sent[r] == expect[r]);
    CHECK(whole[r] == whole_expect[r]);
  }
}

namespace {
template <class K, class Policy>
std::vector<float> train(int P, Policy policy, bool overlap, int steps, std::vector<std::int64_t>* rounds) {
  const std::size_t n = model_size();
  std::vector<std::vector<float>> finals(P);
  std::vector<std::int64_t> rs(P);
  run_threads(P, [&](ThreadComm& comm) {
    const int r = comm.rank();
    DataParallel dp{make_bucketed<K>(comm, 700), policy, steps};
    Sgd opt{n, {.momentum = 0.9}};
    std::vector<float> params(n, 0.5f);
    for (int t = 0; t < steps; ++t) {
      const double lr = 0.05 / (1 + t);
      auto g = gradient(r, t, n);
      for (std::size_t i = 0; i < n; ++i) g[i] += 0.1f * params[i];
      if (overlap) {
        dp.begin_backward(g, lr);
        for (auto l : ready_order(static_cast<std::uint64_t>(t) + 99, kShapes.size())) dp.grad_ready(l);
      }
      dp.step(params, g, lr, opt);
    }
    finals[r] = params;
    rs[r] = dp.rounds();
  });
  for (int r = 1; r < P; ++r) REQUIRE(finals[r] == finals[0]);
  if (rounds) *rounds = rs;
  return finals[0];
}
}  // namespace

TEMPLATE_TEST_CASE("DataParallel with overlap gives the parameters of the plain step, bit for bit",
                   "[train][overlap]", dense_kind, gtopk_kind, power_kind) {
  const int P = GENERATE(2, 3);
  std::vector<std::int64_t> r1, r2;
  REQUIRE(train<TestType>(P, EveryStep{}, true, 6, &r1) == train<TestType>(P, EveryStep{}, false, 6, &r2));
  REQUIRE(r1 == r2);
}

TEST_CASE("DataParallel with overlap under Local SGD and QSR: local steps start nothing, results unchanged",
          "[train][overlap]") {
  std::vector<std::int64_t> r1, r2;
  REQUIRE(train<dense_kind>(3, LocalSgd{3}, true, 10, &r1) == train<dense_kind>(3, LocalSgd{3}, false, 10, &r2));
  REQUIRE(r1 == r2);
  REQUIRE(train<dense_kind>(2, QSRPolicy{0.05, 2, 3}, true, 12, &r1) ==
          train<dense_kind>(2, QSRPolicy{0.05, 2, 3}, false, 12, &r2));
  REQUIRE(r1 == r2);
}

TEST_CASE("Bucketed: a NaN in one bucket raises on every rank and rolls every bucket back", "[train][overlap]") {
  const int P = 3;
  const std::size_t n = model_size();
  const bool overlap = GENERATE(true, false);
  const std::size_t where = GENERATE(std::size_t{0}, model_size() - 3);  // last bucket, first bucket
  std::vector<int> raised(P, 0), same_state(P, 0), recovers(P, 0);
  run_threads(P, [&](ThreadComm& comm) {
    const int r = comm.rank();
    auto faulty = make_bucketed<topk_kind>(comm, 200);
    auto clean = make_bucketed<topk_kind>(comm, 200);
    auto g = gradient(r, 0, n), h = g;
    faulty.reduce(g);
    clean.reduce(h);
    std::vector<std::byte> before;
    faulty.save_state(before);
    auto bad = gradient(r, 1, n);
    if (r == 1) bad[where] = std::numeric_limits<float>::quiet_NaN();
    try {
      if (overlap) {
        faulty.begin(bad);
        for (std::size_t l = kShapes.size(); l-- > 0;) faulty.ready(l);
      }
      faulty.reduce(bad);
    } catch (const numeric_error&) {
      raised[r] = 1;
    }
    std::vector<std::byte> after;
    faulty.save_state(after);
    same_state[r] = before == after && !faulty.in_flight();
    bool good = true;
    for (int step = 2; step < 5; ++step) {
      auto a = gradient(r, step, n), b = a;
      faulty.reduce(a);
      clean.reduce(b);
      good = good && a == b;
    }
    recovers[r] = good;
  });
  for (int r = 0; r < P; ++r) {
    REQUIRE(raised[r] == 1);
    REQUIRE(same_state[r] == 1);
    REQUIRE(recovers[r] == 1);
  }
}

TEST_CASE("Bucketed: a skipped step in one bucket returns false and rolls every bucket back", "[train][overlap]") {
  const int P = 2;
  const std::size_t n = model_size();
  std::vector<int> ok(P, 0);
  run_threads(P, [&](ThreadComm& comm) {
    const int r = comm.rank();
    auto make = [&] {
      return Bucketed<TopK<ThreadComm>>{
          layer_sizes(),
          [&](const bucket_info&) {
            return TopK<ThreadComm>{comm, {.density = 0.1, .on_nonfinite = nonfinite::skip_step}};
          },
          {.cap_bytes = 200}};
    };
    auto b = make();
    auto g = gradient(r, 0, n);
    b.reduce(g);
    std::vector<std::byte> before, after;
    b.save_state(before);
    auto bad = gradient(r, 1, n);
    bad[0] = std::numeric_limits<float>::infinity();  // layer 0: the last bucket, after the others ran
    b.begin(bad);
    for (std::size_t l = kShapes.size(); l-- > 0;) b.ready(l);
    const bool sent = b.reduce(bad);
    b.save_state(after);
    ok[r] = !sent && before == after && b.buckets() >= 3;
  });
  for (int r = 0; r < P; ++r) REQUIRE(ok[r] == 1);
}

TEST_CASE("Bucketed and DataParallel reject misuse with clear errors", "[train][overlap]") {
  run_threads(1, [&](ThreadComm& comm) {
    auto b = make_bucketed<dense_kind>(comm, 600);
    std::vector<float> g(model_size(), 1.f), other(model_size(), 1.f), short_g(5, 1.f);
    REQUIRE_THROWS_AS(b.begin(short_g), invalid_argument);
    b.begin(g);
    REQUIRE_THROWS_AS(b.begin(g), invalid_argument);
    REQUIRE_THROWS_AS(b.ready(kShapes.size()), invalid_argument);
    b.ready(5);
    REQUIRE_THROWS_AS(b.ready(5), invalid_argument);
    REQUIRE_THROWS_AS(b.reduce(other), invalid_argument);
    std::vector<std::byte> blob;
    REQUIRE_THROWS_AS(b.save_state(blob), invalid_argument);  // the worker may be writing the state
    REQUIRE(b.in_flight());
    b.cancel();
    REQUIRE(!b.in_flight());
    REQUIRE(b.reduce(g));

    DataParallel dp{make_bucketed<dense_kind>(comm, 600), EveryStep{}, 3};
    Sgd opt{model_size()};
    std::vector<float> p(model_size(), 0.f);
    dp.begin_backward(g, 0.1);
    REQUIRE_THROWS_AS(dp.begin_backward(g, 0.1), invalid_argument);
    REQUIRE_THROWS_AS(dp.step(p, g, 0.2, opt), invalid_argument);  // lr differs from begin_backward's
    REQUIRE(dp.steps() == 0);
    REQUIRE(!dp.compressor().in_flight());  // the failed step ended the buckets
    dp.begin_backward(g, 0.1);
    for (std::size_t l = 0; l < kShapes.size(); ++l) dp.grad_ready(l);
    REQUIRE(dp.step(p, g, 0.1, opt));
    REQUIRE(dp.steps() == 1);
  });
}

TEST_CASE("Bucketed: a rank that fails during backward makes the others raise instead of waiting",
          "[train][overlap]") {
  const int P = 3;
  std::vector<int> peer_failed(P, 0);
  REQUIRE_THROWS(run_threads(
      P,
      [&](ThreadComm& comm) {
        const int r = comm.rank();
        auto g = gradient(r, 0, model_size());  // outlives b: buckets in flight write into it
        auto b = make_bucketed<dense_kind>(comm, 200);  // buckets {4, 5}, {2, 3}, {0, 1}
        auto w = gradient(r, 1, model_size());
        b.reduce(w);  // a first step: buckets start during backward from the second step on
        b.begin(g);
        b.ready(5);
        b.ready(4);  // bucket 0 is in flight on every rank
        if (r == 2) throw std::runtime_error("rank 2 failed in backward");
        for (std::size_t l = 4; l-- > 0;) b.ready(l);
        try {
          b.reduce(g);
        } catch (const peer_failure&) {
          peer_failed[r] = 1;
          throw;
        }
      },
      {.timeout = std::chrono::seconds(20)}));
  REQUIRE(peer_failed[0] == 1);
  REQUIRE(peer_failed[1] == 1);
}
