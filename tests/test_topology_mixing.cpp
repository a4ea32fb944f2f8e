// The five topologies (Ring, Torus2D, Hypercube, Exponential, Complete): the mixing
// matrix is symmetric, doubly stochastic and non-negative, neighbours agree with the
// weights, bad ranks and sizes are errors, and the spectral gaps are ordered.
#include <catch2/catch.hpp>

#include <commpact/concepts.hpp>
#include <commpact/topology/complete.hpp>
#include <commpact/topology/exponential.hpp>
#include <commpact/topology/hypercube.hpp>
#include <commpact/topology/ring.hpp>
#include <commpact/topology/torus.hpp>

#include <Eigen/Dense>

#include <algorithm>
#include <cmath>
#include <string>

using namespace commpact;

static_assert(Topology<Ring> && Topology<Torus2D> && Topology<Hypercube> && Topology<Exponential> &&
              Topology<Complete>);

namespace {

template <class T>
Eigen::MatrixXd mixing_matrix(const T& t) {
  const int P = t.size();
  Eigen::MatrixXd W(P, P);
  for (int i = 0; i < P; ++i)
    for (int j = 0; j < P; ++j) W(i, j) = t.weight(i, j);
  return W;
}

//! Second-largest |eigenvalue| of the symmetric mixing matrix (1 - spectral gap).
template <class T>
double second_eigenvalue(const T& t) {
  const auto W = mixing_matrix(t);
  Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> es(W);
  Eigen::VectorXd ev = es.eigenvalues().cwiseAbs();
  std::vector<double> v(ev.data(), ev.data() + ev.size());
  std::sort(v.rbegin(), v.rend());
  return v.size() > 1 ? v[1] : 0.0;
}

template <class T>
void check_mixing(const T& t) {
  const int P = t.size();
  const auto W = mixing_matrix(t);
  INFO("P = " << P);
  for (int i = 0; i < P; ++i) {
    CHECK(std::abs(W.row(i).sum() - 1.0) < 1e-12);
    CHECK(std::abs(W.col(i).sum() - 1.0) < 1e-12);
    for (int j = 0; j < P; ++j) {
      CHECK(W(i, j) == W(j, i));
      CHECK(W(i, j) >= 0.0);
    }
    const auto& nb = t.neighbors(i);
    CHECK(std::is_sorted(nb.begin(), nb.end()));
    CHECK(std::find(nb.begin(), nb.end(), i) == nb.end());
    for (int j = 0; j < P; ++j) {
      if (j == i) continue;
      const bool listed = std::find(nb.begin(), nb.end(), j) != nb.end();
      CHECK(listed == (W(i, j) > 0.0));
    }
    CHECK(W(i, i) > 0.0);  // Metropolis keeps a positive self weight: no periodic mixing
  }
  CHECK_THROWS_AS(t.neighbors(P), invalid_argument);
  CHECK_THROWS_AS(t.neighbors(-1), invalid_argument);
  CHECK_THROWS_AS(t.weight(0, P), invalid_argument);
  CHECK_THROWS_AS(t.weight(-1, 0), invalid_argument);
}

}  // namespace

TEST_CASE("every topology has a symmetric doubly-stochastic non-negative mixing matrix", "[topology]") {
  const int P = GENERATE(1, 2, 3, 4, 5, 6, 8, 9, 12, 16, 17, 32);
  check_mixing(Ring(P));
  check_mixing(Torus2D(P));
  check_mixing(Hypercube(P));
  check_mixing(Exponential(P));
  check_mixing(Complete(P));
}

TEST_CASE("standard weights: ring 1/3, torus 1/5, complete 1/P", "[topology]") {
  Ring ring(8);
  CHECK(ring.weight(0, 1) == Approx(1.0 / 3));
  CHECK(ring.weight(0, 0) == Approx(1.0 / 3));
  CHECK(ring.neighbors(0) == std::vector<int>{1, 7});

  Torus2D torus(4, 4);
  CHECK(torus.weight(5, 5) == Approx(0.2));
  CHECK(torus.neighbors(5) == std::vector<int>{1, 4, 6, 9});
  CHECK(torus.neighbors(0) == std::vector<int>{1, 3, 4, 12});
  for (int j : torus.neighbors(0)) CHECK(torus.weight(0, j) == Approx(0.2));

  Complete c(5);
  for (int i = 0; i < 5; ++i)
    for (int j = 0; j < 5; ++j) CHECK(c.weight(i, j) == Approx(0.2));

  Exponential e(16);
  CHECK(e.neighbors(0) == std::vector<int>{1, 2, 4, 8, 12, 14, 15});
  CHECK(e.degree(3) == 7);
}

TEST_CASE("Torus2D(P) picks a near-square grid", "[topology]") {
  CHECK(Torus2D(16).rows() == 4);
  CHECK(Torus2D(16).cols() == 4);
  CHECK(Torus2D(12).rows() == 3);
  CHECK(Torus2D(12).cols() == 4);
  CHECK(Torus2D(8).rows() == 2);
  CHECK(Torus2D(8).cols() == 4);
  CHECK(Torus2D(7).rows() == 1);  // prime: a ring
  CHECK(Torus2D(7).neighbors(0) == Ring(7).neighbors(0));
  CHECK(Torus2D(3, 5).coords(7) == std::pair<int, int>{1, 2});
}

TEST_CASE("P < 1 and bad grids are errors", "[topology]") {
  for (int P : {0, -1}) {
    CHECK_THROWS_AS(Ring(P), invalid_argument);
    CHECK_THROWS_AS(Torus2D(P), invalid_argument);
    CHECK_THROWS_AS(Hypercube(P), invalid_argument);
    CHECK_THROWS_AS(Exponential(P), invalid_argument);
    CHECK_THROWS_AS(Complete(P), invalid_argument);
  }
  CHECK_THROWS_AS(Torus2D(0, 4), invalid_argument);
  CHECK_THROWS_WITH(Torus2D(3, -2), Catch::Contains("3 x -2"));
}

TEST_CASE("spectral gap ordering: complete > exponential, hypercube > torus > ring", "[topology]") {
  const int P = GENERATE(16, 32, 64);
  const double ring = second_eigenvalue(Ring(P));
  const double torus = second_eigenvalue(Torus2D(P));
  const double cube = second_eigenvalue(Hypercube(P));
  const double expo = second_eigenvalue(Exponential(P));
  const double comp = second_eigenvalue(Complete(P));
  INFO("P=" << P << " |lambda_2|: ring " << ring << " torus " << torus << " hypercube " << cube << " exponential "
            << expo << " complete " << comp);
  CHECK(comp < 1e-12);
  CHECK(expo < torus);
  if (P == 16) {
    CHECK(cube == Approx(torus));  // the 4-cube is the 4 x 4 torus
  } else {
    CHECK(cube < torus);
  }
  CHECK(expo < cube);
  CHECK(torus < ring);
  CHECK(ring < 1.0);  // connected
  // Known closed form for the ring: lambda_2 = 1/3 + 2/3 cos(2 pi / P).
  CHECK(ring == Approx(1.0 / 3 + 2.0 / 3 * std::cos(2 * M_PI / P)).epsilon(1e-9));
}
