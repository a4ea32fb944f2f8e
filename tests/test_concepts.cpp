// Every shipped model satisfies its concept; types that miss a member do not.
#include <catch2/catch.hpp>
#include <commpact/commpact.hpp>
#include <commpact/compress/compressors/dense.hpp>

using namespace commpact;

static_assert(Communicator<ThreadComm>);
static_assert(PointToPoint<ThreadComm>);
static_assert(PointToPoint<CountingComm<ThreadComm>>);
static_assert(Topology<Ring>);
static_assert(Topology<Hypercube>);
static_assert(Topology<Graph>);
static_assert(Compressor<Dense<ThreadComm>>);
static_assert(Compressor<Dense<CountingComm<ThreadComm>>>);

namespace {
// A communicator that misses abort().
struct NoAbort {
  int rank() const { return 0; }
  int size() const { return 1; }
  template <class T>
  void allreduce(std::span<T>, reduce_op) {}
  template <class T>
  void allgather(std::span<const T>, std::span<T>) {}
  template <class T>
  void broadcast(std::span<T>, int) {}
  void barrier() {}
};
// A communicator with collectives only (no point-to-point exchange).
struct CollectivesOnly : NoAbort {
  void abort(std::string_view) {}
};
struct NoWeights {
  int size() const { return 2; }
  std::vector<int> neighbors(int) const { return {}; }
};
struct NoState {
  void reduce(std::span<float>) {}
};
struct Bsp {
  sync_plan plan(std::int64_t, double) const { return {}; }
};
struct NoPlan {};
}  // namespace

static_assert(Communicator<CollectivesOnly> && !PointToPoint<CollectivesOnly>);
static_assert(!Communicator<NoAbort>);
static_assert(!Topology<NoWeights>);
static_assert(!Compressor<NoState>);
static_assert(SyncPolicy<Bsp> && !SyncPolicy<NoPlan>);
// CountingComm keeps the capabilities of what it wraps.
static_assert(Communicator<CountingComm<CollectivesOnly>> && !PointToPoint<CountingComm<CollectivesOnly>>);

TEST_CASE("concept diagnostics return true for valid models", "[concepts]") {
  STATIC_REQUIRE(diagnose_communicator<ThreadComm>());
  STATIC_REQUIRE(diagnose_point_to_point<ThreadComm>());
  STATIC_REQUIRE(diagnose_topology<Ring>());
  STATIC_REQUIRE(diagnose_compressor<Dense<ThreadComm>>());
  STATIC_REQUIRE(diagnose_sync_policy<Bsp>());
}
