// Uses the mpi component: runs as a singleton MPI process (no launcher).
#include <commpact/commpact.hpp>
#include <commpact/comm/mpi_comm.hpp>

#include <cstdio>
#include <vector>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int bad = 0;
  {
    commpact::MpiComm world{MPI_COMM_WORLD};
    std::vector<float> g(4, 2.0f);
    world.allreduce(std::span<float>(g));
    bad = g[0] != 2.0f * world.size();
    std::printf("consumer_mpi: %d rank(s) %s\n", world.size(), bad ? "FAILED" : "ok");
  }
  MPI_Finalize();
  return bad;
}
