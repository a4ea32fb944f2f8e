// Three in-process ranks all-reduce a gradient and count the bytes rank 0 sends.
#include <commpact/commpact.hpp>

#include <cstdio>
#include <span>
#include <vector>

int main() {
  int bad = 0;
  commpact::run_threads(3, [&](commpact::ThreadComm& comm) {
    commpact::CountingComm<commpact::ThreadComm> counted{comm};
    std::vector<float> g(1024, 1.0f + static_cast<float>(comm.rank()));
    counted.allreduce(std::span<float>(g));
    if (comm.rank() == 0) {
      bad = g[0] != 6.0f;
      std::printf("vcpkg_consumer: g[0] = %g, rank 0 sent %llu bytes: %s\n", g[0],
                  static_cast<unsigned long long>(counted.stats().bytes_sent), bad ? "FAILED" : "ok");
    }
  });
  return bad;
}
