// Averages a "gradient" over MPI ranks with commpact::MpiComm, counts the traffic with
// CountingComm, and shows how a failure on one rank reaches the others.
//
//   mpiexec -n 4 ./allreduce_mpi            # average, traffic, exit 0
//   mpiexec -n 4 ./allreduce_mpi --fail     # rank 1 throws; every rank reports it, exit 1
//
// Referenced from docs/communicators.md.
#include <commpact/commpact.hpp>
#include <commpact/comm/mpi_comm.hpp>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <vector>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  const bool fail = argc > 1 && std::strcmp(argv[1], "--fail") == 0;
  int rc = 0;
  {
    // The handle duplicates MPI_COMM_WORLD; copies are cheap and share it.
    commpact::MpiComm world{MPI_COMM_WORLD, {.timeout = std::chrono::seconds(30)}};
    commpact::CountingComm<commpact::MpiComm> comm{world};
    const int P = comm.size(), r = comm.rank();

    std::vector<float> grad(1 << 16);
    for (std::size_t i = 0; i < grad.size(); ++i) grad[i] = float(r + 1) * 0.001f * float(i % 100);

    try {
      // mpi_guard: if the body throws on one rank, the others raise peer_failure
      // (carrying this rank's message) instead of waiting for the deadline.
      commpact::mpi_guard(comm, [&] {
        for (int step = 0; step < 3; ++step) {
          if (fail && r == 1 % P && step == 1) throw std::runtime_error("loss became NaN at step 1");
          comm.allreduce(std::span<float>(grad));  // bit-identical on every rank
          for (auto& g : grad) g /= float(P);
        }
      });
      const auto s = comm.stats();
      std::printf("rank %d/%d: grad[99] = %g, sent %llu bytes in %llu messages over %llu collectives\n", r, P,
                  double(grad[99]), (unsigned long long)s.bytes_sent, (unsigned long long)s.messages_sent,
                  (unsigned long long)s.collectives);
    } catch (const commpact::peer_failure& e) {
      std::printf("rank %d: %s\n", r, e.what());
      rc = 1;
    } catch (const std::exception& e) {
      std::printf("rank %d: threw %s\n", r, e.what());
      rc = 1;
    }
    std::fflush(stdout);
  }  // the last copy frees the duplicated communicators, before MPI_Finalize
  MPI_Barrier(MPI_COMM_WORLD);  // let every rank print before a non-zero exit stops the job
  MPI_Finalize();
  return rc;
}
