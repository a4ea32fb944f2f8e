// The demo under MPI: one rank per process, the same training loop and methods as
// train_fashion_mnist (in-process), through commpact::MpiComm.
//
//   mpiexec -n 4 train_fashion_mnist_mpi --methods dense,gtopk      (or: scripts/demo --mpi 4)
#include <commpact/comm/mpi_comm.hpp>

#include "fashion_mnist/cli.hpp"

int main(int argc, char** argv) {
  int provided = 0;  // SERIALIZED: --overlap reduces buckets on a second thread
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  int status = 0;
  {
    demo::Cli c;
    CLI::App app{"commpact demo: Fashion-MNIST under MPI"};
    demo::add_options(app, c);
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      status = app.exit(e);
      MPI_Finalize();
      return status;
    }
    try {
      commpact::MpiComm world{MPI_COMM_WORLD};
      c.o.ranks = world.size();
      const auto& o = c.o;
      demo::validate(c);
      // Rank 0 writes the results: it checks --out, and every rank learns the verdict.
      int out_ok = 1;
      std::string why;
      if (world.rank() == 0) try {
          demo::check_out(c);
        } catch (const commpact::error& e) {
          out_ok = 0;
          why = e.what();
        }
      world.broadcast(std::span<int>(&out_ok, 1), 0);
      if (!out_ok)
        throw commpact::invalid_argument(world.rank() == 0 ? why : "demo: rank 0 cannot write --out (its message says why).");
      demo::Data data{demo::load_idx(o.data_dir, "train", o.limit), demo::load_idx(o.data_dir, "t10k")};
      if (world.rank() == 0)
        std::printf("commpact demo: Fashion-MNIST, %zu training / %zu test images, MLP 784-%d-10, %d MPI ranks, "
                    "batch %d per rank, %d epochs\n",
                    data.train.count, data.test.count, o.hidden, o.ranks, o.batch, o.epochs);
      std::vector<demo::EpochRow> all;
      for (const auto& m : o.methods) {
        auto rows = demo::train(m, commpact::CountingComm<commpact::MpiComm>{world}, data, o, true);
        all.insert(all.end(), rows.begin(), rows.end());
      }
      if (world.rank() == 0) status = demo::report(all, c);
      world.broadcast(std::span<int>(&status, 1), 0);
    } catch (const commpact::error& e) {
      std::fprintf(stderr, "error: %s\n", e.what());
      status = 1;
    }
  }
  MPI_Finalize();
  return status;
}
