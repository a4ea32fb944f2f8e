// MpiComm: one collective called in its blocking form on some ranks and its
// nonblocking form (then wait or test) on others completes, with the bits every rank
// gets when all call the blocking form, as on ThreadComm. Sizes on
// both sides of each path switch: the latency path (recursive doubling, tree, direct
// exchange, up to 64 KiB) and the ring (allreduce above 64 KiB) or libnbc (allgather
// and broadcast above 64 KiB). Several rings in flight, waited for in a different order
// on different ranks, complete too: every wait advances every ring. The deadline is
// short, so a form that took another path would end in timeout_error here instead of
// hanging (before the fix: blocking allreduce = point to point, iallreduce =
// MPI_Iallreduce, and the two never matched).
#include <commpact/comm/checked_comm.hpp>
#include <commpact/comm/mpi_comm.hpp>

#include <catch2/catch.hpp>

#include <chrono>
#include <cstddef>
#include <span>
#include <vector>

#include "common/collective_checks.hpp"

using namespace commpact;
using namespace std::chrono_literals;

namespace {

// Which ranks take the nonblocking form: pattern 0: only rank 0; 1: the odd ranks;
// 2: every rank but rank 0.
bool nonblocking_here(int pattern, int r) {
  switch (pattern) {
    case 0: return r == 0;
    case 1: return r % 2 == 1;
    default: return r != 0;
  }
}

void check_mixed(MpiComm& comm, std::size_t n, int pattern, std::uint64_t seed) {
  const int P = comm.size(), r = comm.rank();
  const bool nb = nonblocking_here(pattern, r);
  const bool poll = r % 3 == 2;  // some nonblocking ranks poll test() instead of wait()
  auto finish = [&](mpi_request& h) {
    if (poll)
      while (!h.test()) {
      }
    else
      h.wait();
  };
  // Reference: every rank blocking.
  auto ints = commpact_test::rank_floats(seed, r, n, true), reals = commpact_test::rank_floats(seed + 1, r, n);
  auto ref_ints = ints, ref_reals = reals;
  comm.allreduce(std::span<float>(ref_ints), reduce_op::sum);
  comm.allreduce(std::span<float>(ref_reals), reduce_op::sum);
  std::vector<float> exact(n, 0.f);
  for (int q = 0; q < P; ++q) {
    const auto v = commpact_test::rank_floats(seed, q, n, true);
    for (std::size_t i = 0; i < n; ++i) exact[i] += v[i];
  }
  REQUIRE(ref_ints == exact);

  // Mixed forms, one collective at a time.
  if (nb) {
    auto h = comm.iallreduce(std::span<float>(ints), reduce_op::sum);
    finish(h);
  } else {
    comm.allreduce(std::span<float>(ints), reduce_op::sum);
  }
  REQUIRE(ints == exact);
  if (nb) {
    auto h = comm.iallreduce(std::span<float>(reals), reduce_op::sum);
    finish(h);
  } else {
    comm.allreduce(std::span<float>(reals), reduce_op::sum);
  }
  REQUIRE(reals == ref_reals);  // bit for bit: the same path as the blocking reference
  commpact_test::require_identical_on_all_ranks(comm, std::span<const float>(reals));

  const auto blk = commpact_test::rank_floats(seed + 2, r, n);
  std::vector<float> all(n * static_cast<std::size_t>(P), -1.f), ref_all(all.size());
  comm.allgather(std::span<const float>(blk), std::span<float>(ref_all));
  if (nb) {
    auto h = comm.iallgather(std::span<const float>(blk), std::span<float>(all));
    finish(h);
  } else {
    comm.allgather(std::span<const float>(blk), std::span<float>(all));
  }
  REQUIRE(all == ref_all);

  auto bc = commpact_test::rank_floats(seed + 3, r, n), ref_bc = bc;
  comm.broadcast(std::span<float>(ref_bc), P - 1);
  if (nb) {
    auto h = comm.ibroadcast(std::span<float>(bc), P - 1);
    finish(h);
  } else {
    comm.broadcast(std::span<float>(bc), P - 1);
  }
  REQUIRE(bc == ref_bc);
}

}  // namespace

TEST_CASE("MpiComm: a blocking collective on some ranks and its nonblocking form on others completes",
          "[comm][mpi][async]") {
  const bool verify = GENERATE(true, false);
  const bool isolate = GENERATE(true, false);
  // 5 s: plenty for these sizes on 8 ranks sharing 2 cores; short enough that a
  // mismatch of paths fails the test instead of hanging it.
  const std::size_t shm = GENERATE(std::size_t{0}, mpi_options{}.shared_memory_max);
  MpiComm comm{MPI_COMM_WORLD,
               {.timeout = 5s, .verify_collectives = verify, .isolate_buffers = isolate, .shared_memory_max = shm}};
  mpi_guard(comm, [&] {
    // 1 KiB and 64 KiB: the latency path; 64 KiB + 4 and 1 MiB: the ring and libnbc
    // (checked with shared_memory_max > 0: shared memory).
    for (std::size_t n : {std::size_t{256}, std::size_t{16384}, std::size_t{16385}, std::size_t{262144}})
      for (int pattern = 0; pattern < 3; ++pattern) check_mixed(comm, n, pattern, 100 * n + pattern);
  });
  REQUIRE_FALSE(comm.failed());
}

TEST_CASE("MpiComm: CheckedComm over a default MpiComm completes mixed forms too", "[comm][mpi][async]") {
  MpiComm raw{MPI_COMM_WORLD, {.timeout = 5s}};
  CheckedComm<MpiComm> comm{raw};
  const int r = raw.rank();
  mpi_guard(raw, [&] {
    for (std::size_t n : {std::size_t{300}, std::size_t{70000}}) {
      auto g = commpact_test::rank_floats(7, r, n, true), ref = g;
      raw.allreduce(std::span<float>(ref), reduce_op::sum);
      if (r == 0) comm.iallreduce(std::span<float>(g), reduce_op::sum).wait();
      else comm.allreduce(std::span<float>(g), reduce_op::sum);
      REQUIRE(g == ref);
    }
  });
}

TEST_CASE("MpiComm: rings in flight complete whatever order ranks wait for them in", "[comm][mpi][async]") {
  const bool isolate = GENERATE(true, false);
  // shared_memory_max = 0: the ring; else shared memory, which completes each call at once.
  const std::size_t shm = GENERATE(std::size_t{0}, mpi_options{}.shared_memory_max);
  MpiComm comm{MPI_COMM_WORLD, {.timeout = 5s, .isolate_buffers = isolate, .shared_memory_max = shm}};
  const int P = comm.size(), r = comm.rank();
  mpi_guard(comm, [&] {
    const std::size_t n = 50000;  // 200 KB: the ring
    std::vector<std::vector<float>> bufs, refs;
    for (int k = 0; k < 4; ++k) {
      bufs.push_back(commpact_test::rank_floats(40 + k, r, n, true));
      refs.push_back(bufs.back());
      comm.allreduce(std::span<float>(refs.back()), reduce_op::sum);
    }
    // Rings 0 and 1 in flight; then a blocking ring (2) on even ranks, ring 2 started
    // nonblocking on odd ranks; then ring 3 blocking everywhere; the odd ranks wait for
    // their handles last, in reverse order, the even ranks for theirs first.
    std::vector<mpi_request> hs;
    hs.push_back(comm.iallreduce(std::span<float>(bufs[0]), reduce_op::sum));
    hs.push_back(comm.iallreduce(std::span<float>(bufs[1]), reduce_op::sum));
    if (r % 2 == 0) {
      hs[1].wait();
      hs[0].wait();
      comm.allreduce(std::span<float>(bufs[2]), reduce_op::sum);
      comm.allreduce(std::span<float>(bufs[3]), reduce_op::sum);
    } else {
      hs.push_back(comm.iallreduce(std::span<float>(bufs[2]), reduce_op::sum));
      comm.allreduce(std::span<float>(bufs[3]), reduce_op::sum);
      for (int k = 2; k >= 0; --k) hs[static_cast<std::size_t>(k)].wait();
    }
    for (int k = 0; k < 4; ++k) REQUIRE(bufs[k] == refs[k]);
    (void)P;
  });
  REQUIRE_FALSE(comm.failed());
}
