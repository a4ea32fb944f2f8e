#pragma once
// Command line and report shared by the demo's in-process and MPI programs.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <system_error>
#include <vector>

#include "number_check.hpp"
#include "trainer.hpp"

namespace demo {

struct Cli {
  Options o;
  std::string out_dir = "demo-out";
  double expect_accuracy = 0;
};

inline void add_options(CLI::App& app, Cli& c) {
  auto& o = c.o;
  auto& out_dir = c.out_dir;
  auto& expect_accuracy = c.expect_accuracy;
  app.add_option("--ranks", o.ranks, "number of in-process ranks (threads; ignored under MPI: the world size)")
      ->check(CLI::Range(1, 64));
  app.add_option("--epochs", o.epochs, "training epochs")->check(CLI::Range(1, 1000));
  app.add_option("--hidden", o.hidden, "hidden units")->check(CLI::Range(1, 4096));
  app.add_option("--batch", o.batch, "mini-batch per rank")->check(CLI::Range(1, 4096));
  app.add_option("--lr", o.lr, "peak learning rate")->check(positive_number());
  app.add_option("--momentum", o.momentum, "SGD momentum")->check(number_in(0, 0.999));
  app.add_option("--density", o.density, "fraction of gradient entries sent by top-k methods")
      ->check(number_in(1e-6, 1));
  app.add_option("--qsgd-levels", o.qsgd_levels, "QSGD's quantisation levels s (method qsgd)")->check(CLI::Range(1, 65535));
  app.add_option("--local-h", o.local_h, "period H of Local SGD (and QSR's H_base)")->check(CLI::Range(1, 100000));
  app.add_option("--qsr-alpha", o.qsr_alpha, "QSR's alpha")->check(positive_number());
  app.add_option("--staleness", o.staleness, "SSP's staleness bound s (method ssp)")->check(CLI::Range(0, 100000));
  app.add_flag("--overlap", o.overlap,
               "reduce gradients in buckets during backward (dense, topk, gtopk, powersgd, localsgd, qsr)");
  app.add_option("--bucket-kb", o.bucket_kb, "bucket cap with --overlap, KB")->check(number_in(0, 1e9));
  app.add_option("--limit", o.limit, "use only the first N training images (0: all)")->check(number_in(0));
  app.add_option("--seed", o.seed, "random seed");
  app.add_option("--data-dir", o.data_dir, "folder with the Fashion-MNIST *.gz files");
  app.add_option("--methods", o.methods,
                 "comma-separated methods to compare (efsign, terngrad, onebit: a scale per row)")->delimiter(',');
  app.add_option("--out", out_dir, "folder for the CSV and the plot");
  app.add_option("--expect-accuracy", expect_accuracy,
                 "exit with status 2 if any method ends below this test accuracy (0..1); used by the tests")
      ->check(number_in(0, 1));
}

// Rejects unknown, empty and repeated methods before any data is read: a bad name must
// not end the run after the methods before it trained. (Real-valued options are checked
// as they are parsed: number_check.hpp refuses NaN, which CLI11's ranges let through.)
inline void validate(const Cli& c) {
  const auto& methods = c.o.methods;
  if (methods.empty()) throw commpact::invalid_argument("demo: --methods names no method; see --help.");
  for (std::size_t i = 0; i < methods.size(); ++i) {
    const auto& m = methods[i];
    if (std::find(method_names().begin(), method_names().end(), m) == method_names().end()) {
      std::string known;
      for (auto& k : method_names()) known += (known.empty() ? "" : ", ") + k;
      throw commpact::invalid_argument("demo: unknown method '" + m + "' in --methods; use one of: " + known + ".");
    }
    if (std::find(methods.begin(), methods.begin() + std::ptrdiff_t(i), m) != methods.begin() + std::ptrdiff_t(i))
      throw commpact::invalid_argument("demo: method '" + m + "' is named twice in --methods.");
  }
}

// Raises invalid_argument unless --out can hold the CSV (the folder is created): checked
// before training, so that a bad --out (a file, a folder that cannot be written) does not
// lose the run at its end. Opening the CSV to append changes no earlier content.
inline void check_out(const Cli& c) {
  std::error_code ec;
  if (!c.out_dir.empty()) std::filesystem::create_directories(c.out_dir, ec);
  const auto csv = std::filesystem::path(c.out_dir) / "fashion_mnist.csv";
  if (c.out_dir.empty() || ec || !std::ofstream(csv, std::ios::app))
    throw commpact::invalid_argument("demo: --out '" + c.out_dir + "': cannot write " + csv.string() +
                                     (ec ? " (" + ec.message() + ")" : std::string()) +
                                     "; pass a folder that can be created and written.");
}

// Prints the summary table, writes <out>/fashion_mnist.csv and the gnuplot PNG; returns
// 2 if a method ended below --expect-accuracy, 1 if the CSV could not be written.
inline int report(const std::vector<EpochRow>& all, const Cli& c) {
  const auto& o = c.o;
  const auto& out_dir = c.out_dir;
  const double expect_accuracy = c.expect_accuracy;

    std::printf("\n%-10s %10s %12s %14s %10s %9s\n", "method", "test acc", "train loss", "MB sent/rank", "vs dense",
                "seconds");
    double dense_mb = 0;
    for (auto& r : all)
      if (r.method == "dense" && r.epoch == o.epochs) dense_mb = r.mb_sent;
    for (auto& r : all) {
      if (r.epoch != o.epochs) continue;
      char ratio[32] = "-";
      if (dense_mb > 0) std::snprintf(ratio, sizeof ratio, "%.4f", r.mb_sent / dense_mb);
      std::printf("%-10s %9.2f%% %12.4f %14.3f %10s %9.1f\n", r.method.c_str(), 100 * r.test_acc, r.train_loss,
                  r.mb_sent, ratio, r.seconds);
    }
    int status = 0;
    std::error_code ec;
    std::filesystem::create_directories(out_dir, ec);
    const auto csv = std::filesystem::path(out_dir) / "fashion_mnist.csv";
    {
      std::ofstream f(csv);
      f << "method,epoch,train_loss,test_acc,mb_sent_per_rank,sync_rounds,seconds,bytes_sent_per_rank\n";
      for (auto& r : all)
        f << r.method << ',' << r.epoch << ',' << r.train_loss << ',' << r.test_acc << ',' << r.mb_sent << ','
          << r.sync_rounds << ',' << r.seconds << ',' << r.bytes_sent << '\n';
      f.close();
      if (!f) {
        std::fprintf(stderr, "error: could not write %s (the table above is the run's result)\n", csv.c_str());
        return 1;
      }
    }
    std::printf("\nwrote %s\n", csv.c_str());
    for (auto& r : all)
      if (r.epoch == o.epochs && r.test_acc < expect_accuracy) {
        std::fprintf(stderr, "error: %s reached %.2f%% test accuracy, below the expected %.2f%%\n", r.method.c_str(),
                     100 * r.test_acc, 100 * expect_accuracy);
        status = 2;
      }

    // A plot: test accuracy against megabytes sent per rank, one line per method.
    if (std::system("command -v gnuplot >/dev/null 2>&1") == 0) {
      const auto gp = std::filesystem::path(out_dir) / "fashion_mnist.gp";
      const auto png = std::filesystem::path(out_dir) / "fashion_mnist.png";
      std::ofstream g(gp);
      // The key sits outside the plot; past 8 methods the colours repeat, so the line's dash
      // pattern and point type change with them.
      g << "set datafile separator ','\nset terminal pngcairo size 1000,580\nset output '" << png.string() << "'\n"
        << "set title 'Fashion-MNIST, " << o.ranks << " ranks: test accuracy against bytes sent'\n"
        << "set xlabel 'MB sent per rank (log scale)'\nset ylabel 'test accuracy (%)'\nset logscale x\n"
        << "set key outside right top\nset grid\n";
      g << "plot ";
      for (std::size_t i = 0; i < o.methods.size(); ++i)
        g << (i ? ", " : "") << "'" << csv.string() << "' using ($5):($2 > 0 && strcol(1) eq '" << o.methods[i]
          << "' ? 100*$4 : 1/0) with linespoints lw 2 lc " << i % 8 + 1 << " dt " << i / 8 + 1 << " pt "
          << i % 13 + 1 << " title '" << o.methods[i] << "'";
      g << "\n";
      g.close();
      if (std::system(("gnuplot '" + gp.string() + "' 2>/dev/null").c_str()) == 0)
        std::printf("wrote %s\n", png.c_str());
    }
  return status;
}

}  // namespace demo
