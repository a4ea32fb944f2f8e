// bench_scaling: wall-clock time per iteration of commpact's algorithms over real TCP on
// the emulated cluster of scripts/cluster (a plain MPI program, not Google Benchmark).
//
//   scripts/cluster --ranks 8 --rate 1gbit -- build/bench/bench_scaling --n 16M --csv scaling.csv
//   scripts/cluster --nodes 2 --per-node 4 --rate 1gbit --inter-rate 100mbit --
//     build/bench/bench_scaling --n 16M --methods dense,hierarchical --csv scaling.csv
//   build/bench/bench_scaling --fit scaling.csv            # alpha-beta and host-aware fits (cost_fit.hpp),
//                                                          # error per row: in-sample, leave-one-out, leave-point-out
//   build/bench/bench_scaling --fit a.csv --predict b.csv  # the fits of a.csv against b.csv's rows
//   build/bench/bench_scaling --fit scaling.csv --model-table   # table for P up to 1024
//   build/bench/bench_scaling --plot scaling.csv --plot-dir docs/img
//
// Methods: dense, topk, gtopk, powersgd (rank 4), localsgd (H = 4, measured: H steps then a
// parameter average, per iteration = total / H), qsr (the measured Local SGD round
// amortised over QSR's mean period on a cosine schedule, derived, not timed), dpsgd and
// powergossip (rank 1) on a ring, hierarchical (Dense over HierarchicalComm, nodes from
// scripts/cluster's COMMPACT_CLUSTER_NODE).
//
// Per iteration every rank waits at a barrier, sleeps --compute-ms (the simulated
// backward pass), then runs one reduce. Time inside the communicator's calls is
// communication; the rest of the reduce is the compressor's own compute. Per iteration the
// iteration time is the slowest rank's, the communication time the smallest rank's (the
// rank that arrived last waits only for the transfer, not for slower peers), compute =
// iteration - communication; medians over --iters iterations after one warm-up. Bytes and
// messages: the most any rank sent (CountingComm). Scaling efficiency (gTop-k paper):
// throughput of P workers / (P x one worker's) = compute-ms / iteration time.
//
// --n: sizes in floats, each a positive number with an optional K, M or G (2^10, 2^20,
// 2^30), at most 1024G; any other suffix, zero, a negative, NaN or garbage is refused.
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <commpact/comm/counting_comm.hpp>
#include <commpact/comm/hierarchical_comm.hpp>
#include <commpact/comm/mpi_comm.hpp>
#include <commpact/comm/tree_comm.hpp>
#include <commpact/compress/compressors/dense.hpp>
#include <commpact/compress/compressors/gtopk.hpp>
#include <commpact/compress/compressors/power.hpp>
#include <commpact/compress/compressors/topk.hpp>
#include <commpact/gossip/gossip_mixer.hpp>
#include <commpact/sync/lr_schedule.hpp>
#include <commpact/sync/policies.hpp>
#include <commpact/sync/schedule.hpp>
#include <commpact/topology/ring.hpp>
#include <commpact/train/cost_fit.hpp>
#include <commpact/train/cost_model.hpp>
#include <commpact/train/data_parallel.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <memory>
#include <random>
#include <sstream>
#include <type_traits>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "bench_args.hpp"

using namespace commpact;

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

//! A decorator that adds up the wall time spent inside the communicator's calls.
template <class C>
class TimingComm {
 public:
  explicit TimingComm(C inner) : inner_(std::move(inner)), secs_(std::make_shared<double>(0.0)) {}
  int rank() const { return inner_.rank(); }
  int size() const { return inner_.size(); }
  template <class T>
  void allreduce(std::span<T> d, reduce_op op = reduce_op::sum) { timed([&] { inner_.allreduce(d, op); }); }
  template <class T>
  void allgather(std::span<const T> in, std::span<T> out) { timed([&] { inner_.allgather(in, out); }); }
  template <class T>
  void broadcast(std::span<T> d, int root) { timed([&] { inner_.broadcast(d, root); }); }
  void barrier() { timed([&] { inner_.barrier(); }); }
  void abort(std::string_view why) { inner_.abort(why); }
  void send(int p, std::span<const std::byte> m) { timed([&] { inner_.send(p, m); }); }
  void recv(int p, std::vector<std::byte>& b) { timed([&] { inner_.recv(p, b); }); }
  void sendrecv(int p, std::span<const std::byte> m, std::vector<std::byte>& b) {
    timed([&] { inner_.sendrecv(p, m, b); });
  }
  double seconds() const { return *secs_; }
  C& inner() { return inner_; }

 private:
  template <class F>
  void timed(F&& f) {
    const double t = now();
    f();
    *secs_ += now() - t;
  }
  C inner_;
  std::shared_ptr<double> secs_;
};

using Net = TimingComm<CountingComm<MpiComm>>;
using HNet = TimingComm<CountingComm<HierarchicalComm<MpiComm>>>;

// ---- every compressor is built here, one function per method (adapt at API changes) ----
auto make_dense(Net c) { return Dense<Net>{c}; }
auto make_topk(Net c, double d) { return TopK<Net>{c, {.density = d}}; }
auto make_gtopk(Net c, double d) { return gTopK<TreeComm<Net>>{c, {.density = d}}; }
auto make_powersgd(Net c, const tensor_layout& l) { return PowerCompressor<4>{c, l}; }
auto make_dpsgd(Net c, const tensor_layout& l) { return GossipMixer{c, Ring(c.size()), l, exact_mixing{}}; }
auto make_powergossip(Net c, const tensor_layout& l) { return GossipMixer{c, Ring(c.size()), l, power_gossip<1>{}}; }
auto make_local_sgd(Net c, int H, std::int64_t steps) { return DataParallel{Dense<Net>{c}, LocalSgd{H}, steps}; }
auto make_hierarchical(HNet c) { return Dense<HNet>{c}; }
// QSR's mean period: Gu et al.'s ViT setting (alpha 0.0175, H_base 4, peak lr 0.008,
// cosine over 10000 steps, 500 warm-up steps).
double qsr_mean_period() {
  WarmupCosineLr lr{0.008, 500, 10000};
  const auto periods = plan_run(QSRPolicy{0.0175, 4, 500}, lr, 10000);
  return 10000.0 / static_cast<double>(count_rounds(periods));
}
// -----------------------------------------------------------------------------------------

constexpr int local_h = 4;

// The methods --methods takes (and a CSV's method column names), in the order of the help.
const std::vector<std::string> known_methods{"dense",    "topk",  "gtopk",       "powersgd",    "localsgd",
                                             "qsr",      "dpsgd", "powergossip", "hierarchical"};
invalid_argument unknown_method(const std::string& m) {
  std::string list;
  for (const auto& k : known_methods) list += (list.empty() ? "" : ", ") + k;
  return invalid_argument(detail::cat("unknown method '", m, "'; use ", list, "."));
}

struct cfg {
  std::vector<std::string> sizes{"1M"}, methods{"dense", "topk", "gtopk"};
  double density = 0.001, compute_ms = 0;
  int iters = 5;
  std::string csv, fit, plot, plot_dir = "docs/img";
  bool model_table = false;
  double cores = 2;
  std::string predict;
};

// --n's sizes: K, M, G = 2^10, 2^20, 2^30 (bench_args.hpp); checked in main.
std::uint64_t parse_size(const std::string& s) { return bench_args::size("--n", s); }

// n floats as 1024 x 1024 matrices (the rest as one vector): the shapes PowerSGD and
// PowerGossip factorise.
tensor_layout layout_of(std::uint64_t n) {
  tensor_layout l;
  const std::uint64_t m = 1 << 20;
  for (std::uint64_t i = 0; i + m <= n; i += m) l.push_back({1024, 1024});
  if (n % m) l.push_back({static_cast<std::int64_t>(n % m)});
  return l;
}
std::vector<cost::shape> shapes_of(const tensor_layout& l) {
  std::vector<cost::shape> s;
  for (const auto& t : l) s.push_back({static_cast<std::uint64_t>(t.rows), static_cast<std::uint64_t>(t.cols)});
  return s;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

std::string env(const char* k, const char* dflt = "") {
  const char* v = std::getenv(k);
  return v ? v : dflt;
}
double load1() {
  std::ifstream f("/proc/loadavg");
  double l = 0;
  f >> l;
  return l;
}

//! The model of one run: (cost on the rank links or the only links, cost on the slow links).
std::pair<cost::step_cost, cost::step_cost> model_of(const std::string& m, int P, std::uint64_t n, std::uint64_t k,
                                                     int nodes, int per_node, cost::allreduce_algorithm algo) {
  const auto shapes = shapes_of(layout_of(n));
  const int degree = P == 1 ? 0 : P == 2 ? 1 : 2;
  if (m == "dense") return {cost::dense(P, n, false, algo), {}};
  if (m == "topk") return {cost::topk(P, n, k), {}};
  if (m == "gtopk") return {cost::gtopk(P, n, k), {}};
  if (m == "powersgd") return {cost::powersgd(P, shapes, 4, 2.0, false, algo), {}};
  if (m == "dpsgd") return {cost::dpsgd(degree, n) + cost::gossip_check(P, algo), {}};
  if (m == "powergossip")  // the two phases alternate
    return {(cost::power_gossip(degree, shapes, 1, 0) + cost::power_gossip(degree, shapes, 1, 1)).amortised(2) +
                cost::gossip_check(P, algo), {}};
  if (m == "localsgd") return {cost::dense(P, n, false, algo).amortised(local_h), {}};
  if (m == "qsr") return {cost::dense(P, n, false, algo).amortised(qsr_mean_period()), {}};
  if (m == "hierarchical") {
    const auto h = cost::hierarchical(nodes, per_node, n, algo);
    return {h.intra, h.inter};
  }
  throw unknown_method(m);
}

struct result {
  double compress = 0, comm = 0, iter = 0;
  std::uint64_t bytes = 0, messages = 0;
};

// Runs `iters` + 1 iterations of op(work) on every rank; returns rank 0's summary.
template <class Comm, class Counted, class Op>
result time_it(const cfg& c, Comm& net, Counted& counted, std::vector<float>& g0, Op op, int steps_per_iter = 1) {
  std::vector<float> work(g0.size());
  std::vector<double> it, cm, cp;
  comm_stats last{};
  for (int i = 0; i <= c.iters; ++i) {
    std::copy(g0.begin(), g0.end(), work.begin());
    MPI_Barrier(MPI_COMM_WORLD);
    const auto s0 = counted.stats();
    const double c0 = net.seconds();
    double busy = 0;
    for (int s = 0; s < steps_per_iter; ++s) {
      if (c.compute_ms > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(c.compute_ms));
      const double t = now();
      op(work);
      busy += now() - t;
    }
    const double comm = net.seconds() - c0;
    // max of reduce time, min of comm time, max of the compressor's own work
    double v[3] = {busy, -comm, busy - comm};
    MPI_Allreduce(MPI_IN_PLACE, v, 3, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    const auto d = counted.stats() - s0;
    std::uint64_t b[2] = {d.bytes_sent, d.messages_sent};
    MPI_Allreduce(MPI_IN_PLACE, b, 2, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
    last.bytes_sent = b[0], last.messages_sent = b[1];
    if (i == 0) continue;  // warm-up: first-step agreements, allocations
    it.push_back(v[0] / steps_per_iter);
    cm.push_back(-v[1] / steps_per_iter);
    cp.push_back(v[2] / steps_per_iter);
  }
  result r;
  r.iter = median(it);
  r.comm = median(cm);
  r.compress = median(cp);
  r.bytes = last.bytes_sent / steps_per_iter;
  r.messages = last.messages_sent / steps_per_iter;
  return r;
}

struct row {
  std::string network, rate, inter_rate, method;
  int nodes = 1, per_node = 0, P = 1, iters = 0;
  std::uint64_t n = 0, k = 0, bytes = 0, messages = 0;
  double density = 0, sim = 0, compress = 0, comm = 0, iter = 0, eff = -1;
  cost::step_cost model, model_inter;
  double load = 0;
};

const char* csv_header =
    "network,rate,inter_rate,nodes,per_node,P,method,n,density,k,iters,sim_compute_s,compress_s,comm_s,iter_s,"
    "bytes_sent,messages_sent,efficiency,model_rounds,model_path_bytes,model_inter_rounds,model_inter_path_bytes,"
    "load1\n";

void write_row(std::FILE* f, const row& r) {
  std::fprintf(f, "%s,%s,%s,%d,%d,%d,%s,%llu,%g,%llu,%d,%.6g,%.6g,%.6g,%.6g,%llu,%llu,%.4g,%g,%.17g,%g,%.17g,%.2f\n",
               r.network.c_str(), r.rate.c_str(), r.inter_rate.c_str(), r.nodes, r.per_node, r.P, r.method.c_str(),
               (unsigned long long)r.n, r.density, (unsigned long long)r.k, r.iters, r.sim, r.compress, r.comm, r.iter,
               (unsigned long long)r.bytes, (unsigned long long)r.messages, r.eff, r.model.latency_rounds,
               r.model.path_bytes, r.model_inter.latency_rounds, r.model_inter.path_bytes, r.load);
}

double rate_bits(const std::string& r);

std::vector<row> read_csv(const std::string& path) {
  std::ifstream f(path);
  require(f.good(), "cannot read ", path, "; pass the CSV a run wrote with --csv.");
  std::vector<row> rows;
  std::string line;
  std::size_t line_no = 0;
  const auto bad = [&](const std::string& what) {
    return invalid_argument(detail::cat(path, ":", line_no, ": ", what, "; pass the CSV a run wrote with --csv."));
  };
  while (std::getline(f, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();  // a CSV with CRLF line ends
    if (line.empty() || line.rfind("network,", 0) == 0) continue;  // the header (once per appending run)
    std::vector<std::string> c;
    std::stringstream ss(line);
    for (std::string x; std::getline(ss, x, ',');) c.push_back(x);
    if (c.size() != 23) throw bad(detail::cat("a row of ", c.size(), " columns, not 23"));
    std::size_t col = 0;
    // Column col as a number: all of it, or the row is refused naming the column.
    const auto num = [&](std::size_t i, auto parse) {
      col = i;
      std::size_t used = 0;
      const auto v = parse(c[i], &used);
      if (used != c[i].size()) throw std::invalid_argument("trailing text");
      if constexpr (std::is_floating_point_v<decltype(v)>) {
        if (!std::isfinite(v)) throw std::invalid_argument("not finite");
      }
      return v;
    };
    const auto i32 = [](const std::string& t, std::size_t* u) { return std::stoi(t, u); };
    const auto u64 = [](const std::string& t, std::size_t* u) {
      if (t.find('-') != std::string::npos) throw std::invalid_argument("negative");  // stoull wraps "-1"
      return std::stoull(t, u);
    };
    const auto f64 = [](const std::string& t, std::size_t* u) { return std::stod(t, u); };
    row r;
    try {
      r.network = c[0], r.rate = c[1], r.inter_rate = c[2], r.nodes = num(3, i32), r.per_node = num(4, i32);
      r.P = num(5, i32), r.method = c[6], r.n = num(7, u64), r.density = num(8, f64);
      r.k = num(9, u64), r.iters = num(10, i32), r.sim = num(11, f64), r.compress = num(12, f64);
      r.comm = num(13, f64), r.iter = num(14, f64), r.bytes = num(15, u64);
      r.messages = num(16, u64), r.eff = num(17, f64), r.model.latency_rounds = num(18, f64);
      r.model.path_bytes = num(19, f64), r.model_inter.latency_rounds = num(20, f64);
      r.model_inter.path_bytes = num(21, f64), r.load = num(22, f64);
    } catch (const std::logic_error&) {  // std::invalid_argument and std::out_of_range
      throw bad(detail::cat("column ", col + 1, " ('", c[col], "') is not a number"));
    }
    if (r.P < 1 || r.nodes < 1 || r.per_node < 0)  // a flat run writes per_node 0
      throw bad("P and nodes must be at least 1, per_node at least 0");
    try {
      rate_bits(r.rate), rate_bits(r.inter_rate);
      // the model as this build computes it (scripts/cluster makes OpenMPI's allreduce a ring)
      std::tie(r.model, r.model_inter) =
          model_of(r.method, r.P, r.n, r.k, r.nodes, r.per_node, cost::allreduce_algorithm::ring);
    } catch (const invalid_argument& e) {  // a rate that is not one, an unknown method
      std::string m = e.what();
      if (!m.empty() && m.back() == '.') m.pop_back();
      throw bad(m);
    }
    rows.push_back(r);
  }
  require(!rows.empty(), path, " has no rows; pass the CSV a run wrote with --csv.");
  return rows;
}

// A link rate as scripts/cluster writes it ("1gbit", "100mbit", "500kbit", bits per second
// without a suffix); empty: none.
double rate_bits(const std::string& r) {
  if (r.empty()) return 0;
  char* end = nullptr;
  const double v = std::strtod(r.c_str(), &end);
  const std::string unit = end;
  require(end != r.c_str() && std::isfinite(v) && v > 0 &&
              (unit.empty() || unit == "gbit" || unit == "mbit" || unit == "kbit" || unit == "bit"),
          "the link rate '", r, "' is not a rate; scripts/cluster writes them as 1gbit, 100mbit or 500kbit.");
  if (unit == "gbit") return v * 1e9;
  if (unit == "mbit") return v * 1e6;
  if (unit == "kbit") return v * 1e3;
  return v;
}


// ---- --fit, --model-table and --plot (no MPI) ----------------------------------------------

//! scripts/cluster's tbf burst at a rate: 256 KiB, or 2 ms of traffic at high rates.
double emulated_burst(double bits_per_second) { return std::max(262144.0, std::floor(bits_per_second / 8 / 500)); }

//! Below this, measured communication times are mostly scheduling noise of the loaded
//! machine (P ranks and other jobs on 2 cores): the alpha-beta fit weighs them as absolute
//! errors.
constexpr double fit_floor_s = 0.02;

//! A fitted model: plain alpha-beta (`host` false, as before), or alpha-beta plus the host
//! terms of cost_fit.hpp (the tbf burst, host work per byte, scheduling of P / cores ranks
//! per core), fitted on relative errors of every flat run.
struct fitted {
  bool host = false;
  double cores = 2;                         // cores of the machine the runs shared
  std::map<std::string, cost::link> links;  // per rate, from the flat runs
  double alpha = 0, wire = 0, host_beta = 0, sched = 0;  // means, for rates without a fit
  cost::link get(const std::string& rate) const {
    auto it = links.find(rate);
    if (it != links.end()) return it->second;
    cost::link l = cost::link_from_rate(rate_bits(rate), alpha);
    if (host) {  // the fitted rates' wire efficiency and host terms, this rate's burst
      l.beta *= wire, l.host_beta = host_beta, l.sched = sched;
      l.burst = emulated_burst(rate_bits(rate));
    }
    return l;
  }
  double rho(const row& r) const { return host ? r.P / cores : 1.0; }
  double predict(const row& r) const {
    if (r.method == "hierarchical")
      return cost::comm_time(r.model, get(r.rate), rho(r)) + cost::comm_time(r.model_inter, get(r.inter_rate), rho(r));
    // a flat algorithm on the two-level cluster is paced by the slow uplinks
    return cost::comm_time(r.model, get(r.network == "two-level" ? r.inter_rate : r.rate), rho(r));
  }
};

bool fit_row(const row& r) { return r.network == "flat" && r.comm > 0 && r.P > 1; }

//! The same configuration: repeated runs of one point.
bool same_point(const row& a, const row& b) {
  return std::tie(a.network, a.rate, a.inter_rate, a.P, a.method, a.n, a.density, a.sim) ==
         std::tie(b.network, b.rate, b.inter_rate, b.P, b.method, b.n, b.density, b.sim);
}

//! The fit over the flat rows i with !skip(i) (leave-one-out validation skips one).
template <class Skip>
fitted fit_rows(const std::vector<row>& rows, bool host, double cores, Skip skip) {
  fitted f;
  f.host = host, f.cores = cores;
  std::map<std::string, std::vector<cost::comm_sample>> by_rate;
  for (std::size_t i = 0; i < rows.size(); ++i)
    if (fit_row(rows[i]) && !skip(i)) by_rate[rows[i].rate].push_back({rows[i].model, rows[i].comm, f.rho(rows[i])});
  for (auto& [rate, s] : by_rate)
    f.links[rate] = host ? cost::fit_host_link(s, emulated_burst(rate_bits(rate))) : cost::fit_link(s, fit_floor_s);
  const double m = static_cast<double>(std::max<std::size_t>(1, f.links.size()));
  for (auto& [rate, l] : f.links) {
    f.alpha += l.alpha / m, f.host_beta += l.host_beta / m, f.sched += l.sched / m;
    f.wire += l.beta * rate_bits(rate) / 8 / m;
  }
  return f;
}
fitted fit_rows(const std::vector<row>& rows, bool host = false, double cores = 2) {
  return fit_rows(rows, host, cores, [](std::size_t) { return false; });
}

struct paper_model {
  const char* name;
  double params, e_dense, e_topk, e_gtopk;  // scaling efficiency (%) on 32 workers, 1 Gbit/s
};
const paper_model paper_models[] = {{"VGG-16", 138e6, 0.96, 4.78, 9.35},
                                    {"AlexNet", 61e6, 0.71, 5.32, 9.09},
                                    {"ResNet-50", 25.6e6, 20.3, 57.8, 74.0},
                                    {"ResNet-20", 0.27e6, 31.3, 75.6, 85.7}};

void model_table(const fitted& f) {
  const double alpha = f.links.count("1gbit") ? f.links.at("1gbit").alpha : f.alpha;
  std::printf("\n## Model: P up to 1024 (alpha = %.1f us fitted at 1 Gbit/s, beta = 8 / rate, density 0.001)\n",
              alpha * 1e6);
  std::printf("Compute per iteration t_c calibrated from the paper's dense efficiency at P = 32, 1 Gbit/s:\n"
              "t_c = e / (1 - e) * t_dense(32). Predicted Top-k and gTop-k efficiencies at P = 32 beside the paper's:\n\n");
  std::printf("| model | params | t_c (s) | dense %% model / paper | Top-k %% model / paper | gTop-k %% model / paper | "
              "gTop-k/dense model / paper | gTop-k/Top-k model / paper |\n|---|---|---|---|---|---|---|---|\n");
  const cost::link g1 = cost::link_from_rate(1e9, alpha), g10 = cost::link_from_rate(10e9, alpha);
  std::map<std::string, double> tc;
  for (const auto& m : paper_models) {
    const auto n = static_cast<std::uint64_t>(m.params), k = static_cast<std::uint64_t>(std::round(m.params * 1e-3));
    const double e = m.e_dense / 100, t = e / (1 - e) * cost::comm_time(cost::dense(32, n), g1);
    tc[m.name] = t;
    const double ed = cost::scaling_efficiency(t, cost::comm_time(cost::dense(32, n), g1));
    const double et = cost::scaling_efficiency(t, cost::comm_time(cost::topk(32, n, k), g1));
    const double eg = cost::scaling_efficiency(t, cost::comm_time(cost::gtopk(32, n, k), g1));
    std::printf("| %s | %.3gM | %.3g | %.2f / %.2f | %.2f / %.2f | %.2f / %.2f | %.1fx / %.1fx | %.2fx / %.2fx |\n", m.name,
                m.params / 1e6, t, 100 * ed, m.e_dense, 100 * et, m.e_topk, 100 * eg, m.e_gtopk, eg / ed,
                m.e_gtopk / m.e_dense, eg / et, m.e_gtopk / m.e_topk);
  }
  for (const auto& [label, l] : {std::pair{"1 Gbit/s", g1}, std::pair{"10 Gbit/s", g10}}) {
    std::printf("\n### %s: communication time per iteration (ms) and scaling efficiency (%%), dense / Top-k / gTop-k\n\n",
                label);
    std::printf("| P |");
    for (const auto& m : paper_models) std::printf(" %s comm ms | %s eff %% |", m.name, m.name);
    std::printf("\n|---|");
    for (std::size_t i = 0; i < std::size(paper_models); ++i) std::printf("---|---|");
    std::printf("\n");
    for (int P = 2; P <= 1024; P *= 2) {
      std::printf("| %d |", P);
      for (const auto& m : paper_models) {
        const auto n = static_cast<std::uint64_t>(m.params), k = static_cast<std::uint64_t>(std::round(m.params * 1e-3));
        const double d = cost::comm_time(cost::dense(P, n), l), t = cost::comm_time(cost::topk(P, n, k), l);
        const double g = cost::comm_time(cost::gtopk(P, n, k), l), c = tc[m.name];
        std::printf(" %.4g / %.4g / %.4g | %.1f / %.1f / %.1f |", d * 1e3, t * 1e3, g * 1e3,
                    100 * cost::scaling_efficiency(c, d), 100 * cost::scaling_efficiency(c, t),
                    100 * cost::scaling_efficiency(c, g));
      }
      std::printf("\n");
    }
  }
}

int report_fit(const cfg& c) {
  const auto rows = read_csv(c.fit);
  const auto f = fit_rows(rows), h = fit_rows(rows, true, c.cores);
  std::printf("## Fitted links (least squares of errors relative to max(t, 20 ms), flat runs)\n\n| rate | alpha (us) | beta (ns/byte) | "
              "effective Gbit/s |\n|---|---|---|---|\n");
  for (const auto& [rate, l] : f.links)
    std::printf("| %s | %.1f | %.4f | %.3f |\n", rate.c_str(), l.alpha * 1e6, l.beta * 1e9, 8 / l.beta / 1e9);
  std::printf("\n## Host-aware links (cost_fit.hpp: least squares of relative errors, flat runs, rho = P / %g cores)\n\n"
              "| rate | alpha (us) | beta (ns/byte beyond the burst) | host_beta (ns/byte) | burst (bytes, tbf) | "
              "sched (us per round per extra rank per core) |\n|---|---|---|---|---|---|\n", c.cores);
  for (const auto& [rate, l] : h.links)
    std::printf("| %s | %.1f | %.4f | %.4f | %.0f | %.1f |\n", rate.c_str(), l.alpha * 1e6, l.beta * 1e9,
                l.host_beta * 1e9, l.burst, l.sched * 1e6);
  std::map<std::string, std::vector<cost::comm_sample>> by_method;
  for (const auto& r : rows) {
    cost::step_cost e;
    e.compute_elements = static_cast<double>(r.n);
    if (r.compress > 0) by_method[r.method].push_back({e, r.compress});
  }
  std::printf("\n## Compressor compute per element (gamma, all ranks sharing the machine's cores)\n\n| method | gamma "
              "(ns/element) |\n|---|---|\n");
  for (auto& [m, s] : by_method) std::printf("| %s | %.3f |\n", m.c_str(), cost::fit_gamma(s) * 1e9);
  std::printf("\n## Model error against every measured communication time\n\nIn-sample: the fit over every flat run; "
              "LOO: refitted without the row itself; LOPO: refitted without every run of the row's point (same "
              "network, rates, P, method, n). Two-level rows are never fitted: LOO = LOPO = in-sample.\n\n"
              "| network | rate | inter | P | method | n | measured ms | alpha-beta ms | error | LOO | LOPO | host-aware ms | "
              "error | LOO | LOPO |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  struct tally {
    int ok = 0, total = 0, ok_big = 0, total_big = 0;
    double worst = 0;
    void add(double e, bool big) {
      worst = std::max(worst, std::abs(e)), ++total, ok += std::abs(e) <= 0.25;
      if (big) ++total_big, ok_big += std::abs(e) <= 0.25;
    }
  } t[6];  // alpha-beta in-sample, LOO, LOPO; host-aware in-sample, LOO, LOPO
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    if (r.P < 2 || r.comm <= 0) continue;
    const auto one = [&](std::size_t j) { return j == i; };
    const auto point = [&](std::size_t j) { return same_point(rows[j], r); };
    double p[6];
    for (int m = 0; m < 2; ++m) {
      const bool host = m == 1;
      p[3 * m] = (host ? h : f).predict(r);
      p[3 * m + 1] = fit_row(r) ? fit_rows(rows, host, c.cores, one).predict(r) : p[3 * m];
      p[3 * m + 2] = fit_row(r) ? fit_rows(rows, host, c.cores, point).predict(r) : p[3 * m];
    }
    double e[6];
    for (int j = 0; j < 6; ++j) e[j] = cost::relative_error(p[j], r.comm), t[j].add(e[j], r.comm >= fit_floor_s);
    std::printf("| %s | %s | %s | %d | %s | %llu | %.3f | %.3f | %+.1f%% | %+.1f%% | %+.1f%% | %.3f | %+.1f%% | %+.1f%% | "
                "%+.1f%% |\n",
                r.network.c_str(), r.rate.c_str(), r.inter_rate.c_str(), r.P, r.method.c_str(), (unsigned long long)r.n,
                r.comm * 1e3, p[0] * 1e3, 100 * e[0], 100 * e[1], 100 * e[2], p[3] * 1e3, 100 * e[3], 100 * e[4],
                100 * e[5]);
  }
  std::printf("\n| model | within 25%% | largest abs error | within 25%%, points >= %g ms |\n|---|---|---|---|\n",
              fit_floor_s * 1e3);
  const char* names[6] = {"alpha-beta, in-sample",        "alpha-beta, leave-one-out", "alpha-beta, leave-point-out",
                          "host-aware, in-sample",        "host-aware, leave-one-out", "host-aware, leave-point-out"};
  for (int j = 0; j < 6; ++j)
    std::printf("| %s | %d of %d | %.1f%% | %d of %d |\n", names[j], t[j].ok, t[j].total, 100 * t[j].worst, t[j].ok_big,
                t[j].total_big);
  if (!c.predict.empty()) {  // out of sample: rows the fits never saw
    std::printf("\n## Out of sample: the fits above against every row of %s\n\n| network | rate | inter | P | method | n | "
                "measured ms | alpha-beta ms | error | host-aware ms | error |\n|---|---|---|---|---|---|---|---|---|---|---|\n",
                c.predict.c_str());
    tally o[2];
    for (const auto& r : read_csv(c.predict)) {
      if (r.P < 2 || r.comm <= 0) continue;
      const double pf = f.predict(r), ph = h.predict(r);
      const double ef = cost::relative_error(pf, r.comm), eh = cost::relative_error(ph, r.comm);
      o[0].add(ef, r.comm >= fit_floor_s), o[1].add(eh, r.comm >= fit_floor_s);
      std::printf("| %s | %s | %s | %d | %s | %llu | %.3f | %.3f | %+.1f%% | %.3f | %+.1f%% |\n", r.network.c_str(),
                  r.rate.c_str(), r.inter_rate.c_str(), r.P, r.method.c_str(), (unsigned long long)r.n, r.comm * 1e3,
                  pf * 1e3, 100 * ef, ph * 1e3, 100 * eh);
    }
    std::printf("\nout of sample, within 25%%: alpha-beta %d of %d (largest %.1f%%), host-aware %d of %d (largest %.1f%%)\n",
                o[0].ok, o[0].total, 100 * o[0].worst, o[1].ok, o[1].total, 100 * o[1].worst);
  }
  if (c.model_table) model_table(f);
  return 0;
}

int report_plots(const cfg& c) {
  const auto rows = read_csv(c.plot);
  const auto f = fit_rows(rows), h = fit_rows(rows, true, c.cores);
  const std::string dir = c.plot_dir;
  // the largest size measured at more than one P
  std::map<std::uint64_t, std::set<int>> ps;
  for (const auto& r : rows) ps[r.n].insert(r.P);
  std::uint64_t nmax = 0;
  for (const auto& [n, p] : ps)
    if (p.size() > 1) nmax = n;
  // 1. communication time against P, dense / Top-k / gTop-k, per rate
  std::vector<std::string> series;
  {
    std::ofstream d(dir + "/scaling_comm_vs_p.dat");
    for (const std::string rate : {"100mbit", "1gbit", "10gbit"})
      for (const std::string m : {"dense", "topk", "gtopk"}) {
        bool any = false;
        for (const auto& r : rows) any |= r.network == "flat" && r.rate == rate && r.method == m && r.n == nmax;
        if (!any) continue;
        series.push_back(m + " " + rate);
        d << "# " << rate << " " << m << "\n";
        for (const auto& r : rows)
          if (r.network == "flat" && r.rate == rate && r.method == m && r.n == nmax)
            d << r.P << " " << r.comm * 1e3 << " " << f.predict(r) * 1e3 << "\n";
        d << "\n\n";
      }
  }
  // 2. compute and communication per method at the largest P and n, 1 Gbit/s
  int pmax = 0;
  for (const auto& r : rows) pmax = std::max(pmax, r.P);
  {
    std::ofstream d(dir + "/scaling_methods.dat");
    std::set<std::string> seen;  // the first run of each method, without simulated compute
    for (const auto& r : rows)
      if (r.network == "flat" && r.rate == "1gbit" && r.P == pmax && r.n == nmax && r.sim == 0 &&
          seen.insert(r.method).second)
        d << r.method << " " << r.compress * 1e3 << " " << r.comm * 1e3 << "\n";
  }
  // 3. model against measurement
  {
    std::ofstream d(dir + "/scaling_model.dat");
    for (const auto& r : rows)
      if (r.P > 1 && r.comm > 0) d << r.comm * 1e3 << " " << f.predict(r) * 1e3 << " " << h.predict(r) * 1e3 << "\n";
  }
  std::ofstream g(dir + "/scaling_plots.gp");
  g << "set terminal pngcairo size 900,600 noenhanced\nset grid\n"
    << "set output 'scaling_comm_vs_p.png'\nset logscale y\nset xlabel 'P (ranks)'\nset ylabel 'communication ms per "
       "iteration'\nset title 'n = "
    << nmax << " floats, density 0.001: measured (points) and model (lines)'\nset key outside right\n"
    << "plot ";
  for (std::size_t i = 0; i < series.size(); ++i)
    g << (i ? ", " : "") << "'scaling_comm_vs_p.dat' index " << i << " using 1:2 with points pt " << 5 + i % 3
      << " lc " << 1 + i / 3 << " title '" << series[i] << "', '' index " << i << " using 1:3 with lines lc "
      << 1 + i / 3 << " notitle";
  g << "\n"
    << "unset logscale y\nset output 'scaling_methods.png'\nset style data histograms\nset style histogram rowstacked\n"
    << "set style fill solid 0.8 border -1\nset boxwidth 0.7\nset xlabel ''\nset ylabel 'ms per iteration'\n"
    << "set xtics rotate by -30\nset title 'P = " << pmax << ", n = " << nmax
    << ", 1 Gbit/s: compressor compute and communication'\n"
    << "plot 'scaling_methods.dat' using 2:xtic(1) title 'compute', '' using 3 title 'communication'\n"
    << "set style data points\nunset xtics\nset xtics\nset output 'scaling_model.png'\nset logscale xy\n"
    << "set xlabel 'measured communication ms'\nset ylabel 'model ms'\nset title 'models against every "
       "measured point'\nplot 'scaling_model.dat' using 1:2 pt 7 title 'alpha-beta', '' using 1:3 pt 5 title "
       "'host-aware', x title 'exact', 1.25*x dt 2 title '+25%', 0.75*x dt 2 title '-25%'\n";
  g.close();
  const std::string cmd = "cd '" + dir + "' && gnuplot scaling_plots.gp";
  return std::system(cmd.c_str()) == 0 ? 0 : 1;
}

int run(const cfg& c) {
  MpiComm world{MPI_COMM_WORLD, {.verify_collectives = false}};
  const int P = world.size(), me = world.rank();
  const std::string rate = env("COMMPACT_CLUSTER_RATE", "none"), inter = env("COMMPACT_CLUSTER_INTER_RATE");
  const int per_node = std::atoi(env("COMMPACT_CLUSTER_PER_NODE", "0").c_str());
  const int nodes = std::max(1, std::atoi(env("COMMPACT_CLUSTER_NODES", "1").c_str()));
  const int node = std::atoi(env("COMMPACT_CLUSTER_NODE", "0").c_str());
  std::FILE* out = nullptr;
  if (me == 0 && !c.csv.empty()) {
    std::ifstream probe(c.csv);
    const bool fresh = !probe.good() || probe.peek() == std::ifstream::traits_type::eof();
    out = std::fopen(c.csv.c_str(), "a");
    require(out != nullptr, "cannot append to ", c.csv, ".");
    if (fresh) std::fputs(csv_header, out);
  }
  if (me == 0)
    std::printf("# P=%d rate=%s inter=%s nodes=%d load1=%.2f compute=%gms\n%-13s %9s %10s %10s %10s %12s %6s %6s\n", P,
                rate.c_str(), inter.c_str(), nodes, load1(), c.compute_ms, "method", "n", "iter_ms", "compress_ms",
                "comm_ms", "bytes", "msgs", "eff");
  for (const auto& size : c.sizes) {
    const std::uint64_t n = parse_size(size);
    const auto layout = layout_of(n);
    std::mt19937_64 gen(1234 + static_cast<std::uint64_t>(me));
    std::normal_distribution<float> dist;
    std::vector<float> g0(n);
    for (auto& x : g0) x = dist(gen);
    const auto k = static_cast<std::uint64_t>(std::clamp<double>(std::round(c.density * double(n)), 1, double(n)));
    // OMPI_MCA_coll_libnbc_iallreduce_algorithm=1 makes OpenMPI's allreduce a ring at every P
    const auto algo = env("OMPI_MCA_coll_libnbc_iallreduce_algorithm") == "1" ? cost::allreduce_algorithm::ring
                                                                             : cost::allreduce_algorithm::openmpi;
    for (const auto& m : c.methods) {
      row r;
      r.network = per_node > 0 ? "two-level" : "flat";
      r.rate = rate, r.inter_rate = inter, r.nodes = nodes, r.per_node = per_node, r.P = P, r.method = m;
      r.n = n, r.density = c.density, r.iters = c.iters, r.sim = c.compute_ms / 1e3;
      Net net{CountingComm<MpiComm>{world}};
      auto& counted = net.inner();
      result res;
      if (m == "dense") {
        auto a = make_dense(net);
        res = time_it(c, net, counted, g0, [&](std::vector<float>& w) { a.reduce(std::span(w)); });
      } else if (m == "topk") {
        auto a = make_topk(net, c.density);
        res = time_it(c, net, counted, g0, [&](std::vector<float>& w) { a.reduce(std::span(w)); });
        r.k = k;
      } else if (m == "gtopk") {
        auto a = make_gtopk(net, c.density);
        res = time_it(c, net, counted, g0, [&](std::vector<float>& w) { a.reduce(std::span(w)); });
        r.k = k;
      } else if (m == "powersgd") {
        auto a = make_powersgd(net, layout);
        res = time_it(c, net, counted, g0, [&](std::vector<float>& w) { a.reduce(std::span(w)); });
      } else if (m == "dpsgd" || m == "powergossip") {
        if (P == 1) continue;
        auto run_mixer = [&](auto mixer) {
          return time_it(c, net, counted, g0, [&](std::vector<float>& w) { mixer.mix(std::span(w)); });
        };
        res = m == "dpsgd" ? run_mixer(make_dpsgd(net, layout)) : run_mixer(make_powergossip(net, layout));
      } else if (m == "localsgd" || m == "qsr") {
        auto dp = make_local_sgd(net, local_h, std::int64_t{local_h} * (c.iters + 1));
        std::vector<float> params(n, 0.0f);
        auto sgd = [](std::span<float> x, std::span<const float> g, double lr) {
          for (std::size_t i = 0; i < x.size(); ++i) x[i] -= static_cast<float>(lr) * g[i];
        };
        res = time_it(
            c, net, counted, g0, [&](std::vector<float>& w) { dp.step(std::span(params), std::span(w), 0.01, sgd); },
            local_h);
        if (m == "qsr") {  // the same measured round, amortised over QSR's mean period
          const double H = qsr_mean_period(), f = local_h / H;
          res.comm *= f;
          res.iter = res.compress + res.comm;  // derived
          res.bytes = static_cast<std::uint64_t>(double(res.bytes) * f);
          res.messages = static_cast<std::uint64_t>(std::llround(double(res.messages) * f));
        }
      } else if (m == "hierarchical") {
        if (per_node <= 0) continue;  // needs the two-level cluster
        HNet hnet{CountingComm<HierarchicalComm<MpiComm>>{
            hierarchical_mpi(MPI_COMM_WORLD, node, {.verify_collectives = false})}};
        auto a = make_hierarchical(hnet);
        auto& hc = hnet.inner();
        res = time_it(c, hnet, hc, g0, [&](std::vector<float>& w) { a.reduce(std::span(w)); });
        const auto h = cost::hierarchical(nodes, per_node, n, algo);
        res.bytes = h.inter.bytes_sent, res.messages = h.inter.messages_sent;  // the leaders' slow-link share
      } else {
        throw unknown_method(m);
      }
      std::tie(r.model, r.model_inter) = model_of(m, P, n, r.k, nodes, per_node, algo);
      r.compress = res.compress, r.comm = res.comm, r.iter = res.iter + r.sim, r.bytes = res.bytes;
      r.messages = res.messages;
      if (r.sim > 0) r.eff = r.sim / r.iter;
      r.load = load1();
      if (me == 0) {
        std::printf("%-13s %9s %10.2f %10.2f %10.2f %12llu %6llu %6.3f\n", m.c_str(), size.c_str(), r.iter * 1e3,
                    r.compress * 1e3, r.comm * 1e3, (unsigned long long)r.bytes, (unsigned long long)r.messages, r.eff);
        std::fflush(stdout);
        if (out) write_row(out, r), std::fflush(out);
      }
    }
  }
  if (out) std::fclose(out);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  cfg c;
  CLI::App app{"bench_scaling: time per iteration on the emulated cluster (run under scripts/cluster)"};
  app.add_option("--n", c.sizes,
                 "gradient sizes in floats, each at least 1; K, M, G = 2^10, 2^20, 2^30, e.g. 1M,4M,16M,25M")
      ->delimiter(',');
  app.add_option("--methods", c.methods, "dense,topk,gtopk,powersgd,localsgd,qsr,dpsgd,powergossip,hierarchical")
      ->delimiter(',')
      ->check(CLI::IsMember(known_methods));
  app.add_option("--density", c.density, "Top-k / gTop-k density, in (0, 1]")
      ->check(bench_args::real_check(0, false, 1, true));
  app.add_option("--iters", c.iters, "timed iterations (median), after one warm-up")->check(CLI::Range(1, 1000));
  app.add_option("--compute-ms", c.compute_ms, "simulated compute per iteration (sleep), ms")
      ->check(bench_args::real_check(0, true, 1e9, true));
  app.add_option("--csv", c.csv, "append one row per method and size to this CSV (rank 0)");
  app.add_option("--fit", c.fit, "no MPI: fit alpha and beta per link rate from this CSV and print the model's error");
  app.add_flag("--model-table", c.model_table, "with --fit: the model's table for P up to 1024");
  app.add_option("--cores", c.cores, "with --fit / --plot: cores of the machine the CSV was measured on (rho = P / cores)")
      ->check(bench_args::real_check(0, false, 1e6, true));
  app.add_option("--predict", c.predict, "with --fit: the fitted models' error on every row of this CSV (out of sample)");
  app.add_option("--plot", c.plot, "no MPI: write gnuplot PNGs of this CSV to --plot-dir");
  app.add_option("--plot-dir", c.plot_dir, "where --plot writes scaling_*.png");
  try {
    app.parse(argc, argv);
    for (const auto& size : c.sizes) parse_size(size);
  } catch (const CLI::ParseError& e) {
    return bench_args::cli_failure(app, e, "bench_scaling");
  } catch (const bench_args::error& e) {
    return bench_args::usage_error("bench_scaling", e.what());
  }
  try {
    if (!c.fit.empty()) return report_fit(c);
    if (!c.plot.empty()) return report_plots(c);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_scaling: %s\n", e.what());
    return 1;
  }
  MPI_Init(&argc, &argv);
  int rc = 0;
  try {
    rc = run(c);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_scaling: %s\n", e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return rc;
}
