// PowerCompressor (PowerSGD) over ThreadComm: low-rank recovery, error-feedback
// conservation, bit-identical results on every rank, exact bytes, warm start, start
// step, state save/restore and bad input. Catch2 assertions run on the main thread
// only: rank threads record what they saw, the test checks it after run_threads.
#include <catch2/catch.hpp>

#include <commpact/comm/counting_comm.hpp>
#include <commpact/comm/thread_comm.hpp>
#include <commpact/comm/wire_model.hpp>
#include <commpact/compress/power.hpp>
#include <commpact/kernels/host/orthogonalize.hpp>

#include <Eigen/Dense>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

using commpact::PowerCompressor;
using commpact::ThreadComm;
using commpact::tensor_layout;
using commpact::tensor_shape;

static_assert(commpact::Compressor<PowerCompressor<1>>);
static_assert(commpact::Compressor<PowerCompressor<4, commpact::CountingComm<ThreadComm>>>);

namespace {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

std::vector<float> normal(std::uint64_t seed, std::size_t n) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

std::size_t numel(const tensor_layout& l) {
  std::size_t n = 0;
  for (auto& s : l) n += static_cast<std::size_t>(s.numel());
  return n;
}

// Rank `rank`'s gradient: tensor t of shape n x m with n, m > 1 is U_t V_{t,rank}^T with
// U_t (n x k) shared by all ranks, so the mean over ranks has rank <= k; vectors are
// random per rank.
std::vector<float> low_rank_grad(const tensor_layout& l, int k, int rank, std::uint64_t seed) {
  std::vector<float> g;
  for (std::size_t t = 0; t < l.size(); ++t) {
    const auto n = l[t].rows, m = l[t].cols;
    if (l[t].is_vector()) {
      auto v = normal(seed * 7919 + t * 31 + rank, static_cast<std::size_t>(n * m));
      g.insert(g.end(), v.begin(), v.end());
      continue;
    }
    auto u = normal(seed * 104729 + t, static_cast<std::size_t>(n * k));
    auto w = normal(seed * 15485863 + t * 131 + rank + 1, static_cast<std::size_t>(m * k));
    Eigen::Map<RowMat> U(u.data(), n, k), W(w.data(), m, k);
    RowMat M = U * W.transpose();
    g.insert(g.end(), M.data(), M.data() + n * m);
  }
  return g;
}

// Mean over ranks summed in rank order then scaled like the compressors do.
std::vector<float> rank_order_mean(const std::vector<std::vector<float>>& per_rank) {
  std::vector<float> s = per_rank[0];
  for (std::size_t r = 1; r < per_rank.size(); ++r)
    for (std::size_t i = 0; i < s.size(); ++i) s[i] += per_rank[r][i];
  const float inv = 1.0f / static_cast<float>(per_rank.size());
  for (auto& x : s) x *= inv;
  return s;
}

double rel_err(std::span<const float> a, std::span<const float> b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / (den > 0 ? den : 1));
}

const tensor_layout kLayout = {{32, 48}, {48}, {8, 6}, {20, 30}, {1, 7}, {64, 27}};

}  // namespace

TEST_CASE("orthonormalize_columns: orthonormal for any rank, zero stays zero", "[power][orthogonalize]") {
  const std::size_t n = GENERATE(1, 5, 64, 300);
  const std::size_t r = GENERATE(1, 2, 4, 16);
  if (r > n) return;
  auto a = normal(n * 100 + r, n * r);
  // Make the columns nearly dependent: each column is the first plus a tiny perturbation.
  for (std::size_t j = 1; j < r; ++j)
    for (std::size_t i = 0; i < n; ++i) a[j * n + i] = a[i] + 1e-3f * a[j * n + i];
  const int kept = commpact::host::orthonormalize_columns(std::span<float>(a), n, r);
  CHECK(kept == static_cast<int>(r));
  Eigen::Map<Eigen::MatrixXf> A(a.data(), static_cast<Eigen::Index>(n), static_cast<Eigen::Index>(r));
  Eigen::MatrixXf G = A.transpose() * A;
  const double dev = (G - Eigen::MatrixXf::Identity(G.rows(), G.cols())).cwiseAbs().maxCoeff();
  INFO("n=" << n << " r=" << r << " max |A^T A - I| = " << dev);
  CHECK(dev < 1e-5);
}

TEST_CASE("orthonormalize_columns: zero matrix and dependent columns give zero columns, never NaN",
          "[power][orthogonalize]") {
  std::vector<float> z(40 * 3, 0.0f);
  CHECK(commpact::host::orthonormalize_columns(std::span<float>(z), 40, 3) == 0);
  for (float x : z) REQUIRE(x == 0.0f);

  // Column 1 == column 0 exactly (a power of two scaling), column 2 independent.
  std::vector<float> a(4 * 3);
  const float c0[4] = {1, 0, 0, 0}, c2[4] = {0, 3, 0, 0};
  for (int i = 0; i < 4; ++i) {
    a[i] = c0[i];
    a[4 + i] = 2 * c0[i];
    a[8 + i] = c2[i];
  }
  CHECK(commpact::host::orthonormalize_columns(std::span<float>(a), 4, 3) == 2);
  const std::vector<float> want = {1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0};
  CHECK(a == want);

  CHECK_THROWS_AS(commpact::host::orthonormalize_columns(std::span<float>(a), 5, 3), commpact::invalid_argument);
}

TEST_CASE("PowerSGD recovers a mean of exact low rank to float precision", "[power]") {
  const int P = GENERATE(1, 2, 3);
  const int k = GENERATE(1, 2);  // true rank; Rank is 2 or 4 >= k
  const int steps = 3;
  std::vector<std::vector<float>> in(P), out2(P), out4(P);
  for (int r = 0; r < P; ++r) in[r] = low_rank_grad(kLayout, k, r, 42);
  const auto mean = rank_order_mean(in);
  std::vector<int> compressed2(kLayout.size()), compressed4(kLayout.size());
  commpact::run_threads(P, [&](ThreadComm& comm) {
    PowerCompressor<2, ThreadComm> c2{comm, kLayout, {.min_compression_rate = 1.0}};
    PowerCompressor<4, ThreadComm> c4{comm, kLayout, {.min_compression_rate = 1.0}};
    for (int s = 0; s < steps; ++s) {
      out2[comm.rank()] = in[comm.rank()];
      out4[comm.rank()] = in[comm.rank()];
      c2.reduce(std::span<float>(out2[comm.rank()]));
      c4.reduce(std::span<float>(out4[comm.rank()]));
    }
    if (comm.rank() == 0)
      for (std::size_t t = 0; t < kLayout.size(); ++t) {
        compressed2[t] = c2.is_compressed(t);
        compressed4[t] = c4.is_compressed(t);
      }
  });
  // Which tensors are compressed: matrices with n m / ((n + m) r) >= 1.
  CHECK(compressed2 == std::vector<int>{1, 0, 1, 1, 0, 1});
  CHECK(compressed4 == std::vector<int>{1, 0, 0, 1, 0, 1});
  std::size_t off = 0;
  for (std::size_t t = 0; t < kLayout.size(); ++t) {
    const auto n = static_cast<std::size_t>(kLayout[t].numel());
    for (int r = 0; r < P; ++r) {
      for (auto* out : {&out2, &out4}) {
        std::span<const float> got((*out)[r].data() + off, n), want(mean.data() + off, n);
        const bool dense = (out == &out2 ? compressed2[t] : compressed4[t]) == 0;
        if (dense) {
          // Dense tensors are the exact rank-order mean.
          REQUIRE(std::equal(got.begin(), got.end(), want.begin()));
        } else {
          INFO("P=" << P << " k=" << k << " tensor " << t << " rank " << r);
          CHECK(rel_err(got, want) < 2e-6);
        }
      }
    }
    off += n;
  }
}

TEST_CASE("PowerSGD below the true rank: lossy per step, but no mass is lost globally", "[power]") {
  // Rank 1 on a rank-3 mean. Per step A_t = P P^T mean_r(M_r), mean_r(e_r) = mean_r(M_r) - A_t,
  // so sum_t A_t + mean_r(e_{r,T}) = sum_t mean_r(g_r).
  const int P = 3, T = 20;
  const tensor_layout l = {{40, 30}};
  std::vector<std::vector<float>> in(P), e(P);
  std::vector<std::vector<double>> sum_out(P);
  std::vector<double> first_err(P);
  for (int r = 0; r < P; ++r) in[r] = low_rank_grad(l, 3, r, 7);
  const auto mean = rank_order_mean(in);
  commpact::run_threads(P, [&](ThreadComm& comm) {
    PowerCompressor<1, ThreadComm> c{comm, l};
    sum_out[comm.rank()].assign(1200, 0.0);
    for (int s = 0; s < T; ++s) {
      auto x = in[comm.rank()];
      c.reduce(std::span<float>(x));
      for (std::size_t i = 0; i < x.size(); ++i) sum_out[comm.rank()][i] += x[i];
      if (s == 0) first_err[comm.rank()] = rel_err(x, mean);
    }
    e[comm.rank()].assign(c.residual(0).begin(), c.residual(0).end());
  });
  CHECK(first_err[0] > 0.1);
  double num = 0, den = 0;
  for (std::size_t i = 0; i < 1200; ++i) {
    double em = 0;
    for (int r = 0; r < P; ++r) em += e[r][i];
    const double d = sum_out[0][i] + em / P - double(T) * mean[i];
    num += d * d;
    den += double(T) * mean[i] * double(T) * mean[i];
  }
  CHECK(std::sqrt(num / den) < 1e-5);
  // The time-averaged output approaches the mean (error feedback at work).
  std::vector<float> avg(1200);
  for (std::size_t i = 0; i < 1200; ++i) avg[i] = static_cast<float>(sum_out[0][i] / T);
  CHECK(rel_err(avg, mean) < 0.1);
}

TEST_CASE("PowerSGD error feedback: residual = (g + e_old) - approximation, exactly as defined", "[power]") {
  const int P = GENERATE(1, 2, 3, 4);
  std::vector<int> failures(P, 0), checked(P, 0);
  commpact::run_threads(P, [&](ThreadComm& comm) {
    PowerCompressor<2, ThreadComm> c{comm, kLayout};
    std::vector<std::vector<float>> e_old(kLayout.size());
    for (int s = 0; s < 6; ++s) {
      auto g = normal(1000 * s + comm.rank() + 17, numel(kLayout));
      const auto g_in = g;
      for (std::size_t t = 0; t < kLayout.size(); ++t) {
        auto e = c.residual(t);
        e_old[t].assign(e.begin(), e.end());
      }
      c.reduce(std::span<float>(g));
      std::size_t off = 0;
      for (std::size_t t = 0; t < kLayout.size(); ++t) {
        const auto n = static_cast<std::size_t>(kLayout[t].numel());
        const auto e = c.residual(t);
        if (c.is_compressed(t)) {
          for (std::size_t i = 0; i < n; ++i) {
            const float M = g_in[off + i] + (s == 0 ? 0.0f : e_old[t][i]);
            const float want = M - g[off + i];
            // approximation + residual = M, bit for bit as the algorithm computes it
            if (std::memcmp(&want, &e[i], sizeof(float)) != 0) ++failures[comm.rank()];
            ++checked[comm.rank()];
          }
        } else if (!e.empty()) {
          ++failures[comm.rank()];
        }
        off += n;
      }
    }
  });
  for (int r = 0; r < P; ++r) {
    CHECK(failures[r] == 0);
    CHECK(checked[r] > 0);
  }
}

TEST_CASE("PowerSGD results are bit-identical on every rank, whatever the buffer alignment", "[power]") {
  const int P = GENERATE(2, 3, 4, 5);
  const std::size_t n = numel(kLayout);
  std::vector<std::vector<float>> outs(P), qs(P);
  commpact::run_threads(P, [&](ThreadComm& comm) {
    PowerCompressor<3, ThreadComm> c{comm, kLayout, {.min_compression_rate = 1.0}};
    // Misalign each rank's buffer differently (offset of rank floats).
    std::vector<float> storage(n + 8);
    std::span<float> g(storage.data() + comm.rank(), n);
    std::vector<float> last;
    for (int s = 0; s < 4; ++s) {
      auto v = normal(77 * s + comm.rank(), n);
      std::copy(v.begin(), v.end(), g.begin());
      c.reduce(g);
    }
    outs[comm.rank()].assign(g.begin(), g.end());
    for (std::size_t t = 0; t < kLayout.size(); ++t) {
      auto q = c.q_factor(t);
      qs[comm.rank()].insert(qs[comm.rank()].end(), q.begin(), q.end());
    }
  });
  for (int r = 1; r < P; ++r) {
    REQUIRE(outs[r].size() == outs[0].size());
    CHECK(std::memcmp(outs[r].data(), outs[0].data(), outs[0].size() * sizeof(float)) == 0);
    CHECK(std::memcmp(qs[r].data(), qs[0].data(), qs[0].size() * sizeof(float)) == 0);
  }
}

TEST_CASE("PowerSGD bytes per step: (n + m) r 4 per matrix plus the dense part, exact ring counts", "[power]") {
  const int P = GENERATE(2, 3, 4, 7);
  constexpr int R = 2;
  std::size_t want_p = 0, want_q = 0, want_d = 0;
  for (auto& s : kLayout) {
    const bool comp = !s.is_vector() && double(s.rows * s.cols) / double((s.rows + s.cols) * R) >= 2.0;
    if (comp) {
      want_p += static_cast<std::size_t>(s.rows) * R;
      want_q += static_cast<std::size_t>(s.cols) * R;
    } else {
      want_d += static_cast<std::size_t>(s.numel());
    }
  }
  std::vector<commpact::comm_stats> step_stats(P), dense_stats(P), warm_stats(P);
  std::vector<std::size_t> floats(P);
  commpact::run_threads(P, [&](ThreadComm& comm) {
    commpact::CountingComm<ThreadComm> counted{comm};
    PowerCompressor<R, commpact::CountingComm<ThreadComm>> c{counted, kLayout, {.start_step = 1}};
    auto g = normal(5 + comm.rank(), numel(kLayout));
    auto x = g;
    c.reduce(std::span<float>(x));  // step 0: dense (+ the one-off layout check)
    dense_stats[comm.rank()] = c.comm().stats();
    c.comm().reset_stats();
    x = g;
    c.reduce(std::span<float>(x));  // step 1: compressed
    step_stats[comm.rank()] = c.comm().stats();
    c.comm().reset_stats();
    x = g;
    c.reduce(std::span<float>(x));  // step 2: compressed, warm
    warm_stats[comm.rank()] = c.comm().stats();
    floats[comm.rank()] = c.floats_per_step();
  });
  for (int r = 0; r < P; ++r) {
    const auto wp = commpact::wire::ring_allreduce(r, P, want_p, 4);
    const auto wq = commpact::wire::ring_allreduce(r, P, want_q, 4);
    const auto wd = commpact::wire::ring_allreduce(r, P, want_d, 4);
    const auto check = commpact::wire::ring_allreduce(r, P, 2, 8);  // require_same on step 0
    const auto full = commpact::wire::ring_allreduce(r, P, numel(kLayout), 4);
    CHECK(floats[r] == want_p + want_q + want_d);
    CHECK(step_stats[r].bytes_sent == wp.bytes_sent + wq.bytes_sent + wd.bytes_sent);
    CHECK(step_stats[r].bytes_received == wp.bytes_received + wq.bytes_received + wd.bytes_received);
    CHECK(step_stats[r].collectives == 3);
    CHECK(warm_stats[r] == step_stats[r]);
    CHECK(dense_stats[r].bytes_sent == full.bytes_sent + check.bytes_sent);
    CHECK(dense_stats[r].collectives == 2);
    // Compressed traffic is well below dense traffic.
    CHECK(step_stats[r].bytes_sent * 2 < full.bytes_sent);
  }
}

TEST_CASE("PowerSGD sends dense before start_step, with zero residual", "[power]") {
  const int P = 3;
  std::vector<std::vector<float>> in(P), out(P);
  std::vector<int> residual_zero(P, 0), compressed_differs(P, 0);
  for (int r = 0; r < P; ++r) in[r] = normal(900 + r, numel(kLayout));
  const auto mean = rank_order_mean(in);
  commpact::run_threads(P, [&](ThreadComm& comm) {
    PowerCompressor<1, ThreadComm> c{comm, kLayout, {.start_step = 2}};
    for (int s = 0; s < 2; ++s) {
      auto x = in[comm.rank()];
      c.reduce(std::span<float>(x));
      out[comm.rank()] = x;
    }
    bool z = true;
    for (std::size_t t = 0; t < kLayout.size(); ++t)
      for (float e : c.residual(t)) z = z && e == 0.0f;
    residual_zero[comm.rank()] = z;
    auto x = in[comm.rank()];
    c.reduce(std::span<float>(x));  // step 2: compressed
    compressed_differs[comm.rank()] = x != mean;
  });
  for (int r = 0; r < P; ++r) {
    CHECK(out[r] == mean);
    CHECK(residual_zero[r]);
    CHECK(compressed_differs[r]);
  }
}

TEST_CASE("PowerSGD on a zero gradient gives zero, no NaN, and recovers afterwards", "[power]") {
  const int P = 2;
  const tensor_layout l = {{24, 16}};
  std::vector<std::vector<float>> zero_out(P), later(P), in(P);
  for (int r = 0; r < P; ++r) in[r] = low_rank_grad(l, 1, r, 3);
  const auto mean = rank_order_mean(in);
  commpact::run_threads(P, [&](ThreadComm& comm) {
    PowerCompressor<2, ThreadComm> c{comm, l};
    for (int s = 0; s < 2; ++s) {
      std::vector<float> z(static_cast<std::size_t>(l[0].numel()), 0.0f);
      c.reduce(std::span<float>(z));
      zero_out[comm.rank()] = z;
    }
    for (int s = 0; s < 2; ++s) {
      auto x = in[comm.rank()];
      c.reduce(std::span<float>(x));
      later[comm.rank()] = x;
    }
  });
  for (int r = 0; r < P; ++r) {
    for (float x : zero_out[r]) REQUIRE(x == 0.0f);
    CHECK(rel_err(later[r], mean) < 2e-6);
  }
}

TEST_CASE("PowerSGD warm start: repeated input converges; state save/load continues bit for bit", "[power]") {
  const int P = 2;
  const tensor_layout l = {{30, 20}, {20}};
  std::vector<std::vector<float>> a_out(P), b_out(P);
  std::vector<std::string> errors(P);
  commpact::run_threads(P, [&](ThreadComm& comm) {
    PowerCompressor<1, ThreadComm> a{comm, l};
    auto g = normal(31 + comm.rank(), 620);
    for (int s = 0; s < 3; ++s) {
      auto x = g;
      a.reduce(std::span<float>(x));
    }
    std::vector<std::byte> state;
    a.save_state(state);
    PowerCompressor<1, ThreadComm> b{comm, l};
    b.load_state(state);
    auto x = g, y = g;
    a.reduce(std::span<float>(x));
    b.reduce(std::span<float>(y));
    a_out[comm.rank()] = x;
    b_out[comm.rank()] = y;
    // Bad states.
    std::string e;
    try {
      b.load_state(std::span<const std::byte>(state).first(state.size() - 4));
    } catch (const commpact::wire_error&) {
      e += "truncated;";
    }
    PowerCompressor<1, ThreadComm> other{comm, {{20, 30}, {20}}};
    try {
      other.load_state(state);
    } catch (const commpact::mismatch_error&) {
      e += "layout;";
    }
    errors[comm.rank()] = e;
  });
  for (int r = 0; r < P; ++r) {
    CHECK(a_out[r] == b_out[r]);
    CHECK(errors[r] == "truncated;layout;");
  }
}

TEST_CASE("PowerSGD bad input raises commpact errors that name the value and the way out", "[power][errors]") {
  auto comm = ThreadComm::make_world(1)[0];
  SECTION("no shapes registered") {
    PowerCompressor<2, ThreadComm> c{comm};
    std::vector<float> g(10);
    CHECK_THROWS_WITH(c.reduce(std::span<float>(g)), Catch::Contains("no tensor shapes registered"));
    CHECK_THROWS_AS(PowerCompressor<2>(comm, tensor_layout{}), commpact::invalid_argument);
  }
  SECTION("buffer length differs from the registered shapes") {
    PowerCompressor<2, ThreadComm> c{comm, {{10, 20}, {20}}};
    std::vector<float> g(219);
    CHECK_THROWS_AS(c.reduce(std::span<float>(g)), commpact::invalid_argument);
    CHECK_THROWS_WITH(c.reduce(std::span<float>(g)), Catch::Contains("219") && Catch::Contains("220"));
  }
  SECTION("rank above min(n, m) for a compressed matrix") {
    using C4 = PowerCompressor<4, ThreadComm>;
    CHECK_THROWS_AS(C4(comm, {{3, 100}}, {.min_compression_rate = 0.0}), commpact::invalid_argument);
    CHECK_THROWS_WITH(C4(comm, {{3, 100}}, {.min_compression_rate = 0.0}),
                      Catch::Contains("r <= min(n, m)") && Catch::Contains("min_compression_rate"));
    // With the default rate such a matrix travels dense: no error.
    C4 ok(comm, {{3, 100}});
    CHECK_FALSE(ok.is_compressed(0));
  }
  SECTION("empty dimension and bad options") {
    CHECK_THROWS_AS(PowerCompressor<1>(comm, {{0, 5}}), commpact::invalid_argument);
    CHECK_THROWS_AS(PowerCompressor<1>(comm, {{5, 5}}, {.min_compression_rate = -1}), commpact::invalid_argument);
    CHECK_THROWS_AS(PowerCompressor<1>(comm, {{5, 5}}, {.start_step = -1}), commpact::invalid_argument);
  }
}

TEST_CASE("PowerSGD: ranks that register different shapes all raise mismatch_error", "[power][errors]") {
  const int P = 3;
  std::vector<std::string> what(P);
  CHECK_THROWS_AS(commpact::run_threads(P,
                                        [&](ThreadComm& comm) {
                                          // Same total length, different shapes on rank 2.
                                          tensor_layout l = comm.rank() == 2 ? tensor_layout{{20, 10}, {10}}
                                                                             : tensor_layout{{10, 20}, {10}};
                                          PowerCompressor<2, ThreadComm> c{comm, l};
                                          std::vector<float> g(210, 1.0f);
                                          try {
                                            c.reduce(std::span<float>(g));
                                          } catch (const commpact::mismatch_error& e) {
                                            what[comm.rank()] = e.what();
                                            throw;
                                          }
                                        }),
                  commpact::mismatch_error);
  for (int r = 0; r < P; ++r) CHECK_THAT(what[r], Catch::Contains("ranks disagree on the PowerCompressor layout"));
}

TEST_CASE("PowerSGD: a non-finite gradient on one rank raises on every rank or skips everywhere", "[power][errors]") {
  const int P = 3;
  const tensor_layout l = {{12, 10}, {10}};
  SECTION("raise") {
    std::vector<int> raised(P, 0);
    CHECK_THROWS_AS(commpact::run_threads(P,
                                          [&](ThreadComm& comm) {
                                            PowerCompressor<1, ThreadComm> c{comm, l};
                                            auto g = normal(comm.rank(), 130);
                                            if (comm.rank() == 1) g[5] = std::nanf("");
                                            try {
                                              c.reduce(std::span<float>(g));
                                            } catch (const commpact::numeric_error&) {
                                              raised[comm.rank()] = 1;
                                              throw;
                                            }
                                          }),
                    commpact::numeric_error);
    for (int r = 0; r < P; ++r) CHECK(raised[r] == 1);
  }
  SECTION("skip_step keeps the residual and zeroes the gradient") {
    std::vector<int> ok(P, 0);
    commpact::run_threads(P, [&](ThreadComm& comm) {
      PowerCompressor<1, ThreadComm> c{comm, l, {.on_nonfinite = commpact::nonfinite::skip_step}};
      auto g = normal(comm.rank() + 10, 130);
      c.reduce(std::span<float>(g));
      auto e0 = std::vector<float>(c.residual(0).begin(), c.residual(0).end());
      auto h = normal(comm.rank() + 20, 130);
      if (comm.rank() == 2) h[120] = INFINITY;  // in the bias: the dense part
      const bool res = c.reduce(std::span<float>(h));
      bool zero = true;
      for (float x : h) zero = zero && x == 0.0f;
      auto e1 = std::vector<float>(c.residual(0).begin(), c.residual(0).end());
      ok[comm.rank()] = !res && zero && e0 == e1 && c.skipped_steps() == 1;
    });
    for (int r = 0; r < P; ++r) CHECK(ok[r] == 1);
  }
}

TEST_CASE("PowerSGD with nothing worth compressing is a packed dense mean", "[power]") {
  // 3 x 3 at rank 2: rate 9 / 12 < 2, so every tensor travels dense; one allreduce.
  const int P = 3;
  const tensor_layout l = {{5}, {3, 3}};
  std::vector<std::vector<float>> in(P), out(P);
  std::vector<std::uint64_t> collectives(P);
  std::vector<int> state_ok(P);
  for (int r = 0; r < P; ++r) in[r] = normal(50 + r, 14);
  const auto mean = rank_order_mean(in);
  commpact::run_threads(P, [&](ThreadComm& comm) {
    commpact::CountingComm<ThreadComm> counted{comm};
    PowerCompressor<2, commpact::CountingComm<ThreadComm>> c{counted, l};
    auto x = in[comm.rank()];
    c.reduce(std::span<float>(x));
    c.comm().reset_stats();
    x = in[comm.rank()];
    c.reduce(std::span<float>(x));
    out[comm.rank()] = x;
    collectives[comm.rank()] = c.comm().stats().collectives;
    std::vector<std::byte> s;
    c.save_state(s);
    PowerCompressor<2, commpact::CountingComm<ThreadComm>> d{counted, l};
    d.load_state(s);
    state_ok[comm.rank()] = d.steps() == 2 && c.floats_per_step() == 14 && !c.is_compressed(1);
  });
  for (int r = 0; r < P; ++r) {
    CHECK(out[r] == mean);
    CHECK(collectives[r] == 1);
    CHECK(state_ok[r] == 1);
  }
}

TEST_CASE("PowerSGD warm start converges to the best rank-r approximation; cold start does not", "[power]") {
  // Every rank feeds g_t = G - e_{t-1}, so M_t = G at every step: with warm start the
  // factors follow subspace iteration on G and A_t tends to G's best rank-2
  // approximation (singular values 1, 0.8, 0.5, 0.25, ...); redrawing Q each step does not.
  const int P = 2, T = 25;
  const Eigen::Index n = 40, m = 30;
  Eigen::MatrixXf U = Eigen::MatrixXf::Random(n, n).householderQr().householderQ();
  Eigen::MatrixXf V = Eigen::MatrixXf::Random(m, m).householderQr().householderQ();
  Eigen::VectorXf s(m);
  for (Eigen::Index i = 0; i < m; ++i) s[i] = i == 0 ? 1.0f : i == 1 ? 0.8f : 0.5f * std::pow(0.5f, float(i - 2));
  RowMat G = U.leftCols(m) * s.asDiagonal() * V.transpose();
  double best = 0;  // |G - G_2|_F^2 = sum_{i >= 2} s_i^2
  for (Eigen::Index i = 2; i < m; ++i) best += double(s[i]) * s[i];
  best = std::sqrt(best);
  std::vector<double> warm_err(T), cold_err(T);
  for (bool warm : {true, false}) {
    auto& err = warm ? warm_err : cold_err;
    commpact::run_threads(P, [&](ThreadComm& comm) {
      PowerCompressor<2, ThreadComm> c{comm, {{n, m}}, {.warm_start = warm}};
      for (int t = 0; t < T; ++t) {
        std::vector<float> g(G.data(), G.data() + n * m);
        const auto e = c.residual(0);
        if (t > 0)
          for (std::size_t i = 0; i < g.size(); ++i) g[i] -= e[i];
        c.reduce(std::span<float>(g));
        Eigen::Map<RowMat> A(g.data(), n, m);
        if (comm.rank() == 0) err[t] = double((G - A).norm());
      }
    });
  }
  INFO("optimal " << best << " warm " << warm_err[0] << " -> " << warm_err[T - 1] << " cold " << cold_err[T - 1]);
  CHECK(warm_err[T - 1] < best * 1.01);
  CHECK(warm_err[T - 1] < 0.8 * warm_err[0]);
  CHECK(cold_err[T - 1] > best * 1.05);
}
