// bench_overlap: step time of data-parallel training with and without overlapping the
// gradient reduction with backward (issue 9), over MpiComm. A plain MPI program (CLI11).
//
//   mpiexec --allow-run-as-root --oversubscribe -n 2 build/bench/bench_overlap
//   mpiexec ... -n 4 build/bench/bench_overlap --floats 8M --layers 16 --cap-mb 4 --methods dense,powersgd,gtopk
//
// The model: --layers layers of --floats / --layers floats each (for PowerSGD, matrices of
// 256 rows). A step: a simulated backward from the last layer to the first, each layer
// writing its gradient (a copy of a fixed random gradient) and then sleeping its share of
// the compute time (a GPU kernel: the CPU stays free, as it is on a GPU node), then
// DataParallel::step with SGD + momentum. Plain: the whole backward, then step(). Overlap:
// begin_backward, grad_ready(layer) after each layer, then step(), with the reduction of
// the buckets (Bucketed, --cap-mb) running during the rest of backward.
//
// The compute time per step defaults to the measured communication time: the buckets'
// reduction alone, without backward or the update (--compute-ratio 1: compute =
// communication, the case). Both step times include the SGD update (about one
// pass over params, grads and momentum), which no overlap can hide.
// Plain and overlapped steps alternate; every step starts at a barrier and its time is
// the slowest rank's; the table shows medians over --steps steps of each. The two runs
// see the same gradients, so their parameters must agree bit for bit ("bitwise"). "best
// cut" is what a perfect overlap would give: every bucket but the last hidden behind
// backward, the rest of the plain step (update, copies) unchanged.
//
// --floats: a positive number with an optional K, M or G (2^10, 2^20, 2^30; default 4M), at
// most 1024G; any other suffix, zero, a negative, NaN or garbage is refused. --help: the
// options (CLI11).
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <commpact/comm/mpi_comm.hpp>
#include <commpact/comm/tree_comm.hpp>
#include <commpact/compress/compressors/bucketed.hpp>
#include <commpact/compress/compressors/dense.hpp>
#include <commpact/compress/compressors/gtopk.hpp>
#include <commpact/compress/compressors/power.hpp>
#include <commpact/sync/policies.hpp>
#include <commpact/train/data_parallel.hpp>
#include <commpact/train/sgd.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench_args.hpp"

using namespace commpact;
using clk = std::chrono::steady_clock;

namespace {

struct config {
  std::string floats = "4M";
  int layers = 16;
  double cap_mb = 1.0;
  int steps = 15;
  double compute_ratio = 1.0;
  double compute_ms = -1;  // < 0: compute_ratio x measured communication
  double density = 0.01;
  std::vector<std::string> methods = {"dense", "powersgd", "gtopk"};
  std::string csv;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

double slowest(double mine) {
  MPI_Allreduce(MPI_IN_PLACE, &mine, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return mine;
}

struct model {
  std::vector<std::size_t> sizes;
  std::vector<std::size_t> offsets;
  std::size_t n = 0;
  std::vector<float> source;  // this rank's gradient, copied layer by layer in backward
};

model make_model(const config& c, int rank) {
  model m;
  const auto total = static_cast<std::size_t>(bench_args::size("--floats", c.floats));  // checked in main
  const std::size_t per = std::max<std::size_t>(256, (total / std::size_t(c.layers)) / 256 * 256);
  for (int l = 0; l < c.layers; ++l) {
    m.offsets.push_back(m.n);
    m.sizes.push_back(per);
    m.n += per;
  }
  m.source.resize(m.n);
  std::mt19937 g(1234u + unsigned(rank));
  std::normal_distribution<float> d(0.f, 1.f);
  for (auto& x : m.source) x = d(g);
  return m;
}

// One step; returns this rank's step time in ms.
template <class DP>
double one_step(DP& dp, Sgd& opt, const model& m, std::vector<float>& params, std::vector<float>& grad,
                double compute_ms, bool overlap) {
  const auto per_layer = std::chrono::duration<double, std::milli>(compute_ms / double(m.sizes.size()));
  MPI_Barrier(MPI_COMM_WORLD);
  const auto t0 = clk::now();
  if (overlap) dp.begin_backward(grad, 0.01);
  auto due = t0;
  for (std::size_t l = m.sizes.size(); l-- > 0;) {
    std::memcpy(grad.data() + m.offsets[l], m.source.data() + m.offsets[l], m.sizes[l] * sizeof(float));
    due += std::chrono::duration_cast<clk::duration>(per_layer);
    std::this_thread::sleep_until(due);  // the layer's kernels
    if (overlap) dp.grad_ready(l);
  }
  dp.step(params, grad, 0.01, opt);
  return std::chrono::duration<double, std::milli>(clk::now() - t0).count();
}

template <class C, class Make>
void run_method(const config& c, const std::string& name, MpiComm& comm, const model& m, Make make, FILE* csv) {
  const int P = comm.size();
  const int total_steps = 2 * (c.steps + 3) + 8;
  auto fresh = [&] {
    return DataParallel{Bucketed<C>{m.sizes, make, {.cap_bytes = std::size_t(c.cap_mb * double(1 << 20))}},
                        EveryStep{}, total_steps};
  };
  auto plain = fresh(), over = fresh();
  Sgd opt_plain{m.n, {.momentum = 0.9}}, opt_over{m.n, {.momentum = 0.9}};
  std::vector<float> p_plain(m.n, 0.f), p_over(m.n, 0.f), grad(m.n);

  // Communication alone: the buckets' reduction, through compressors of their own.
  Bucketed<C> probe{m.sizes, make, {.cap_bytes = std::size_t(c.cap_mb * double(1 << 20))}};
  std::vector<double> comm_ms;
  for (int s = 0; s < 6; ++s) {
    std::memcpy(grad.data(), m.source.data(), m.n * sizeof(float));
    MPI_Barrier(MPI_COMM_WORLD);
    const auto t0 = clk::now();
    probe.reduce(grad);
    comm_ms.push_back(slowest(std::chrono::duration<double, std::milli>(clk::now() - t0).count()));
  }
  comm_ms.erase(comm_ms.begin());  // warm-up
  const double t_comm = median(comm_ms);
  const double t_compute = c.compute_ms >= 0 ? c.compute_ms : c.compute_ratio * t_comm;

  std::vector<double> t_plain, t_over;
  for (int s = 0; s < c.steps + 1; ++s) {
    const double a = slowest(one_step(plain, opt_plain, m, p_plain, grad, t_compute, false));
    const double b = slowest(one_step(over, opt_over, m, p_over, grad, t_compute, true));
    if (s > 0) t_plain.push_back(a), t_over.push_back(b);  // step 0 is a warm-up
  }
  int same = p_plain == p_over ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &same, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  const double mp = median(t_plain), mo = median(t_over);
  if (comm.rank() == 0) {
    // The best overlap can do: all but the last bucket hidden behind backward; the rest
    // of the plain step (the update, copies) stays.
    const double buckets = double(plain.compressor().buckets());
    const double rest = std::max(0.0, mp - t_compute - t_comm);
    const double bound = 100.0 * (1.0 - (std::max(t_compute, t_comm * (buckets - 1) / buckets) + t_comm / buckets + rest) / mp);
    std::printf("| %-8s | %d | %zu | %zu | %8.2f | %8.2f | %8.2f | %8.2f | %5.1f%% | %5.1f%% | %s |\n", name.c_str(), P,
                m.n, plain.compressor().buckets(), t_comm, t_compute, mp, mo, 100.0 * (1.0 - mo / mp), bound,
                same ? "yes" : "NO");
    std::fflush(stdout);
    if (csv)
      std::fprintf(csv, "%s,%d,%zu,%d,%g,%zu,%.4f,%.4f,%.4f,%.4f,%d\n", name.c_str(), P, m.n, c.layers, c.cap_mb,
                   plain.compressor().buckets(), t_comm, t_compute, mp, mo, same);
  }
}

int run(const config& c) {
  require(MpiComm::allows_calls_from_other_threads(), "bench_overlap: MPI did not grant MPI_THREAD_SERIALIZED.");
  MpiComm comm{MPI_COMM_WORLD};
  const model m = make_model(c, comm.rank());
  FILE* csv = nullptr;
  if (comm.rank() == 0) {
    std::printf("bench_overlap: P = %d, %zu floats in %d layers, bucket cap %.2f MB, %d steps per mode (median)\n",
                comm.size(), m.n, c.layers, c.cap_mb, c.steps);
    std::printf("| method | P | floats | buckets | comm ms | compute ms | plain ms | overlap ms | cut | best cut | bitwise |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
    if (!c.csv.empty()) {
      csv = std::fopen(c.csv.c_str(), "a");
      require(csv != nullptr, "bench_overlap: cannot open ", c.csv, " for appending.");
      if (std::ftell(csv) == 0)
        std::fprintf(csv, "method,P,floats,layers,cap_mb,buckets,comm_ms,compute_ms,plain_ms,overlap_ms,bitwise\n");
    }
  }
  for (const auto& name : c.methods) {
    if (name == "dense") {
      run_method<Dense<MpiComm>>(c, name, comm, m, [&](const bucket_info&) { return Dense<MpiComm>{comm}; }, csv);
    } else if (name == "powersgd") {
      run_method<PowerCompressor<4>>(
          c, name, comm, m,
          [&](const bucket_info& b) {
            tensor_layout layout;
            for (std::size_t l = b.first_layer; l < b.end_layer; ++l)
              layout.push_back({256, static_cast<std::int64_t>(m.sizes[l] / 256)});
            return PowerCompressor<4>{comm, layout};
          },
          csv);
    } else if (name == "gtopk") {
      using G = gTopK<TreeComm<MpiComm>>;
      run_method<G>(c, name, comm, m, [&](const bucket_info&) { return G{comm, {.density = c.density}}; }, csv);
    } else {
      throw invalid_argument("bench_overlap: unknown method '" + name + "'; use dense, powersgd, gtopk.");
    }
  }
  if (csv) std::fclose(csv);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  config c;
  CLI::App app{"bench_overlap: step time with and without overlap of reduction and backward (run under mpiexec)"};
  app.add_option("--floats", c.floats, "model size in floats, at least 1; K, M, G = 2^10, 2^20, 2^30 (default 4M)")
      ->type_name("SIZE");
  app.add_option("--layers", c.layers, "layers of equal size")->check(CLI::Range(1, 4096));
  app.add_option("--cap-mb", c.cap_mb, "bucket cap in MB (DDP: 25)")
      ->check(bench_args::real_check(0, true, 1e6, true));
  app.add_option("--steps", c.steps, "timed steps per mode (median)")->check(CLI::Range(1, 10000));
  app.add_option("--compute-ratio", c.compute_ratio, "compute time = ratio x measured communication time")
      ->check(bench_args::real_check(0, true, 1e6, true));
  app.add_option("--compute-ms", c.compute_ms, "compute time per step in ms (overrides --compute-ratio)")
      ->check(bench_args::real_check(0, true, 1e9, true));
  app.add_option("--density", c.density, "gTop-k density, in (0, 1]")
      ->check(bench_args::real_check(0, false, 1, true));
  app.add_option("--methods", c.methods, "dense,powersgd,gtopk")->delimiter(',');
  app.add_option("--csv", c.csv, "append one row per method to this CSV (rank 0)");
  try {
    app.parse(argc, argv);
    bench_args::size("--floats", c.floats);
  } catch (const CLI::ParseError& e) {
    return bench_args::cli_failure(app, e, "bench_overlap");
  } catch (const bench_args::error& e) {
    return bench_args::usage_error("bench_overlap", e.what());
  }
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  int rc = 0;
  try {
    rc = run(c);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_overlap: %s\n", e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return rc;
}
