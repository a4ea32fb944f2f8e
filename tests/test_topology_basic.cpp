// Ring and Hypercube: neighbours, weights (symmetric, doubly stochastic), and the
// recursive-doubling schedule for any P, checked by simulating the data flow.
#include <catch2/catch.hpp>
#include <commpact/topology/hypercube.hpp>
#include <commpact/topology/ring.hpp>

#include <bit>
#include <set>

using namespace commpact;

template <class T>
static void check_weights(const T& t) {
  const int P = t.size();
  for (int i = 0; i < P; ++i) {
    double row = 0;
    for (int j = 0; j < P; ++j) {
      const double w = t.weight(i, j);
      REQUIRE(w >= 0.0);
      REQUIRE(w == t.weight(j, i));
      if (i != j) REQUIRE((w > 0) == t.adjacent(i, j));
      row += w;
    }
    REQUIRE(row == Approx(1.0).epsilon(1e-12));
    const auto& n = t.neighbors(i);
    REQUIRE(std::is_sorted(n.begin(), n.end()));
    REQUIRE(std::find(n.begin(), n.end(), i) == n.end());
  }
}

TEST_CASE("Ring neighbours and weights", "[topology]") {
  const int P = GENERATE(1, 2, 3, 4, 5, 8, 16);
  Ring ring(P);
  REQUIRE(ring.size() == P);
  check_weights(ring);
  for (int i = 0; i < P; ++i) {
    std::set<int> expect;
    if (P > 1) {
      expect.insert((i + 1) % P);
      expect.insert((i + P - 1) % P);
    }
    REQUIRE(std::set<int>(ring.neighbors(i).begin(), ring.neighbors(i).end()) == expect);
    if (P >= 3) REQUIRE(ring.weight(i, (i + 1) % P) == Approx(1.0 / 3));
  }
  if (P == 2) REQUIRE(ring.weight(0, 1) == Approx(0.5));
  if (P == 1) REQUIRE(ring.weight(0, 0) == 1.0);
}

TEST_CASE("Topologies reject bad ranks and sizes", "[topology]") {
  REQUIRE_THROWS_AS(Ring(0), invalid_argument);
  REQUIRE_THROWS_AS(Hypercube(-3), invalid_argument);
  Ring r(4);
  REQUIRE_THROWS_AS(r.neighbors(4), invalid_argument);
  REQUIRE_THROWS_AS(r.weight(-1, 0), invalid_argument);
  Hypercube h(6);
  REQUIRE_THROWS_AS(h.partner(4, 0), invalid_argument);  // extra rank
  REQUIRE_THROWS_AS(h.partner(0, 2), invalid_argument);  // round out of range
  REQUIRE_THROWS_WITH(r.neighbors(9), Catch::Contains("rank 9 is outside [0, 4)"));
}

TEST_CASE("Hypercube recursive doubling reaches every rank for any P", "[topology]") {
  const int P = GENERATE(range(1, 34));
  Hypercube h(P);
  check_weights(h);
  const int p2 = h.core_size();
  REQUIRE(std::has_single_bit(static_cast<unsigned>(p2)));
  REQUIRE(p2 <= P);
  REQUIRE(2 * p2 > P);
  REQUIRE((1 << h.rounds()) == p2);
  // Simulate: each rank holds the set of ranks whose data it has combined.
  std::vector<std::set<int>> have(P);
  for (int r = 0; r < P; ++r) have[r] = {r};
  for (int r = 0; r < P; ++r) {
    const int f = h.fold_partner(r);
    if (h.is_extra(r)) {
      REQUIRE(f == r - p2);
      REQUIRE(h.fold_partner(f) == r);
      have[f].insert(have[r].begin(), have[r].end());
    } else if (f >= 0) {
      REQUIRE(f == r + p2);
    }
  }
  for (int j = 0; j < h.rounds(); ++j) {
    auto next = have;
    for (int r = 0; r < p2; ++r) {
      const int q = h.partner(r, j);
      REQUIRE(h.partner(q, j) == r);
      REQUIRE(h.adjacent(r, q));
      next[r].insert(have[q].begin(), have[q].end());
    }
    have = next;
  }
  for (int r = p2; r < P; ++r) have[r] = have[r - p2];
  for (int r = 0; r < P; ++r) REQUIRE(static_cast<int>(have[r].size()) == P);
}
