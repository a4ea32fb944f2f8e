// The main demo: data-parallel training of an MLP on Fashion-MNIST with P in-process
// ranks (ThreadComm), comparing how methods trade bytes on the wire for accuracy.
//
//   train_fashion_mnist --ranks 4 --epochs 3 --methods dense,gtopk --out demo-out
//
// Prints progress per epoch, a summary table, and writes <out>/fashion_mnist.csv and,
// when gnuplot is installed, <out>/fashion_mnist.png.
#include "fashion_mnist/cli.hpp"

int main(int argc, char** argv) {
  demo::Cli c;
  CLI::App app{"commpact demo: Fashion-MNIST on in-process ranks"};
  demo::add_options(app, c);
  CLI11_PARSE(app, argc, argv);
  const auto& o = c.o;
  try {
    demo::validate(c);
    demo::check_out(c);
    demo::Data data{demo::load_idx(o.data_dir, "train", o.limit), demo::load_idx(o.data_dir, "t10k")};
    std::printf("commpact demo: Fashion-MNIST, %zu training / %zu test images, MLP 784-%d-10, %d ranks (threads), "
                "batch %d per rank, %d epochs\n",
                data.train.count, data.test.count, o.hidden, o.ranks, o.batch, o.epochs);
    std::vector<demo::EpochRow> all;
    for (const auto& m : o.methods) {
      std::vector<demo::EpochRow> rows;
      commpact::run_threads(o.ranks, [&](commpact::ThreadComm& tc) {
        auto r = demo::train(m, commpact::CountingComm<commpact::ThreadComm>{tc}, data, o, true);
        if (tc.rank() == 0) rows = std::move(r);
      });
      all.insert(all.end(), rows.begin(), rows.end());
    }
    return demo::report(all, c);
  } catch (const commpact::error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
