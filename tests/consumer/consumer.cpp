// A project outside the tree that only sees the installed package.
#include <commpact/commpact.hpp>

#include <cstdio>
#include <vector>

int main() {
  int bad = 0;
  commpact::run_threads(3, [&](commpact::ThreadComm& comm) {
    commpact::CountingComm<commpact::ThreadComm> counted{comm};
    std::vector<float> g(8, 1.0f + comm.rank());
    counted.allreduce(std::span<float>(g));
    if (g[0] != 6.0f && comm.rank() == 0) bad = 1;
  });
  std::printf("consumer: commpact %d.%d.%d %s\n", COMMPACT_VERSION_MAJOR, COMMPACT_VERSION_MINOR,
              COMMPACT_VERSION_PATCH, bad ? "FAILED" : "ok");
  return bad;
}
