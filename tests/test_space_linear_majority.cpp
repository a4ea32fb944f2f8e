// LinearCompressor<randomk_codec, C> (a LinearCodec + Allreduce<C>) and MajorityVote<C>
// (sign_codec + Vote<C>) over the deferred space: the same object code
// path as host_space, every kernel and collective queued until finish()'s fences.
// Against host_space: the same output bits, residuals and momenta over several steps at
// P = 1, 2, 3, 5 (random-k scaled and unscaled; signSGD and Signum); NaN on one rank
// raises alike and changes nothing; a malformed vote raises wire_error on every rank and
// changes nothing; cancel then retry equals a clean run; no allocation after step one.
#include <catch2/catch.hpp>
#include <commpact/comm/deferred_comm.hpp>
#include <commpact/comm/thread_comm.hpp>
#include <commpact/compress/compressors/linear.hpp>
#include <commpact/compress/compressors/majority.hpp>
#include <commpact/compress/transaction.hpp>

#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <vector>

#include "common/space_copies.hpp"

using namespace commpact;
using namespace commpact_test::deferred_twins;

namespace {
using DC = DeferredComm<ThreadComm>;
using vec = std::vector<float>;

static_assert(Aggregation<Allreduce<ThreadComm>> && Aggregation<Allreduce<DC>>);
static_assert(BlockAggregation<Vote<ThreadComm>> && BlockAggregation<Vote<DC>>);
static_assert(BlockAggregation<Allgather<DC>> && !BlockAggregation<Allreduce<DC>>);
static_assert(Compressor<LinearCompressor<randomk_codec, ThreadComm>> && Compressor<MajorityVote<ThreadComm>>);
// Two-phase: DataParallel and Bucketed no longer snapshot them each step (transaction.hpp).
static_assert(req::two_phase_compressor<LinearCompressor<randomk_codec, ThreadComm>>);
static_assert(req::two_phase_compressor<MajorityVote<ThreadComm>>);

// A ThreadComm whose rank `bad_rank` sends a vote with scale -1 at its allgather number
// `bad_call` (a malformed vote: the header is right, the payload is not).
struct corrupting_comm : ThreadComm {
  corrupting_comm(ThreadComm c, int bad_rank, int bad_call) : ThreadComm(c), bad_rank(bad_rank), bad_call(bad_call) {}
  template <class T>
  void allgather(std::span<const T> in, std::span<T> out) {
    if (rank() == bad_rank && calls++ == bad_call) {
      std::vector<T> copy(in.begin(), in.end());
      const float minus_one = -1.0f;
      std::memcpy(reinterpret_cast<std::byte*>(copy.data()) + 48, &minus_one, 4);
      ThreadComm::allgather(std::span<const T>(copy), out);
      return;
    }
    ThreadComm::allgather(in, out);
  }
  int bad_rank, bad_call, calls = 0;
};

// A LinearCodec that is not a projection (no delivered()): A sums pairs, B spreads half of
// each sum back to both, so error feedback keeps acc - B A acc through linear_feedback's
// approx and dense buffers.
struct pair_codec {
  std::size_t size(std::size_t n) const { return (n + 1) / 2; }
  void compress(std::span<const float> v, std::span<float> out) {
    for (std::size_t j = 0; j < out.size(); ++j) out[j] = v[2 * j] + (2 * j + 1 < v.size() ? v[2 * j + 1] : 0.0f);
  }
  void decompress_add(std::span<const float> in, std::span<float> acc) const {
    for (std::size_t j = 0; j < in.size(); ++j) {
      acc[2 * j] += 0.5f * in[j];
      if (2 * j + 1 < acc.size()) acc[2 * j + 1] += 0.5f * in[j];
    }
  }
};
static_assert(LinearCodec<pair_codec>);
}  // namespace

TEST_CASE("LinearCompressor<user codec without delivered()>: host and deferred alike; the reference mean and "
          "residual",
          "[space][linear]") {
  const int P = GENERATE(1, 2, 3, 5);
  const std::size_t n = 101;  // odd: the last pair has one value
  const int steps = 3;
  CAPTURE(P);
  auto grad = [](int s, int r) { return normal(500 * s + r, n); };
  std::vector<std::vector<vec>> out(P);
  std::vector<vec> res(P);
  std::vector<int> ok(P, 0);
  run_threads(P, [&](ThreadComm& comm) {
    LinearCompressor<pair_codec, ThreadComm> h{comm};
    LinearCompressor<pair_codec, DC> d{DC{comm}};
    const auto e = d.comm().exec();
    bool good = true;
    for (int s = 0; s < steps; ++s) {
      auto g = grad(s, comm.rank());
      auto dg = device_copy(e, g);
      good = good && h.reduce(std::span<float>(g)) && d.reduce(dg.view());
      good = good && same_bits(g, host_copy(e, dg.cview())) && same_bits(h.residual(), host_copy(e, d.residual()));
      out[comm.rank()].push_back(g);
    }
    res[comm.rank()].assign(h.residual().begin(), h.residual().end());
    ok[comm.rank()] = good;
  });
  for (int r = 0; r < P; ++r) CHECK(ok[r] == 1);
  // Reference: acc = e + g; the mean of A acc over the ranks, spread by B; e = acc - B A acc.
  pair_codec k;
  const std::size_t m = k.size(n);
  std::vector<vec> e(P, vec(n, 0.0f));
  for (int s = 0; s < steps; ++s) {
    vec sum(m, 0.0f);
    for (int r = 0; r < P; ++r) {
      const vec g = grad(s, r);
      vec acc(n), c(m), dense(n, 0.0f);
      for (std::size_t i = 0; i < n; ++i) acc[i] = e[r][i] + g[i];
      k.compress(acc, c);
      for (std::size_t j = 0; j < m; ++j) sum[j] += c[j];
      k.decompress_add(c, dense);
      for (std::size_t i = 0; i < n; ++i) e[r][i] = acc[i] - dense[i];
    }
    vec mean(n, 0.0f), mc(m);
    for (std::size_t j = 0; j < m; ++j) mc[j] = sum[j] / float(P);
    k.decompress_add(mc, mean);
    for (int r = 0; r < P; ++r) {
      CHECK(same_bits(out[r][s], out[0][s]));  // the same bits on every rank
      for (std::size_t i = 0; i < n; ++i) CHECK(out[r][s][i] == Approx(mean[i]).margin(1e-5));
    }
  }
  for (int r = 0; r < P; ++r) CHECK(same_bits(res[r], e[r]));  // the residual is local: exact
}

TEST_CASE("LinearCompressor<randomk_codec> over the deferred space equals host_space bit for bit",
          "[space][linear]") {
  const int P = GENERATE(1, 2, 3, 5);
  const bool scaled = GENERATE(false, true);
  const std::size_t n = 777;
  CAPTURE(P, scaled);
  std::vector<int> ok(P, 0);
  run_threads(P, [&](ThreadComm& comm) {
    LinearCompressor<randomk_codec, ThreadComm> h{comm, randomk_codec{0.05, 9, scaled}};
    LinearCompressor<randomk_codec, DC> d{DC{comm}, randomk_codec{0.05, 9, scaled}};
    const auto e = d.comm().exec();
    bool good = true;
    for (int step = 0; step < 4; ++step) {
      auto g = normal(1000 * step + comm.rank(), n);
      auto dg = device_copy(e, g);
      const bool a = h.reduce(std::span<float>(g));
      const bool b = d.reduce(dg.view());
      good = good && a && b && same_bits(g, host_copy(e, dg.cview()));
      good = good && same_bits(h.residual(), host_copy(e, d.residual()));
      good = good && h.residual().size() == (scaled ? 0 : n) && h.steps() == d.steps();
    }
    ok[comm.rank()] = good;
  });
  for (int r = 0; r < P; ++r) CHECK(ok[r] == 1);
}

TEST_CASE("MajorityVote over the deferred space equals host_space bit for bit (signSGD and Signum)",
          "[space][majority]") {
  const int P = GENERATE(1, 2, 3, 5);
  const float beta = GENERATE(0.0f, 0.9f);
  const bool scaled = GENERATE(true, false);
  const std::size_t n = 83;  // not a multiple of 8
  CAPTURE(P, beta, scaled);
  std::vector<int> ok(P, 0);
  run_threads(P, [&](ThreadComm& comm) {
    MajorityVote<ThreadComm> h{comm, {.momentum = beta, .scaled = scaled}};
    MajorityVote<DC> d{DC{comm}, {.momentum = beta, .scaled = scaled}};
    const auto e = d.comm().exec();
    bool good = true;
    for (int step = 0; step < 4; ++step) {
      auto g = normal(1000 * step + comm.rank(), n);
      g[0] = (comm.rank() % 2) ? -1.0f : 1.0f;  // a tie on even P
      auto dg = device_copy(e, g);
      const bool a = h.reduce(std::span<float>(g));
      const bool b = d.reduce(dg.view());
      good = good && a && b && same_bits(g, host_copy(e, dg.cview()));
      good = good && same_bits(h.momentum(), host_copy(e, d.momentum()));
      good = good && h.momentum().size() == (beta > 0.0f ? n : 0) && h.steps() == d.steps();
    }
    ok[comm.rank()] = good;
  });
  for (int r = 0; r < P; ++r) CHECK(ok[r] == 1);
}

TEST_CASE("LinearCompressor and MajorityVote over the deferred space: NaN on one rank raises alike and changes "
          "nothing; skip_step zeroes grad everywhere",
          "[space][linear][majority]") {
  const int P = 3;
  const std::size_t n = 300;
  std::vector<int> ok(P, 0);
  run_threads(P, [&](ThreadComm& comm) {
    LinearCompressor<randomk_codec, DC> lin{DC{comm}, randomk_codec{0.1, 4}};
    LinearCompressor<randomk_codec, DC> lin_skip{DC{comm}, randomk_codec{0.1, 4}, nonfinite::skip_step};
    MajorityVote<DC> vote{DC{comm}, {.momentum = 0.5f}};
    MajorityVote<DC> vote_skip{DC{comm}, {.momentum = 0.5f, .on_nonfinite = nonfinite::skip_step}};
    const auto e1 = lin.comm().exec(), e2 = vote.comm().exec();
    auto g0 = normal(comm.rank(), n);
    auto a = device_copy(e1, g0), b = device_copy(e2, g0);
    lin.reduce(a.view());
    vote.reduce(b.view());
    bool good = true;
    auto bad = normal(50 + comm.rank(), n);
    if (comm.rank() == 1) bad[17] = std::numeric_limits<float>::quiet_NaN();
    {
      const auto res = host_copy(e1, lin.residual());
      auto x = device_copy(e1, bad);
      bool raised = false;
      try {
        lin.reduce(x.view());
      } catch (const numeric_error&) {
        raised = true;
      }
      good = good && raised && same_bits(host_copy(e1, x.cview()), bad);
      good = good && same_bits(host_copy(e1, lin.residual()), res) && lin.steps() == 1 && lin.skipped_steps() == 0;
    }
    {
      const auto m = host_copy(e2, vote.momentum());
      auto x = device_copy(e2, bad);
      bool raised = false;
      try {
        vote.reduce(x.view());
      } catch (const numeric_error&) {
        raised = true;
      }
      good = good && raised && same_bits(host_copy(e2, x.cview()), bad);
      good = good && same_bits(host_copy(e2, vote.momentum()), m) && vote.steps() == 1;
    }
    {
      auto x = device_copy(lin_skip.comm().exec(), bad);
      good = good && !lin_skip.reduce(x.view()) && host_copy(lin_skip.comm().exec(), x.cview()) == vec(n, 0.0f);
      good = good && lin_skip.skipped_steps() == 1 && lin_skip.residual().empty();
      auto y = device_copy(vote_skip.comm().exec(), bad);
      good = good && !vote_skip.reduce(y.view()) && host_copy(vote_skip.comm().exec(), y.cview()) == vec(n, 0.0f);
      good = good && vote_skip.skipped_steps() == 1 && vote_skip.momentum().empty();
    }
    ok[comm.rank()] = good;
  });
  for (int r = 0; r < P; ++r) CHECK(ok[r] == 1);
}

TEST_CASE("MajorityVote: a malformed vote raises wire_error on every rank and changes nothing (host and deferred)",
          "[space][majority]") {
  const int P = 4;
  const std::size_t n = 61;
  std::vector<int> ok(P, 0);
  run_threads(P, [&](ThreadComm& comm) {
    MajorityVote<corrupting_comm> h{corrupting_comm{comm, 2, 1}, {.momentum = 0.5f}};
    MajorityVote<DeferredComm<corrupting_comm>> d{DeferredComm<corrupting_comm>{corrupting_comm{comm, 2, 1}},
                                                  {.momentum = 0.5f}};
    const auto e = d.comm().exec();
    bool good = true;
    auto g = normal(comm.rank(), n);
    auto dg = device_copy(e, g);
    h.reduce(std::span<float>(g));
    d.reduce(dg.view());
    const vec m = host_copy(e, d.momentum());
    good = good && same_bits(h.momentum(), m);
    auto x = normal(10 + comm.rank(), n), y = x;
    auto dy = device_copy(e, y);
    int raised = 0;
    try {
      h.reduce(std::span<float>(x));
    } catch (const wire_error&) {
      ++raised;
    }
    try {
      d.reduce(dy.view());
    } catch (const wire_error&) {
      ++raised;
    }
    good = good && raised == 2 && x == y && same_bits(host_copy(e, dy.cview()), y);
    good = good && same_bits(h.momentum(), m) && same_bits(host_copy(e, d.momentum()), m);
    good = good && h.steps() == 1 && d.steps() == 1;
    // The next step runs (the allgather is clean again) and agrees across the spaces.
    auto dx = device_copy(e, x);
    good = good && h.reduce(std::span<float>(x)) && d.reduce(dx.view()) && same_bits(host_copy(e, dx.cview()), x);
    ok[comm.rank()] = good;
  });
  for (int r = 0; r < P; ++r) CHECK(ok[r] == 1);
}

TEST_CASE("LinearCompressor and MajorityVote over the deferred space: cancel then retry equals a clean run",
          "[space][linear][majority]") {
  const int P = 3;
  const std::size_t n = 200;
  std::vector<int> ok(P, 0);
  run_threads(P, [&](ThreadComm& comm) {
    LinearCompressor<randomk_codec, DC> lin{DC{comm}, randomk_codec{0.1, 4}}, lin_ref{DC{comm}, randomk_codec{0.1, 4}};
    MajorityVote<DC> vote{DC{comm}, {.momentum = 0.9f}}, vote_ref{DC{comm}, {.momentum = 0.9f}};
    bool good = true;
    for (int step = 0; step < 3; ++step) {
      const auto g = normal(100 * step + comm.rank(), n);
      auto x = device_copy(lin.comm().exec(), g), x_ref = device_copy(lin_ref.comm().exec(), g);
      auto y = device_copy(vote.comm().exec(), g), y_ref = device_copy(vote_ref.comm().exec(), g);
      if (step == 1) {  // started and cancelled
        lin.start(x.view());
        lin.cancel();
        vote.start(y.view());
        vote.cancel();
        x = device_copy(lin.comm().exec(), g), y = device_copy(vote.comm().exec(), g);
      }
      if (step == 2) {  // finished and cancelled
        lin.start(x.view());
        good = good && lin.finish();
        lin.cancel();
        vote.start(y.view());
        good = good && vote.finish();
        vote.cancel();
        x = device_copy(lin.comm().exec(), g), y = device_copy(vote.comm().exec(), g);
      }
      lin.reduce(x.view());
      lin_ref.reduce(x_ref.view());
      vote.reduce(y.view());
      vote_ref.reduce(y_ref.view());
      good = good && same_bits(host_copy(lin.comm().exec(), x.cview()), host_copy(lin_ref.comm().exec(), x_ref.cview()));
      good = good && same_bits(host_copy(lin.comm().exec(), lin.residual()),
                               host_copy(lin_ref.comm().exec(), lin_ref.residual()));
      good = good && same_bits(host_copy(vote.comm().exec(), y.cview()), host_copy(vote_ref.comm().exec(), y_ref.cview()));
      good = good && same_bits(host_copy(vote.comm().exec(), vote.momentum()),
                               host_copy(vote_ref.comm().exec(), vote_ref.momentum()));
      good = good && lin.steps() == lin_ref.steps() && vote.steps() == vote_ref.steps();
    }
    ok[comm.rank()] = good;
  });
  for (int r = 0; r < P; ++r) CHECK(ok[r] == 1);
}

TEST_CASE("LinearCompressor and MajorityVote over the deferred space allocate nothing after the first step",
          "[space][linear][majority][alloc]") {
  const int P = 3;
  std::vector<int> ok(P, 0);
  run_threads(P, [&](ThreadComm& comm) {
    LinearCompressor<randomk_codec, DC> plain{DC{comm}, randomk_codec{0.02, 1}};
    LinearCompressor<randomk_codec, DC> scaled{DC{comm}, randomk_codec{0.02, 1, true}};
    MajorityVote<DC> sign{DC{comm}};
    MajorityVote<DC> signum{DC{comm}, {.momentum = 0.9f}};
    auto g1 = device_copy(plain.comm().exec(), normal(comm.rank(), 3000));
    auto g2 = device_copy(scaled.comm().exec(), normal(comm.rank(), 3000));
    auto g3 = device_copy(sign.comm().exec(), normal(comm.rank(), 3000));
    auto g4 = device_copy(signum.comm().exec(), normal(comm.rank(), 3000));
    plain.reduce(g1.view()), scaled.reduce(g2.view()), sign.reduce(g3.view()), signum.reduce(g4.view());
    const auto s1 = plain.workspace_signature(), s2 = scaled.workspace_signature();
    const auto s3 = sign.workspace_signature(), s4 = signum.workspace_signature();
    bool good = true;
    for (int s = 0; s < 3; ++s) {
      plain.reduce(g1.view()), scaled.reduce(g2.view()), sign.reduce(g3.view()), signum.reduce(g4.view());
      good = good && plain.workspace_signature() == s1 && scaled.workspace_signature() == s2;
      good = good && sign.workspace_signature() == s3 && signum.workspace_signature() == s4;
    }
    ok[comm.rank()] = good;
  });
  for (int r = 0; r < P; ++r) CHECK(ok[r] == 1);
}
