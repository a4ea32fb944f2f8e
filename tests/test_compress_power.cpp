// PowerCompressor (PowerSGD) over ThreadComm: low-rank recovery, error-feedback
// conservation, bit-identical results on every rank, exact bytes, warm start, start
// step, state save/restore and bad input. Catch2 assertions run on the main thread
// only: rank threads record what they saw, the test checks it after run_threads. The
// checks that run on any communicator live in tests/common/lowrank_checks.hpp and run
// under MPI too (tests/mpi/test_compress_power_mpi.cpp).
// Multi-rank cases run under CheckedComm<ThreadComm> (tests/common/checked_runs.hpp).
#include <catch2/catch.hpp>

#include <commpact/comm/counting_comm.hpp>
#include <commpact/comm/thread_comm.hpp>
#include <commpact/comm/wire_model.hpp>
#include <commpact/compress/compressors/power.hpp>
#include <commpact/kernels/host/orthogonalize.hpp>

#include <Eigen/Dense>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "common/checked_runs.hpp"
#include "common/lowrank_checks.hpp"

using commpact::PowerCompressor;
using commpact::ThreadComm;
using commpact::tensor_layout;
using commpact::tensor_shape;

static_assert(commpact::Compressor<PowerCompressor<1>>);
static_assert(commpact::Compressor<PowerCompressor<4>>);

namespace {

using RowMat = commpact_test::PowerRowMat;
using commpact_test::low_rank_grad;
using commpact_test::normal;
using commpact_test::numel;
using commpact_test::rank_order_mean;
using commpact_test::rel_err;
const tensor_layout& kLayout = commpact_test::kPowerLayout;
const commpact::thread_options quick{std::chrono::seconds(30)};

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

// Where P = M Q has exact zero rows (a layer's dead units), rounding leaves a dependent
// column's remainder in the same subspace: normalised, it was a unit vector far from
// orthogonal to the others (|A^T A - I| up to 0.8), and P P^T M missed M by as much as M
// (an outside tester: the hook at the rank of a 64 x 64 layer was off by 40% of the
// gradient where PyTorch's was exact). Such columns are zeroed (host::gs_dependent).
TEST_CASE("orthonormalize_columns: columns dependent to rounding are zeroed where P has zero rows",
          "[power][orthogonalize]") {
  const std::size_t n = GENERATE(16, 64, 300);
  const std::size_t s = GENERATE(1, 5, 8);  // the rank of M
  const std::size_t r = n / 2;              // above the n - n / 3 nonzero rows' room for s only
  const std::size_t m = 40;
  CAPTURE(n, s, r);
  // M (n x m, column-major) = sum of s outer products a b^T, a zero in every third row.
  std::vector<float> M(n * m, 0.0f);
  for (std::size_t t = 0; t < s; ++t) {
    auto a = normal(1000 + t, n), b = normal(2000 + t, m);
    for (std::size_t i = 0; i < n; i += 3) a[i] = 0.0f;
    for (std::size_t j = 0; j < m; ++j)
      for (std::size_t i = 0; i < n; ++i) M[j * n + i] += a[i] * b[j];
  }
  const auto Q = normal(3000, m * r);
  Eigen::Map<const Eigen::MatrixXf> Mm(M.data(), static_cast<Eigen::Index>(n), static_cast<Eigen::Index>(m));
  Eigen::Map<const Eigen::MatrixXf> Qm(Q.data(), static_cast<Eigen::Index>(m), static_cast<Eigen::Index>(r));
  Eigen::MatrixXf Pm = Mm * Qm;
  std::vector<float> p(Pm.data(), Pm.data() + n * r);
  const int kept = commpact::host::orthonormalize_columns(std::span<float>(p), n, r);
  CHECK(kept == static_cast<int>(s));
  Eigen::Map<Eigen::MatrixXf> A(p.data(), static_cast<Eigen::Index>(n), static_cast<Eigen::Index>(r));
  Eigen::MatrixXf G = A.transpose() * A;
  for (Eigen::Index j = 0; j < G.rows(); ++j) {
    CAPTURE(j);
    CHECK((G(j, j) == 0.0f || std::abs(G(j, j) - 1.0f) < 1e-5f));  // zeroed, or a unit column
    if (G(j, j) == 0.0f) CHECK(A.col(j).cwiseAbs().maxCoeff() == 0.0f);
  }
  const Eigen::MatrixXf off = G - Eigen::MatrixXf(G.diagonal().asDiagonal());
  CHECK(off.cwiseAbs().maxCoeff() < 1e-5);
  // P P^T is the projection onto the columns of M: P P^T M = M to float precision.
  const double err = (A * (A.transpose() * Mm) - Mm).cwiseAbs().maxCoeff() / Mm.cwiseAbs().maxCoeff();
  CHECK(err < 1e-5);
}

TEST_CASE("PowerSGD at the full rank of a layer with zero rows gives the mean, step after step", "[power]") {
  const std::size_t n = 48, m = 48;
  const int P = 2;
  std::vector<std::vector<float>> g(P, std::vector<float>(n * m, 0.0f));
  std::vector<std::vector<float>> got(P);
  for (int rk = 0; rk < P; ++rk)  // rank 6 per rank, rows 0, 3, 6, ... zero (row-major n x m)
    for (std::size_t t = 0; t < 6; ++t) {
      auto a = normal(100 * rk + t, n), b = normal(100 * rk + 50 + t, m);
      for (std::size_t i = 0; i < n; i += 3) a[i] = 0.0f;
      for (std::size_t i = 0; i < n; ++i)
        for (std::size_t j = 0; j < m; ++j) g[rk][i * m + j] += a[i] * b[j];
    }
  std::vector<double> errs(3 * P, 1.0);
  REQUIRE_NOTHROW(commpact_test::run_checked_threads(
      P,
      [&](commpact_test::checked_thread_comm& comm) {
        commpact::power_options o;
        o.min_compression_rate = 0;
        o.approximation_rank = static_cast<int>(n);
        PowerCompressor<1> c{comm, tensor_layout{{static_cast<std::int64_t>(n), static_cast<std::int64_t>(m)}}, o};
        for (int step = 0; step < 3; ++step) {  // the same gradient: the residual stays 0
          auto x = g[comm.rank()];
          c.reduce(std::span<float>(x));
          double e = 0, big = 0;
          for (std::size_t k = 0; k < n * m; ++k) {
            const double mean = (static_cast<double>(g[0][k]) + g[1][k]) / 2;
            e = std::max(e, std::abs(x[k] - mean));
            big = std::max(big, std::abs(mean));
          }
          errs[3 * comm.rank() + step] = e / big;
        }
      },
      quick));
  for (double e : errs) CHECK(e < 1e-5);
}

TEST_CASE("PowerSGD recovers a mean of exact low rank to float precision", "[power]") {
  const int P = GENERATE(1, 2, 3);
  const int k = GENERATE(1, 2);  // true rank; Rank is 2 or 4 >= k
  CAPTURE(P, k);
  REQUIRE_NOTHROW(commpact_test::run_checked_threads(
      P, [&](commpact_test::checked_thread_comm& comm) { commpact_test::check_power_lowrank_recovery(comm, k); },
      quick));
}

TEST_CASE("PowerSGD below the true rank: lossy per step, but no mass is lost globally", "[power]") {
  const int P = GENERATE(1, 3);
  CAPTURE(P);
  REQUIRE_NOTHROW(commpact_test::run_checked_threads(
      P, [&](commpact_test::checked_thread_comm& comm) { commpact_test::check_power_conservation(comm); }, quick));
}

TEST_CASE("PowerSGD error feedback: residual = (g + e_old) - approximation, exactly as defined", "[power]") {
  const int P = GENERATE(1, 2, 3, 4);
  CAPTURE(P);
  REQUIRE_NOTHROW(commpact_test::run_checked_threads(
      P, [&](commpact_test::checked_thread_comm& comm) { commpact_test::check_power_error_feedback(comm); }, quick));
}

TEST_CASE("PowerSGD results are bit-identical on every rank, whatever the buffer alignment", "[power]") {
  const int P = GENERATE(2, 3, 4, 5);
  CAPTURE(P);
  REQUIRE_NOTHROW(commpact_test::run_checked_threads(
      P, [&](commpact_test::checked_thread_comm& comm) { commpact_test::check_power_bit_identical(comm); }, quick));
}

TEST_CASE("PowerSGD bytes per step: (n + m) r 4 per matrix plus the dense part, exact ring counts", "[power]") {
  const int P = GENERATE(2, 3, 4, 7);
  CAPTURE(P);
  REQUIRE_NOTHROW(commpact_test::run_checked_threads(
      P, [&](commpact_test::checked_thread_comm& comm) { commpact_test::check_power_bytes(comm); }, quick));
}

TEST_CASE("PowerSGD sends dense before start_step, with zero residual", "[power]") {
  const int P = 3;
  std::vector<std::vector<float>> in(P), out(P);
  std::vector<int> residual_zero(P, 0), compressed_differs(P, 0);
  for (int r = 0; r < P; ++r) in[r] = normal(900 + r, numel(kLayout));
  const auto mean = rank_order_mean(in);
  commpact_test::run_checked_threads(P, [&](commpact_test::checked_thread_comm& comm) {
    PowerCompressor<1> c{comm, kLayout, {.start_step = 2}};
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
  commpact_test::run_checked_threads(P, [&](commpact_test::checked_thread_comm& comm) {
    PowerCompressor<2> c{comm, l};
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
  commpact_test::run_checked_threads(P, [&](commpact_test::checked_thread_comm& comm) {
    PowerCompressor<1> a{comm, l};
    auto g = normal(31 + comm.rank(), 620);
    for (int s = 0; s < 3; ++s) {
      auto x = g;
      a.reduce(std::span<float>(x));
    }
    std::vector<std::byte> state;
    a.save_state(state);
    PowerCompressor<1> b{comm, l};
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
    PowerCompressor<1> other{comm, {{20, 30}, {20}}};
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
    PowerCompressor<2> c{comm};
    std::vector<float> g(10);
    CHECK_THROWS_WITH(c.reduce(std::span<float>(g)), Catch::Contains("no tensor shapes registered"));
    CHECK_THROWS_AS(PowerCompressor<2>(comm, tensor_layout{}), commpact::invalid_argument);
  }
  SECTION("buffer length differs from the registered shapes") {
    PowerCompressor<2> c{comm, {{10, 20}, {20}}};
    std::vector<float> g(219);
    CHECK_THROWS_AS(c.reduce(std::span<float>(g)), commpact::invalid_argument);
    CHECK_THROWS_WITH(c.reduce(std::span<float>(g)), Catch::Contains("219") && Catch::Contains("220"));
  }
  SECTION("rank above min(n, m) is clamped per tensor, as PyTorch's hook does") {
    using C4 = PowerCompressor<4>;
    C4 c(comm, {{3, 100}, {50, 60}}, {.min_compression_rate = 0.0});
    CHECK(c.is_compressed(0));
    CHECK(c.rank_of(0) == 3);  // min(4, 3, 100)
    CHECK(c.rank_of(1) == 4);
    CHECK(c.floats_per_step() == (3 + 100) * 3 + (50 + 60) * 4);  // sum (n + m) r + dense
    std::vector<float> g(300 + 3000, 1.0f);
    CHECK_NOTHROW(c.reduce(std::span<float>(g)));
    // The run-time rank overrides the template's default.
    PowerCompressor<2> r1(comm, {{50, 60}}, {.approximation_rank = 1});
    CHECK(r1.rank() == 1);
    CHECK(r1.rank_of(0) == 1);
    CHECK_THROWS_AS(PowerCompressor<2>(comm, {{5, 5}}, {.approximation_rank = -1}), commpact::invalid_argument);
  }
  SECTION("compressed only when (n + m) r * rate < n m, strictly (PyTorch's rule)") {
    // 4 x 4 at rank 1: (4 + 4) * 1 * 2 = 16 = n m, so it is not compressed at rate 2.
    PowerCompressor<1> eq(comm, {{4, 4}});
    CHECK_FALSE(eq.is_compressed(0));
    PowerCompressor<1> below(comm, {{4, 4}}, {.min_compression_rate = 1.99});
    CHECK(below.is_compressed(0));
  }
  SECTION("shapes whose element count overflows raise before allocating") {
    const std::int64_t big = std::int64_t{1} << 32;
    CHECK_THROWS_AS(PowerCompressor<1>(comm, {{big, big}}), commpact::invalid_argument);
    CHECK_THROWS_AS(PowerCompressor<1>(comm, {{std::int64_t{1} << 62, 4}}), commpact::invalid_argument);
    CHECK_THROWS_WITH(PowerCompressor<1>(comm, {{big, big}}), Catch::Contains("more elements than one buffer"));
  }
  SECTION("empty dimension and bad options") {
    CHECK_THROWS_AS(PowerCompressor<1>(comm, {{0, 5}}), commpact::invalid_argument);
    CHECK_THROWS_AS(PowerCompressor<1>(comm, {{5, 5}}, {.min_compression_rate = -1}), commpact::invalid_argument);
    CHECK_THROWS_AS(PowerCompressor<1>(comm, {{5, 5}}, {.start_step = -1}), commpact::invalid_argument);
  }
}

TEST_CASE("PowerSGD: ranks that register different shapes all raise mismatch_error", "[power][errors]") {
  const int P = GENERATE(2, 3);
  CAPTURE(P);
  REQUIRE_NOTHROW(commpact_test::run_checked_threads(
      P, [&](commpact_test::checked_thread_comm& comm) { commpact_test::check_power_shape_mismatch(comm); }, quick));
}

TEST_CASE("PowerSGD: a non-finite gradient on one rank raises on every rank or skips everywhere", "[power][errors]") {
  const int P = 3;
  const tensor_layout l = {{12, 10}, {10}};
  SECTION("raise") {
    REQUIRE_NOTHROW(commpact_test::run_checked_threads(
        P, [&](commpact_test::checked_thread_comm& comm) { commpact_test::check_power_nonfinite_raises(comm); },
        quick));
  }
  SECTION("skip_step keeps the residual and zeroes the gradient") {
    std::vector<int> ok(P, 0);
    commpact_test::run_checked_threads(P, [&](commpact_test::checked_thread_comm& comm) {
      PowerCompressor<1> c{comm, l, {.on_nonfinite = commpact::nonfinite::skip_step}};
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
  // 3 x 3 at rank 2: rate 9 / 12 < 2, so every tensor travels dense; one allreduce of
  // floats, and the step count's (6 floats, compress/step_check.hpp).
  const int P = 3;
  const tensor_layout l = {{5}, {3, 3}};
  std::vector<std::vector<float>> in(P), out(P);
  std::vector<std::uint64_t> collectives(P);
  std::vector<int> state_ok(P);
  for (int r = 0; r < P; ++r) in[r] = normal(50 + r, 14);
  const auto mean = rank_order_mean(in);
  commpact_test::run_checked_threads(P, [&](commpact_test::checked_thread_comm& comm) {
    commpact::CountingComm<commpact_test::checked_thread_comm> counted{comm};
    PowerCompressor<2> c{counted, l};
    auto x = in[comm.rank()];
    c.reduce(std::span<float>(x));
    counted.reset_stats();
    x = in[comm.rank()];
    c.reduce(std::span<float>(x));
    out[comm.rank()] = x;
    collectives[comm.rank()] = counted.stats().collectives;
    std::vector<std::byte> s;
    c.save_state(s);
    PowerCompressor<2> d{counted, l};
    d.load_state(s);
    state_ok[comm.rank()] = d.steps() == 2 && c.floats_per_step() == 14 && !c.is_compressed(1);
  });
  for (int r = 0; r < P; ++r) {
    CHECK(out[r] == mean);
    CHECK(collectives[r] == 2);
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
    commpact_test::run_checked_threads(P, [&](commpact_test::checked_thread_comm& comm) {
      PowerCompressor<2> c{comm, {{n, m}}, {.warm_start = warm}};
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

TEST_CASE("PowerSGD products = blas is accepted on the host and changes nothing: the same bits as exact",
          "[power][products]") {
  // host_space always runs kernels/host/lowrank.hpp's exact order (power_products.hpp):
  // outputs, residuals and Q bit for bit over several steps, with error feedback, warm
  // start and a redrawn start; a state saved with one value loads into the other.
  const int P = GENERATE(1, 3);
  CAPTURE(P);
  const tensor_layout l = {{30, 20}, {20}, {7, 5}, {16, 16}};
  const std::size_t n = 600 + 20 + 35 + 256;
  std::vector<std::vector<float>> exact_out(P), blas_out(P), loaded(P);
  std::vector<std::string> mismatch(P);
  commpact_test::run_checked_threads(P, [&](commpact_test::checked_thread_comm& comm) {
    const int r = comm.rank();
    for (auto products : {commpact::power_products::exact, commpact::power_products::blas}) {
      commpact::power_options opt;
      opt.min_compression_rate = 1.0;
      opt.products = products;
      PowerCompressor<2> c{comm, l, opt};
      auto& out = products == commpact::power_products::exact ? exact_out[r] : blas_out[r];
      for (int s = 0; s < 4; ++s) {
        auto g = normal(100 * s + r, n);
        c.reduce(std::span<float>(g));
        out.insert(out.end(), g.begin(), g.end());
        for (std::size_t i = 0; i < l.size(); ++i) {
          out.insert(out.end(), c.residual(i).begin(), c.residual(i).end());
          out.insert(out.end(), c.q_factor(i).begin(), c.q_factor(i).end());
        }
      }
      // The state does not depend on products: it loads into a compressor with the other value.
      std::vector<std::byte> state;
      c.save_state(state);
      opt.products = products == commpact::power_products::exact ? commpact::power_products::blas
                                                                  : commpact::power_products::exact;
      PowerCompressor<2> other{comm, l, opt};
      other.load_state(state);
      auto g = normal(999 + r, n);
      other.reduce(std::span<float>(g));
      loaded[r].insert(loaded[r].end(), g.begin(), g.end());
    }
    // Ranks that disagree on products all raise mismatch_error (their results would differ on a GPU).
    if (comm.size() > 1) {
      commpact::power_options opt;
      opt.min_compression_rate = 1.0;
      if (r == comm.size() - 1) opt.products = commpact::power_products::blas;
      PowerCompressor<2> c{comm, l, opt};
      auto g = normal(7 + r, n);
      try {
        c.reduce(std::span<float>(g));
      } catch (const commpact::mismatch_error& e) {
        mismatch[r] = e.what();
      }
    }
  });
  for (int r = 0; r < P; ++r) {
    CAPTURE(r);
    REQUIRE(exact_out[r].size() == blas_out[r].size());
    CHECK(std::memcmp(exact_out[r].data(), blas_out[r].data(), exact_out[r].size() * sizeof(float)) == 0);
    REQUIRE(loaded[r].size() == 2 * n);
    CHECK(std::memcmp(loaded[r].data(), loaded[r].data() + n, n * sizeof(float)) == 0);
    if (P > 1) CHECK(mismatch[r].find("PowerCompressor layout") != std::string::npos);
  }
  commpact::power_options bad;
  bad.products = static_cast<commpact::power_products>(7);
  auto comm = ThreadComm::make_world(1)[0];
  CHECK_THROWS_WITH(PowerCompressor<1>(comm, {{5, 5}}, bad), Catch::Contains("power_products::blas"));
}
