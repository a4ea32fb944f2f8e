// What MpiComm's signature check costs, against raw MPI, in one run (a plain MPI program;
// bench_comm times the collectives themselves). At 64 KiB, P = 4 it separates the check
// from the data: a barrier of the default MpiComm is the check alone (the direct
// exchange up to 8 ranks), CheckedComm's barrier the recursive doubling of 56 bytes, and
// "check, then gather" is the check, then the unchecked allgather. On one node the default
// allgather and "nostage" take shared memory (mpi/shared_memory.hpp): stage, check, copy
// out; "default, point to point" is the default with shared_memory_max = 0 (held: a block
// of up to 32 KiB travels inside the signature message; a larger one moves after the
// check). "nostage" and "unchecked, no staging" are the default and the unchecked MpiComm
// with isolate_buffers = false (no staging copy); "check, then no staging" is the check,
// then the latter (one message per peer into out).
//
//   mpiexec --allow-run-as-root --oversubscribe -n 4 build/bench/bench_comm_check [bytes] [iterations]
//
// bytes: the allgather output, 1 to 1G, K, M and G meaning 2^10, 2^20, 2^30 (default
// 64K); iterations: 1 to 10000000 (default 2000); --help: the usage (CLI11). Every rank
// parses the same arguments; on a bad one rank 0 prints the error and all ranks finalize
// and exit with status 2.
// Every call after an untimed MPI_Barrier, variants in an order shuffled per iteration
// (a fixed seed: the same order on every rank; see bench_comm.cpp for why not a
// rotation); rank 0 prints
// the median and quartiles of each variant's time and the median's ratio to raw.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <CLI/CLI.hpp>
#include <commpact/comm/checked_comm.hpp>
#include <commpact/comm/mpi_comm.hpp>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "bench_args.hpp"

using namespace commpact;

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  {
    int r = 0, P = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    MPI_Comm_size(MPI_COMM_WORLD, &P);
    std::size_t bytes = 64u << 10;
    int iterations = 2000;
    {
      // Every rank parses the same argv and reaches the same verdict; rank 0 speaks.
      std::string bytes_text = "64K", iterations_text = "2000";
      CLI::App app{"bench_comm_check: what MpiComm's signature check costs, against raw MPI (run under mpiexec)"};
      app.add_option("bytes", bytes_text, "allgather output in bytes, 1 to 1G; K, M, G = 2^10, 2^20, 2^30 (default 64K)")
          ->type_name("BYTES");
      app.add_option("iterations", iterations_text, "timed calls per variant, 1 to 10000000 (default 2000)")
          ->type_name("N");
      int rc = -1;
      try {
        app.parse(argc, argv);
        bytes = static_cast<std::size_t>(bench_args::size("bytes", bytes_text, std::uint64_t{1} << 30));
        // Each rank contributes bytes / P (the output is P blocks): at least one byte each.
        if (bytes < static_cast<std::size_t>(P))
          throw bench_args::error("bytes " + bytes_text + " must be at least the number of ranks, " +
                                  std::to_string(P) + " (each rank's block is bytes / P)");
        iterations = static_cast<int>(bench_args::integer("iterations", iterations_text, 1, 10000000));
      } catch (const CLI::ParseError& e) {
        rc = e.get_exit_code() == 0 ? 0 : bench_args::usage_status;
        if (r == 0) bench_args::cli_failure(app, e, "bench_comm_check");
      } catch (const bench_args::error& e) {
        rc = bench_args::usage_status;
        if (r == 0) bench_args::usage_error("bench_comm_check", e.what());
      }
      if (rc >= 0) {
        MPI_Finalize();
        return rc;
      }
    }
    // MpiComm's own errors (a peer that failed, a timeout, a size MPI refuses) end the
    // run on every rank with the message, instead of terminate().
    try {
      MpiComm def{MPI_COMM_WORLD}, unchecked{MPI_COMM_WORLD, {.verify_collectives = false}};
      // Without staging (isolate_buffers = false), checked and unchecked.
      MpiComm nostage{MPI_COMM_WORLD, {.isolate_buffers = false}},
          bare{MPI_COMM_WORLD, {.verify_collectives = false, .isolate_buffers = false}};
      CheckedComm<MpiComm> checked{unchecked};
      // The default without its shared-memory path (shared_memory_max = 0): what it was before.
      MpiComm p2p{MPI_COMM_WORLD, {.shared_memory_max = 0}};
      MPI_Comm raw = MPI_COMM_NULL;
      MPI_Comm_dup(MPI_COMM_WORLD, &raw);
      const std::size_t block = bytes / static_cast<std::size_t>(P);
      const int n = static_cast<int>(block);
      std::vector<std::byte> in(block, std::byte{1}), out(block * static_cast<std::size_t>(P));
      std::span<const std::byte> si(in);
      std::span<std::byte> so(out);
      const std::vector<std::pair<const char*, std::function<void()>>> v = {
          {"raw MPI_Barrier", [&] { MPI_Barrier(raw); }},
          {"default barrier (the check)", [&] { def.barrier(); }},
          {"CheckedComm barrier", [&] { checked.barrier(); }},
          {"raw MPI_Allgather", [&] { MPI_Allgather(in.data(), n, MPI_BYTE, out.data(), n, MPI_BYTE, raw); }},
          {"default allgather", [&] { def.allgather(si, so); }},
          {"default, point to point", [&] { p2p.allgather(si, so); }},
          {"unchecked allgather", [&] { unchecked.allgather(si, so); }},
          {"nostage allgather (checked)", [&] { nostage.allgather(si, so); }},
          {"unchecked, no staging", [&] { bare.allgather(si, so); }},
          {"check, then gather", [&] {
             def.barrier();
             unchecked.allgather(si, so);
           }},
          {"check, then no staging", [&] {
             def.barrier();
             bare.allgather(si, so);
           }}};
      std::vector<std::vector<double>> t(v.size());
      for (const auto& [name, fn] : v) fn();  // warm up
      std::vector<std::size_t> order(v.size());
      std::iota(order.begin(), order.end(), std::size_t{0});
      std::mt19937 shuffle_rng(20261202);  // the same seed on every rank: the same order everywhere
      for (int it = 0; it < iterations; ++it) {
        std::shuffle(order.begin(), order.end(), shuffle_rng);
        for (const std::size_t i : order) {
          MPI_Barrier(MPI_COMM_WORLD);
          const auto t0 = std::chrono::steady_clock::now();
          v[i].second();
          t[i].push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
        }
      }
      if (r == 0) {
        std::printf("P = %d, %zu bytes of allgather output, %d iterations\n", P, block * static_cast<std::size_t>(P),
                    iterations);
        std::vector<double> med(v.size());
        for (std::size_t i = 0; i < v.size(); ++i) {
          std::sort(t[i].begin(), t[i].end());
          med[i] = t[i][t[i].size() / 2];
        }
        for (std::size_t i = 0; i < v.size(); ++i) {
          const double base = i < 3 ? med[0] : med[3];
          std::printf("%-28s median %8.1f us [p25 %8.1f, p75 %8.1f]  %.2fx raw\n", v[i].first, med[i],
                      t[i][t[i].size() / 4], t[i][3 * t[i].size() / 4], med[i] / base);
        }
      }
      MPI_Comm_free(&raw);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "bench_comm_check: rank %d: %s\n", r, e.what());
      std::fflush(stderr);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  }
  MPI_Finalize();
}
