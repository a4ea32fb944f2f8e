// MpiComm against raw MPI, side by side in one run: allreduce (sum of floats),
// allgather, broadcast and a pairwise send/recv exchange from 1 KiB to 64 MiB. Run under
// mpiexec (every rank runs every benchmark with a fixed iteration count; rank 0 reports):
//
//   mpiexec --allow-run-as-root --oversubscribe -n 2 build/bench/bench_comm
//
// Build it at the flags users build with (-O2; CMake's Release default is -O3), and
// summarise several runs (median and spread of each ratio) with bench_comm_table.py:
//
//   cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O2 -DNDEBUG"
//   mpiexec ... build/bench/bench_comm --benchmark_format=json --benchmark_out=p2_1.json
//   python3 bench/bench_comm_table.py p2_*.json
//
// One benchmark per operation and size; each iteration runs every variant once, in an
// order shuffled per iteration (a fixed seed, so the same on every rank), so all variants
// see the same machine load and no variant always follows the same one, each call after
// an untimed MPI_Barrier (a rank that left the previous call early would otherwise
// charge its wait for the peer to whichever variant came next). A rotation, used before,
// gave each variant the same predecessor in every iteration: "unchecked" always followed
// "checked", which runs over the same MpiComm, and found the ring's scratch still in
// cache (allreduce, 16 MiB, P = 2: unchecked 1.00x raw against 1.28x for the default,
// which followed raw_nb; the same allreduce in both). Counters: `<variant>` is
// the median time of one call in microseconds, `<variant>_x` that median over raw's
// (medians, because a loaded machine preempts ranks now and then), `<variant>_xmin`
// the ratio of the fastest calls (the cost without interference). Variants:
//   raw          MPI_Allreduce(MPI_IN_PLACE) / MPI_Allgather / MPI_Bcast / MPI_Sendrecv
//   raw_nb       the nonblocking MPI call MpiComm uses, then MPI_Wait (collectives only)
//   default      MpiComm{world}: signature check, isolated buffers (safe); on one node,
//                allreduce and allgather through shared memory (mpi/shared_memory.hpp)
//   p2p          the default with shared_memory_max = 0: over point to point, staged
//   checked      CheckedComm<MpiComm> over an unchecked MpiComm of its own (the decorator's check)
//   unchecked    MpiComm{verify_collectives = false} (staging kept)
//   unchecked_nostage  MpiComm{verify_collectives = false, isolate_buffers = false}
//   nostage      MpiComm{isolate_buffers = false}: the check, no staging (allreduce, allgather;
//                shared memory on one node, like the default)
//   known        (send/recv only) isend + irecv of a known size on a default MpiComm;
//                unchecked_nostage_known: the same without staging
// Sizes are per call: allgather's output is `bytes` in total (P blocks of bytes / P).
#include <benchmark/benchmark.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <commpact/comm/checked_comm.hpp>
#include <commpact/comm/mpi_comm.hpp>
#include <cstddef>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

using namespace commpact;

namespace {

struct world_t {
  MpiComm def{MPI_COMM_WORLD};
  MpiComm unchecked{MPI_COMM_WORLD, {.verify_collectives = false}};
  MpiComm nostage{MPI_COMM_WORLD, {.verify_collectives = false, .isolate_buffers = false}};
  MpiComm checked_nostage{MPI_COMM_WORLD, {.isolate_buffers = false}};
  // The default without its shared-memory path: checked, isolated, over point to point.
  MpiComm p2p{MPI_COMM_WORLD, {.shared_memory_max = 0}};
  // CheckedComm wraps an unchecked MpiComm of its own: over `unchecked` it would share
  // that variant's scratch, which each of the two would then find warm after the other.
  MpiComm checked_inner{MPI_COMM_WORLD, {.verify_collectives = false}};
  CheckedComm<MpiComm> checked{checked_inner};
  MPI_Comm raw = MPI_COMM_NULL;
  world_t() { MPI_Comm_dup(MPI_COMM_WORLD, &raw); }
  ~world_t() { MPI_Comm_free(&raw); }
};
std::unique_ptr<world_t> g_world;

int rank_of_world() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int size_of_world() {
  int p = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  return p;
}

int iterations_for(std::size_t bytes) {
  if (bytes <= (4u << 10)) return 2000;
  if (bytes <= (64u << 10)) return 300;
  if (bytes <= (1u << 20)) return 40;
  if (bytes <= (4u << 20)) return 20;
  if (bytes <= (16u << 20)) return 8;
  return 5;
}

using variant_fn = std::function<void()>;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

//! Runs every variant once per iteration (rotating the order) and reports the medians.
void run_variants(benchmark::State& st, std::size_t bytes, const std::vector<std::pair<std::string, variant_fn>>& vs) {
  for (const auto& [name, fn] : vs) fn();  // warm up (staging and pools grow here)
  MPI_Barrier(MPI_COMM_WORLD);
  std::vector<std::vector<double>> t(vs.size());
  std::vector<std::size_t> order(vs.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::mt19937 shuffle_rng(20261202);  // the same seed on every rank: the same order everywhere
  for (auto _ : st) {
    double raw = 0;
    std::shuffle(order.begin(), order.end(), shuffle_rng);
    for (const std::size_t i : order) {
      MPI_Barrier(MPI_COMM_WORLD);  // untimed: every call starts together, so none pays for the last one's skew
      const auto t0 = std::chrono::steady_clock::now();
      vs[i].second();
      const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      t[i].push_back(sec);
      if (i == 0) raw = sec;
    }
    st.SetIterationTime(raw);
  }
  const double raw_med = median(t[0]), raw_min = *std::min_element(t[0].begin(), t[0].end());
  for (std::size_t i = 0; i < vs.size(); ++i) {
    const double m = median(t[i]);
    st.counters[vs[i].first] = m * 1e6;
    if (i > 0) {
      st.counters[vs[i].first + "_x"] = m / raw_med;
      st.counters[vs[i].first + "_xmin"] = *std::min_element(t[i].begin(), t[i].end()) / raw_min;
    }
  }
  st.SetBytesProcessed(static_cast<std::int64_t>(bytes) * st.iterations());
}

void bench_allreduce(benchmark::State& st, std::size_t bytes) {
  auto& w = *g_world;
  std::vector<float> g(bytes / sizeof(float), 1.f);
  std::span<float> s(g);
  const int n = static_cast<int>(g.size());
  run_variants(st, bytes,
               {{"raw", [&] { MPI_Allreduce(MPI_IN_PLACE, g.data(), n, MPI_FLOAT, MPI_SUM, w.raw); }},
                {"raw_nb",
                 [&] {
                   MPI_Request q;
                   MPI_Iallreduce(MPI_IN_PLACE, g.data(), n, MPI_FLOAT, MPI_SUM, w.raw, &q);
                   MPI_Wait(&q, MPI_STATUS_IGNORE);
                 }},
                {"default", [&] { w.def.allreduce(s, reduce_op::sum); }},
                {"checked", [&] { w.checked.allreduce(s, reduce_op::sum); }},
                {"unchecked", [&] { w.unchecked.allreduce(s, reduce_op::sum); }},
                {"unchecked_nostage", [&] { w.nostage.allreduce(s, reduce_op::sum); }},
                {"nostage", [&] { w.checked_nostage.allreduce(s, reduce_op::sum); }},
                {"p2p", [&] { w.p2p.allreduce(s, reduce_op::sum); }}});
}

void bench_allgather(benchmark::State& st, std::size_t bytes) {
  auto& w = *g_world;
  const std::size_t block = bytes / static_cast<std::size_t>(size_of_world());
  std::vector<std::byte> in(block, std::byte{1}), out(block * static_cast<std::size_t>(size_of_world()));
  std::span<const std::byte> si(in);
  std::span<std::byte> so(out);
  const int n = static_cast<int>(block);
  run_variants(st, bytes,
               {{"raw", [&] { MPI_Allgather(in.data(), n, MPI_BYTE, out.data(), n, MPI_BYTE, w.raw); }},
                {"raw_nb",
                 [&] {
                   MPI_Request q;
                   MPI_Iallgather(in.data(), n, MPI_BYTE, out.data(), n, MPI_BYTE, w.raw, &q);
                   MPI_Wait(&q, MPI_STATUS_IGNORE);
                 }},
                {"default", [&] { w.def.allgather(si, so); }},
                {"checked", [&] { w.checked.allgather(si, so); }},
                {"unchecked", [&] { w.unchecked.allgather(si, so); }},
                {"unchecked_nostage", [&] { w.nostage.allgather(si, so); }},
                {"nostage", [&] { w.checked_nostage.allgather(si, so); }},
                {"p2p", [&] { w.p2p.allgather(si, so); }}});
}

void bench_broadcast(benchmark::State& st, std::size_t bytes) {
  auto& w = *g_world;
  std::vector<std::byte> d(bytes, std::byte{3});
  std::span<std::byte> s(d);
  const int n = static_cast<int>(bytes);
  run_variants(st, bytes,
               {{"raw", [&] { MPI_Bcast(d.data(), n, MPI_BYTE, 0, w.raw); }},
                {"raw_nb",
                 [&] {
                   MPI_Request q;
                   MPI_Ibcast(d.data(), n, MPI_BYTE, 0, w.raw, &q);
                   MPI_Wait(&q, MPI_STATUS_IGNORE);
                 }},
                {"default", [&] { w.def.broadcast(s, 0); }},
                {"checked", [&] { w.checked.broadcast(s, 0); }},
                {"unchecked", [&] { w.unchecked.broadcast(s, 0); }},
                {"unchecked_nostage", [&] { w.nostage.broadcast(s, 0); }}});
}

// Pairwise exchange with rank ^ 1 (an odd last rank idles).
void bench_sendrecv(benchmark::State& st, std::size_t bytes) {
  auto& w = *g_world;
  const int r = rank_of_world(), peer = r ^ 1;
  const bool paired = peer < size_of_world();
  std::vector<std::byte> msg(bytes, std::byte{5}), got(bytes);
  std::vector<std::byte> buf;
  buf.reserve(bytes);
  const int n = static_cast<int>(bytes);
  auto exchange = [&](auto& c) {
    if (paired) c.sendrecv(peer, msg, buf);
  };
  auto known = [&](MpiComm& c) {
    if (!paired) return;
    auto rq = c.irecv(peer, got);
    auto sq = c.isend(peer, msg);
    rq.wait();
    sq.wait();
  };
  run_variants(st, bytes,
               {{"raw",
                 [&] {
                   if (paired)
                     MPI_Sendrecv(msg.data(), n, MPI_BYTE, peer, 0, got.data(), n, MPI_BYTE, peer, 0, w.raw,
                                  MPI_STATUS_IGNORE);
                 }},
                {"default", [&] { exchange(w.def); }},
                {"known", [&] { known(w.def); }},
                {"checked", [&] { exchange(w.checked); }},
                {"unchecked", [&] { exchange(w.unchecked); }},
                {"unchecked_nostage_known", [&] { known(w.nostage); }}});
}

class quiet_reporter : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  benchmark::Initialize(&argc, argv);
  g_world = std::make_unique<world_t>();
  const int P = size_of_world();
  const std::vector<std::size_t> sizes = {1u << 10, 64u << 10, 1u << 20, 4u << 20, 16u << 20, 64u << 20};
  auto add = [&](const char* op, void (*fn)(benchmark::State&, std::size_t)) {
    for (auto bytes : sizes)
      benchmark::RegisterBenchmark((std::string(op) + "/P" + std::to_string(P) + "/" + std::to_string(bytes >> 10) +
                                    "KiB")
                                       .c_str(),
                                   fn, bytes)
          ->Iterations(iterations_for(bytes))
          ->UseManualTime()
          ->Unit(benchmark::kMicrosecond);
  };
  add("allreduce", bench_allreduce);
  add("allgather", bench_allgather);
  add("broadcast", bench_broadcast);
  add("sendrecv", bench_sendrecv);
  if (rank_of_world() == 0) {
    benchmark::RunSpecifiedBenchmarks();
  } else {
    quiet_reporter quiet;
    benchmark::RunSpecifiedBenchmarks(&quiet);
  }
  benchmark::Shutdown();
  g_world.reset();
  MPI_Finalize();
}
