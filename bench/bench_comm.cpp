// MpiComm against raw MPI, side by side in one run: allreduce, allgather, broadcast and
// a pairwise send/recv exchange from 1 KiB to 64 MiB. Run under mpiexec (every rank runs
// every benchmark with a fixed iteration count; rank 0 reports):
//
//   mpiexec --allow-run-as-root --oversubscribe -n 2 build/bench/bench_comm
//
// Variants (the `x_raw` counter is the time relative to `raw` for the same operation
// and size, measured minutes apart at most, in the same run):
//   raw          MPI_Allreduce(MPI_IN_PLACE) / MPI_Allgather / MPI_Bcast / MPI_Sendrecv
//   raw_nb       the nonblocking MPI call MpiComm uses, then MPI_Wait (collectives only)
//   default      MpiComm{world}: signature check + staging (safe)
//   checked      CheckedComm<MpiComm> over an unchecked MpiComm (the decorator's check)
//   unchecked    MpiComm{verify_collectives = false} (staging kept)
//   unchecked_nostage  MpiComm{verify_collectives = false, isolate_buffers = false}
//   known        (send/recv only) isend + irecv of a known size on a default MpiComm
// Sizes are per call: allgather's output is `bytes` in total (P blocks of bytes / P).
#include <benchmark/benchmark.h>
#include <mpi.h>

#include <chrono>
#include <commpact/comm/checked_comm.hpp>
#include <commpact/comm/mpi_comm.hpp>
#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <vector>

using namespace commpact;

namespace {

struct world_t {
  MpiComm def{MPI_COMM_WORLD};
  MpiComm unchecked{MPI_COMM_WORLD, {.verify_collectives = false}};
  MpiComm nostage{MPI_COMM_WORLD, {.verify_collectives = false, .isolate_buffers = false}};
  CheckedComm<MpiComm> checked{unchecked};
  MPI_Comm raw = MPI_COMM_NULL;
  world_t() { MPI_Comm_dup(MPI_COMM_WORLD, &raw); }
  ~world_t() { MPI_Comm_free(&raw); }
};
std::unique_ptr<world_t> g_world;
std::map<std::string, double> g_raw_seconds;  // "op/bytes" -> seconds per iteration of raw

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
  if (bytes <= (16u << 20)) return 6;
  return 3;
}

template <class Op>
void timed(benchmark::State& st, const std::string& key, bool is_raw, std::size_t bytes, Op&& op) {
  op();  // warm up (staging and pools grow here)
  MPI_Barrier(MPI_COMM_WORLD);
  double total = 0;
  for (auto _ : st) {
    const auto t0 = std::chrono::steady_clock::now();
    op();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    st.SetIterationTime(s);
    total += s;
  }
  const double per = total / static_cast<double>(st.iterations());
  if (is_raw) g_raw_seconds[key] = per;
  if (auto it = g_raw_seconds.find(key); it != g_raw_seconds.end()) st.counters["x_raw"] = per / it->second;
  st.SetBytesProcessed(static_cast<std::int64_t>(bytes) * st.iterations());
}

void bench_allreduce(benchmark::State& st, std::string variant, std::size_t bytes) {
  auto& w = *g_world;
  std::vector<float> g(bytes / sizeof(float), 1.f);
  std::span<float> s(g);
  const int n = static_cast<int>(g.size());
  const std::string key = "allreduce/" + std::to_string(bytes);
  if (variant == "raw")
    timed(st, key, true, bytes, [&] { MPI_Allreduce(MPI_IN_PLACE, g.data(), n, MPI_FLOAT, MPI_SUM, w.raw); });
  else if (variant == "raw_nb")
    timed(st, key, false, bytes, [&] {
      MPI_Request q;
      MPI_Iallreduce(MPI_IN_PLACE, g.data(), n, MPI_FLOAT, MPI_SUM, w.raw, &q);
      MPI_Wait(&q, MPI_STATUS_IGNORE);
    });
  else if (variant == "default") timed(st, key, false, bytes, [&] { w.def.allreduce(s); });
  else if (variant == "checked") timed(st, key, false, bytes, [&] { w.checked.allreduce(s); });
  else if (variant == "unchecked") timed(st, key, false, bytes, [&] { w.unchecked.allreduce(s); });
  else timed(st, key, false, bytes, [&] { w.nostage.allreduce(s); });
}

void bench_allgather(benchmark::State& st, std::string variant, std::size_t bytes) {
  auto& w = *g_world;
  const std::size_t block = bytes / static_cast<std::size_t>(size_of_world());
  std::vector<std::byte> in(block, std::byte{1}), out(block * static_cast<std::size_t>(size_of_world()));
  std::span<const std::byte> si(in);
  std::span<std::byte> so(out);
  const int n = static_cast<int>(block);
  const std::string key = "allgather/" + std::to_string(bytes);
  if (variant == "raw")
    timed(st, key, true, bytes, [&] { MPI_Allgather(in.data(), n, MPI_BYTE, out.data(), n, MPI_BYTE, w.raw); });
  else if (variant == "raw_nb")
    timed(st, key, false, bytes, [&] {
      MPI_Request q;
      MPI_Iallgather(in.data(), n, MPI_BYTE, out.data(), n, MPI_BYTE, w.raw, &q);
      MPI_Wait(&q, MPI_STATUS_IGNORE);
    });
  else if (variant == "default") timed(st, key, false, bytes, [&] { w.def.allgather(si, so); });
  else if (variant == "checked") timed(st, key, false, bytes, [&] { w.checked.allgather(si, so); });
  else if (variant == "unchecked") timed(st, key, false, bytes, [&] { w.unchecked.allgather(si, so); });
  else timed(st, key, false, bytes, [&] { w.nostage.allgather(si, so); });
}

void bench_broadcast(benchmark::State& st, std::string variant, std::size_t bytes) {
  auto& w = *g_world;
  std::vector<std::byte> d(bytes, std::byte{3});
  std::span<std::byte> s(d);
  const int n = static_cast<int>(bytes);
  const std::string key = "broadcast/" + std::to_string(bytes);
  if (variant == "raw") timed(st, key, true, bytes, [&] { MPI_Bcast(d.data(), n, MPI_BYTE, 0, w.raw); });
  else if (variant == "raw_nb")
    timed(st, key, false, bytes, [&] {
      MPI_Request q;
      MPI_Ibcast(d.data(), n, MPI_BYTE, 0, w.raw, &q);
      MPI_Wait(&q, MPI_STATUS_IGNORE);
    });
  else if (variant == "default") timed(st, key, false, bytes, [&] { w.def.broadcast(s, 0); });
  else if (variant == "checked") timed(st, key, false, bytes, [&] { w.checked.broadcast(s, 0); });
  else if (variant == "unchecked") timed(st, key, false, bytes, [&] { w.unchecked.broadcast(s, 0); });
  else timed(st, key, false, bytes, [&] { w.nostage.broadcast(s, 0); });
}

// Pairwise exchange with rank ^ 1 (an odd last rank idles).
void bench_sendrecv(benchmark::State& st, std::string variant, std::size_t bytes) {
  auto& w = *g_world;
  const int r = rank_of_world(), peer = r ^ 1;
  const bool paired = peer < size_of_world();
  std::vector<std::byte> msg(bytes, std::byte{5}), got(bytes);
  std::vector<std::byte> buf;
  buf.reserve(bytes);
  const int n = static_cast<int>(bytes);
  const std::string key = "sendrecv/" + std::to_string(bytes);
  auto exchange = [&](MpiComm& c) {
    if (paired) c.sendrecv(peer, msg, buf);
  };
  auto known = [&](MpiComm& c) {
    if (!paired) return;
    auto rq = c.irecv(peer, got);
    auto sq = c.isend(peer, msg);
    rq.wait();
    sq.wait();
  };
  if (variant == "raw")
    timed(st, key, true, bytes, [&] {
      if (paired)
        MPI_Sendrecv(msg.data(), n, MPI_BYTE, peer, 0, got.data(), n, MPI_BYTE, peer, 0, w.raw, MPI_STATUS_IGNORE);
    });
  else if (variant == "default") timed(st, key, false, bytes, [&] { exchange(w.def); });
  else if (variant == "known") timed(st, key, false, bytes, [&] { known(w.def); });
  else if (variant == "checked") timed(st, key, false, bytes, [&] {
      if (paired) w.checked.sendrecv(peer, msg, buf);
    });
  else if (variant == "unchecked") timed(st, key, false, bytes, [&] { exchange(w.unchecked); });
  else timed(st, key, false, bytes, [&] { known(w.nostage); });
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
  const std::vector<std::size_t> sizes = {1u << 10, 64u << 10, 1u << 20, 16u << 20, 64u << 20};
  const std::vector<std::string> coll = {"raw", "raw_nb", "default", "checked", "unchecked", "unchecked_nostage"};
  const std::vector<std::string> p2p = {"raw", "default", "known", "checked", "unchecked", "unchecked_nostage"};
  auto add = [&](const char* op, auto fn, const std::vector<std::string>& variants) {
    for (auto bytes : sizes)
      for (const auto& v : variants)
        benchmark::RegisterBenchmark((std::string(op) + "/P" + std::to_string(P) + "/" + std::to_string(bytes >> 10) +
                                      "KiB/" + v)
                                         .c_str(),
                                     fn, v, bytes)
            ->Iterations(iterations_for(bytes))
            ->UseManualTime()
            ->Unit(benchmark::kMicrosecond);
  };
  add("allreduce", bench_allreduce, coll);
  add("allgather", bench_allgather, coll);
  add("broadcast", bench_broadcast, coll);
  add("sendrecv", bench_sendrecv, p2p);
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
