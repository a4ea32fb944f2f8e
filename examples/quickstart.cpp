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

    if (comm.rank() == 0) {
      const auto& s = counted.stats();
      std::printf("average %.2f; rank 0 sent %llu bytes in %llu messages (ring allreduce of 4000 bytes + 16-byte length check)\n", grad[0],
                  static_cast<unsigned long long>(s.bytes_sent), static_cast<unsigned long long>(s.messages_sent));
      Star star(P);
      std::printf("star: rank 0 has %zu neighbours, w(0,1) = %.3f, self weight %.3f\n", star.neighbors(0).size(),
                  star.weight(0, 1), star.weight(0, 0));
    }
  });
  return 0;
}
