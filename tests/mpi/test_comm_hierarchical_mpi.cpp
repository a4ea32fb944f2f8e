// HierarchicalComm over MpiComm: the two-level allreduce against a serial reference for
// every node layout of the world (1 rank per node up to one node), integer-valued inputs
// exactly, real inputs within rounding, the same bits on every rank, min and max, other
// lengths than multiples of the node size, nodes of equal and unequal size; Dense runs over
// it; a rank whose length differs makes every rank raise instead of hang.
// commpact-mpi-ranks: 1 2 3 4 6
// hierarchical_comm.hpp before mpi_comm.hpp: hierarchical_mpi is declared in either order.
#include <commpact/comm/hierarchical_comm.hpp>
#include <commpact/comm/mpi_comm.hpp>
#include <commpact/compress/compressors/dense.hpp>

#include <cmath>
#include <cstring>

#include "common/collective_checks.hpp"

using namespace commpact;
using namespace std::chrono_literals;

static_assert(PointToPoint<HierarchicalComm<MpiComm>>);

namespace {

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int p = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  return p;
}

// Node of each rank for a layout of `per_node` consecutive ranks per node (the last node
// may be smaller), or round-robin over `nodes` when interleaved.
int node_of(int rank, int per_node, bool interleaved, int P) {
  const int nodes = (P + per_node - 1) / per_node;
  return interleaved ? rank % nodes : rank / per_node;
}

// Every rank's 64-bit hash of v, gathered: all equal means the same bits on every rank.
bool same_bits_everywhere(MpiComm& world, const std::vector<float>& v) {
  std::uint64_t h = 1469598103934665603ull;
  for (float x : v) {
    std::uint32_t b;
    std::memcpy(&b, &x, 4);
    h = (h ^ b) * 1099511628211ull;
  }
  std::vector<std::uint64_t> all(static_cast<std::size_t>(world.size()));
  world.allgather(std::span<const std::uint64_t>(&h, 1), std::span(all));
  for (auto x : all)
    if (x != all[0]) return false;
  return true;
}

}  // namespace

TEST_CASE("HierarchicalComm: allreduce equals the serial reference on every node layout", "[hierarchical][mpi]") {
  const int P = world_size(), me = world_rank();
  const int per_node = GENERATE(1, 2, 3, 4);
  const bool interleaved = GENERATE(false, true);
  const std::size_t n = GENERATE(std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{100003});
  CAPTURE(P, per_node, interleaved, n);
  auto h = hierarchical_mpi(MPI_COMM_WORLD, node_of(me, per_node, interleaved, P), {.timeout = 20s});
  MpiComm world{MPI_COMM_WORLD};

  // Integer-valued floats: every summation order gives the exact sum.
  auto x = commpact_test::rank_floats(11 + n, me, n, /*integral=*/true);
  std::vector<float> ref(n, 0.0f), lo(n, 1e30f), hi(n, -1e30f);
  for (int r = 0; r < P; ++r) {
    const auto y = commpact_test::rank_floats(11 + n, r, n, true);
    for (std::size_t i = 0; i < n; ++i) ref[i] += y[i], lo[i] = std::min(lo[i], y[i]), hi[i] = std::max(hi[i], y[i]);
  }
  auto s = x, mn = x, mx = x;
  h.allreduce(std::span(s), reduce_op::sum);
  h.allreduce(std::span(mn), reduce_op::min);
  h.allreduce(std::span(mx), reduce_op::max);
  CHECK(s == ref);
  CHECK(mn == lo);
  CHECK(mx == hi);

  // Real values: within rounding of a double reference, and the same bits everywhere.
  auto g = commpact_test::rank_floats(97 + n, me, n);
  std::vector<double> dref(n, 0.0);
  for (int r = 0; r < P; ++r) {
    const auto y = commpact_test::rank_floats(97 + n, r, n);
    for (std::size_t i = 0; i < n; ++i) dref[i] += y[i];
  }
  h.allreduce(std::span(g));
  for (std::size_t i = 0; i < n; ++i) REQUIRE(std::abs(g[i] - dref[i]) <= 1e-5 * P);
  CHECK(same_bits_everywhere(world, g));

  // int64 and double go the same way.
  std::vector<std::int64_t> iv(n, me + 1);
  h.allreduce(std::span(iv));
  CHECK(iv == std::vector<std::int64_t>(n, std::int64_t{P} * (P + 1) / 2));
}

TEST_CASE("HierarchicalComm: Dense over it averages like Dense over the world", "[hierarchical][mpi]") {
  const int P = world_size(), me = world_rank();
  auto h = hierarchical_mpi(MPI_COMM_WORLD, me / 2);
  Dense<HierarchicalComm<MpiComm>> dense{h};
  auto g = commpact_test::rank_floats(5, me, 4099, true);
  std::vector<float> ref(g.size(), 0.0f);
  for (int r = 0; r < P; ++r) {
    const auto y = commpact_test::rank_floats(5, r, g.size(), true);
    for (std::size_t i = 0; i < g.size(); ++i) ref[i] += y[i];
  }
  for (auto& v : ref) v = v / static_cast<float>(P);  // the one mean (kernels/mean.hpp)
  dense.reduce(std::span(g));
  CHECK(g == ref);
}

TEST_CASE("HierarchicalComm: ranks that disagree on the length raise on every rank", "[hierarchical][mpi]") {
  const int P = world_size(), me = world_rank();
  if (P < 2) return;
  auto h = hierarchical_mpi(MPI_COMM_WORLD, me / 2, {.timeout = 10s});
  std::vector<float> v(me == 0 ? 10 : 12, 1.0f);
  CHECK_THROWS_AS(h.allreduce(std::span(v)), commpact::error);
}

TEST_CASE("HierarchicalComm: a cross communicator that does not fit the nodes is refused", "[hierarchical][mpi]") {
  const int P = world_size();
  if (P < 2) return;
  MpiComm world{MPI_COMM_WORLD};
  MpiComm self{MPI_COMM_SELF};
  // nodes of one rank each, so the cross communicator must hold P ranks, not 1
  CHECK_THROWS_AS((HierarchicalComm<MpiComm>{world, self, self}), invalid_argument);
}
