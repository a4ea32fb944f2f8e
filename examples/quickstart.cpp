// Quickstart: the four concepts in one file. Four in-process ranks average a gradient
// through a Compressor over a counted Communicator, and a user-written SyncPolicy and
// Topology plug into the same concepts as the shipped ones.
// Built and run by the test suite (ctest -R example_quickstart).
#include <commpact/commpact.hpp>
#include <commpact/compress/compressors/dense.hpp>

#include <cstdio>
#include <vector>

// A user-written SyncPolicy: synchronise parameters every other step.
struct EveryOtherStep {
  commpact::sync_plan plan(std::int64_t /*step*/, double /*lr*/) const {
    return {commpact::sync_plan::mode::parameters, 2};
  }
};
static_assert(commpact::SyncPolicy<EveryOtherStep>);

// A user-written Topology: a star around rank 0, with the library's Metropolis weights.
struct Star : commpact::Graph {
  explicit Star(int P) : Graph(P, edges(P), "Star") {}
  static std::vector<std::vector<int>> edges(int P) {
    std::vector<std::vector<int>> adj(P);
    for (int r = 1; r < P; ++r) adj[0].push_back(r);
    return adj;
  }
};
static_assert(commpact::Topology<Star>);

int main() {
  constexpr int P = 4;
  commpact::run_threads(P, [](commpact::ThreadComm& comm) {
    // Count what crosses the network; copies of a CountingComm share one counter.
    commpact::CountingComm<commpact::ThreadComm> counted{comm};
    commpact::Dense<commpact::CountingComm<commpact::ThreadComm>> reducer{counted};
    static_assert(commpact::Compressor<decltype(reducer)>);

    std::vector<float> grad(1000, static_cast<float>(comm.rank()));  // rank r's gradient is all r
    reducer.reduce(grad);                                             // now the average: 1.5
    if (grad[0] != 1.5f) comm.abort("wrong average");

    // What Dense sends, by the ring formula (the count CountingComm charges): the 1000
    // floats, the step count it agrees on at every step (6 floats) and, on its first step,
    // the agreement on the length (3 int64).
    namespace wire = commpact::wire;
    const auto r = comm.rank();
    const auto expect = wire::ring_allreduce(r, P, 1000, 4).bytes_sent + wire::ring_allreduce(r, P, 6, 4).bytes_sent +
                        wire::ring_allreduce(r, P, 3, 8).bytes_sent;
    if (counted.stats().bytes_sent != expect) comm.abort("bytes differ from the ring formula");

    if (comm.rank() == 0) {
      const auto& s = counted.stats();
      std::printf("average %.2f; rank 0 sent %llu bytes in %llu messages (the ring allreduce of 1000 floats, "
                  "Dense's step check of 6 floats and its first-step length agreement of 3 int64)\n",
                  grad[0], static_cast<unsigned long long>(s.bytes_sent),
                  static_cast<unsigned long long>(s.messages_sent));
      Star star(P);
      std::printf("star: rank 0 has %zu neighbours, w(0,1) = %.3f, self weight %.3f\n", star.neighbors(0).size(),
                  star.weight(0, 1), star.weight(0, 0));
    }
  });
  return 0;
}
