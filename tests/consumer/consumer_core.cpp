// Uses only headers that do not include Eigen, so it builds where Eigen is absent.
#include <commpact/comm/counting_comm.hpp>
#include <commpact/comm/thread_comm.hpp>
#include <commpact/config.hpp>

#include <cstdio>
#include <span>
#include <vector>

int main() {
  int bad = 0;
  commpact::run_threads(4, [&](commpact::ThreadComm& comm) {
    commpact::CountingComm<commpact::ThreadComm> counted{comm};
    std::vector<float> g(16, static_cast<float>(comm.rank()));
    counted.allreduce(std::span<float>(g));
    if (comm.rank() == 0 && (g[0] != 6.0f || counted.stats().bytes_sent == 0)) bad = 1;
  });
  std::printf("consumer_core: commpact %d.%d.%d without Eigen %s\n", COMMPACT_VERSION_MAJOR,
              COMMPACT_VERSION_MINOR, COMMPACT_VERSION_PATCH, bad ? "FAILED" : "ok");
  return bad;
}
