// Conan's test_package: the umbrella header (no Eigen needed) and one allreduce over
// three in-process ranks.
#include <commpact/commpact.hpp>

#include <cstdio>
#include <span>
#include <vector>

int main() {
  int bad = 0;
  commpact::run_threads(3, [&](commpact::ThreadComm& comm) {
    std::vector<float> g(8, 1.0f + static_cast<float>(comm.rank()));
    comm.allreduce(std::span<float>(g));
    if (comm.rank() == 0 && g[0] != 6.0f) bad = 1;
  });
  std::printf("commpact %d.%d.%d from Conan: %s\n", COMMPACT_VERSION_MAJOR, COMMPACT_VERSION_MINOR,
              COMMPACT_VERSION_PATCH, bad ? "FAILED" : "ok");
  return bad;
}
