// TreeComm<C>: the recursive-doubling schedule with fold/unfold for any P (the authors'
// code crashed at P = 3, 5, 6, 7), moving variable-length payloads; forwarding of the
// Communicator interface.
#include <commpact/comm/thread_comm.hpp>
#include <commpact/comm/tree_comm.hpp>

#include <atomic>

#include "common/sparse_checks.hpp"

using namespace commpact;
using namespace commpact_test;

static_assert(PointToPoint<TreeComm<ThreadComm>>);
static_assert(PointToPoint<TreeComm<CountingComm<ThreadComm>>>);

TEST_CASE("TreeComm schedule: every rank reaches every rank, at most ceil(log2 P) messages", "[comm][tree]") {
  const int P = GENERATE(range(1, 18), 31, 32, 33);
  CAPTURE(P);
  std::atomic<int> done{0};
  REQUIRE_NOTHROW(run_threads(P, [&](ThreadComm& comm) {
    check_tree_union(comm);
    ++done;
  }));
  REQUIRE(done == P);
}

TEST_CASE("TreeComm schedule shape", "[comm][tree]") {
  for (int P = 1; P <= 64; ++P) {
    const Hypercube h(P);
    const int p2 = h.core_size();
    for (int r = 0; r < P; ++r) {
      const auto s = tree_schedule(h, r);
      if (r >= p2) {
        REQUIRE(s.size() == 2);
        REQUIRE(s[0].stage == tree_stage::fold_send);
        REQUIRE(s[0].peer == r - p2);
        REQUIRE(s[1].stage == tree_stage::unfold_recv);
      } else {
        const bool has_extra = r + p2 < P;
        REQUIRE(s.size() == static_cast<std::size_t>(h.rounds() + (has_extra ? 2 : 0)));
        if (has_extra) {
          REQUIRE(s.front().stage == tree_stage::fold_recv);
          REQUIRE(s.back().stage == tree_stage::unfold_send);
          REQUIRE(s.back().peer == r + p2);
        }
      }
    }
  }
}

TEST_CASE("TreeComm forwards the Communicator interface", "[comm][tree]") {
  REQUIRE_NOTHROW(run_threads(3, [](ThreadComm& comm) {
    TreeComm<ThreadComm> t{comm};
    std::vector<float> x(5, 1.0f);
    t.allreduce(std::span<float>(x));
    if (x[0] != 3.0f) throw std::runtime_error("allreduce through TreeComm");
    std::vector<float> all(3);
    const float mine = static_cast<float>(t.rank());
    t.allgather(std::span<const float>(&mine, 1), std::span<float>(all));
    if (all != std::vector<float>{0.0f, 1.0f, 2.0f}) throw std::runtime_error("allgather through TreeComm");
    t.barrier();
  }));
}
