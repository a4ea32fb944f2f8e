// MpiComm's shared-memory path (comm/mpi/shared_memory.hpp): checked allreduces and
// allgathers copy into a segment of the rank's own and read the peers'.
// Checked against brute-force references computed locally: an allreduce equals, bit for
// bit, the fold of every rank's data in ascending rank order (the order the path folds
// in) for every element type and operation, with chunks of unequal length; an allgather
// equals the concatenation. Also: the segments grow across sizes and their halves are
// reused by many back-to-back collectives of different contents (a half overwritten
// while a peer still reads it shows as a wrong result), blocking and nonblocking forms
// mixed across ranks, a mismatch or a bad argument on one rank raising alike with the
// caller's memory untouched and the communicator usable, a peer's failure raising
// peer_failure with `data` untouched, the point-to-point path where shared_memory_max
// excludes a size, ranks with different shared_memory_max (different paths) failing
// the signature check alike, and no segment name left in /dev/shm.
// commpact-mpi-ranks: 2 3 4
// commpact-lock: dev-shm
#include <commpact/comm/mpi_comm.hpp>

#include <catch2/catch.hpp>

#include <dirent.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "common/collective_checks.hpp"

using namespace commpact;
using namespace std::chrono_literals;

namespace {

// Rank q's data for seed s: values every rank can compute for every other rank.
template <class T>
std::vector<T> data_of(std::uint64_t s, int q, std::size_t n) {
  std::uint64_t x = s * 0x9e3779b97f4a7c15ull + static_cast<std::uint64_t>(q) * 0xbf58476d1ce4e5b9ull + n;
  std::vector<T> v(n);
  for (auto& y : v) {  // splitmix64
    std::uint64_t z = (x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    // reals in [-1, 1) with full mantissas (sums round); integers over their whole range (sums wrap)
    if constexpr (std::is_floating_point_v<T>) y = static_cast<T>(static_cast<double>(z >> 11) * 0x1p-52 - 1.0);
    else y = static_cast<T>(z);
  }
  return v;
}

// The brute-force reference: op folded over ranks 0, 1, ..., P-1 in that order, with the
// scalar definition of each op (combine.hpp).
template <class T>
std::vector<T> folded(std::uint64_t s, int P, std::size_t n, reduce_op op) {
  auto acc = data_of<T>(s, 0, n);
  for (int q = 1; q < P; ++q) {
    const auto b = data_of<T>(s, q, n);
    for (std::size_t i = 0; i < n; ++i) {
      if (op == reduce_op::sum) {
        if constexpr (std::is_integral_v<T>) {
          using U = std::make_unsigned_t<T>;
          acc[i] = static_cast<T>(static_cast<U>(acc[i]) + static_cast<U>(b[i]));
        } else {
          acc[i] = acc[i] + b[i];
        }
      } else if (op == reduce_op::min) {
        acc[i] = b[i] < acc[i] ? b[i] : acc[i];
      } else {
        acc[i] = acc[i] < b[i] ? b[i] : acc[i];
      }
    }
  }
  return acc;
}

using commpact_test::block_of;

// Names under /dev/shm that this library creates (it unlinks each once every rank mapped it).
int commpact_names_in_dev_shm() {
  int found = 0;
  if (DIR* d = ::opendir("/dev/shm")) {
    while (const dirent* e = ::readdir(d))
      if (std::strncmp(e->d_name, "commpact-", 9) == 0) ++found;
    ::closedir(d);
  }
  return found;
}

constexpr std::size_t KiB = 1024;

}  // namespace

TEMPLATE_TEST_CASE("MpiComm: an allreduce through shared memory equals the ascending-rank fold, bit for bit",
                   "[comm][mpi][shm]", float, double, std::int32_t, std::int64_t, std::uint32_t, std::uint64_t) {
  MpiComm comm{MPI_COMM_WORLD, {.timeout = 30s}};
  const int P = comm.size(), r = comm.rank();
  // One element (chunks of 0 elements on all ranks but the last), a few, 64 KiB + 1
  // element, chunks of unequal length (n not a multiple of P), and more than the first
  // segment's 1 MiB (the segments grow).
  const std::size_t e = sizeof(TestType);
  const std::size_t sizes[] = {1, 5, 64 * KiB / e + 1, 100003, (1u << 20) / e + 7};
  mpi_guard(comm, [&] {
    std::uint64_t seed = 1;
    for (const std::size_t n : sizes)
      for (const auto op : {reduce_op::sum, reduce_op::min, reduce_op::max}) {
        auto d = data_of<TestType>(seed, r, n);
        if (seed % 2 == static_cast<std::uint64_t>(r % 2)) comm.iallreduce(std::span<TestType>(d), op).wait();
        else comm.allreduce(std::span<TestType>(d), op);
        REQUIRE(d == folded<TestType>(seed, P, n, op));
        ++seed;
      }
  });
  if (P > 1) REQUIRE(comm.shared_memory_bytes() >= (1u << 20) + 7 * e);
  REQUIRE(comm.shared_memory_note().empty());
  REQUIRE_FALSE(comm.failed());
}

TEST_CASE("MpiComm: an allgather through shared memory equals the concatenation", "[comm][mpi][shm]") {
  MpiComm comm{MPI_COMM_WORLD, {.timeout = 30s}};
  const int P = comm.size(), r = comm.rank();
  const auto Pu = static_cast<std::size_t>(P);
  // An output just above 64 KiB; blocks on both sides of the size that travels inside the
  // signature message on point to point; one byte; more than the first segment holds.
  constexpr std::size_t in_sig = detail::mpi_inline_gather_block_max;
  const std::size_t sizes[] = {64 * KiB / Pu + 1, in_sig, in_sig + 1, 1, 200001, (1u << 20) + 3, (3u << 20) + 1};
  mpi_guard(comm, [&] {
    std::uint64_t seed = 100;
    for (const std::size_t n : sizes)
      for (int form = 0; form < 3; ++form, ++seed) {
        const auto in = block_of(seed, r, n);
        std::vector<std::byte> out(n * Pu, std::byte{0x5a});
        const bool nb = form == 2 || (form == 1 && r % 2 == 1);
        if (nb) comm.iallgather(std::span<const std::byte>(in), std::span<std::byte>(out)).wait();
        else comm.allgather(std::span<const std::byte>(in), std::span<std::byte>(out));
        REQUIRE(out == commpact_test::gathered_blocks(seed, P, n));
      }
  });
  if (P > 1) REQUIRE(comm.shared_memory_bytes() >= (3u << 20) + 1);
  REQUIRE_FALSE(comm.failed());
}

// The two halves of a segment alternate: a collective overwrites the half its peers
// read two collectives ago. Many back-to-back collectives of different contents, each
// rank starting the next as soon as it has copied its result out (more ranks than cores
// preempt each other mid-copy), find a half overwritten while a peer still reads it:
// with a single half this fails at 4 ranks on 2 cores (not at 2: nobody is preempted).
TEST_CASE("MpiComm: back-to-back shared-memory collectives never read a half being rewritten", "[comm][mpi][shm]") {
  MpiComm comm{MPI_COMM_WORLD, {.timeout = 30s}};
  const int P = comm.size(), r = comm.rank();
  const std::size_t n = 262144;  // 1 MiB of floats; 1 MiB blocks
  std::vector<std::vector<float>> want(3);
  std::vector<std::vector<float>> mine(3);
  for (std::uint64_t k = 0; k < 3; ++k) {
    want[k] = folded<float>(500 + k, P, n, reduce_op::sum);
    mine[k] = data_of<float>(500 + k, r, n);
  }
  const auto in = block_of(600, r, 4 * n);
  const auto all = commpact_test::gathered_blocks(600, P, 4 * n);
  std::vector<std::byte> out(4 * n * static_cast<std::size_t>(P));
  int wrong = 0;
  mpi_guard(comm, [&] {
    for (std::uint64_t it = 0; it < 90; ++it) {
      if (it % 4 == 3) {
        comm.allgather(std::span<const std::byte>(in), std::span<std::byte>(out));
        wrong += out != all;
      } else {
        auto d = mine[it % 3];
        comm.allreduce(std::span<float>(d), reduce_op::sum);
        wrong += d != want[it % 3];
      }
    }
  });
  REQUIRE(wrong == 0);
  REQUIRE_FALSE(comm.failed());
}

TEST_CASE("MpiComm: a shared-memory collective that one rank gets wrong raises alike and touches nothing",
          "[comm][mpi][shm]") {
  MpiComm comm{MPI_COMM_WORLD, {.timeout = 30s}};
  const int P = comm.size(), r = comm.rank();
  if (P < 2) return;
  const std::size_t n = 100000;
  // Warm: the segments exist, so the next call stages before its check.
  auto w = data_of<float>(1, r, n);
  comm.allreduce(std::span<float>(w), reduce_op::sum);
  SECTION("an allreduce of another length on rank 0") {
    auto d = data_of<float>(2, r, r == 0 ? n + 1 : n);
    const auto before = d;
    REQUIRE_THROWS_AS(comm.allreduce(std::span<float>(d), reduce_op::sum), mismatch_error);
    REQUIRE(d == before);
  }
  SECTION("another op on the last rank") {
    auto d = data_of<float>(3, r, n);
    const auto before = d;
    REQUIRE_THROWS_AS(comm.allreduce(std::span<float>(d), r == P - 1 ? reduce_op::max : reduce_op::sum),
                      mismatch_error);
    REQUIRE(d == before);
  }
  SECTION("an allgather output of the wrong size on rank 0") {
    const auto in = block_of(4, r, n);
    std::vector<std::byte> out(n * static_cast<std::size_t>(P) + (r == 0 ? 1 : 0), std::byte{0x11});
    const auto before = out;
    REQUIRE_THROWS_AS(comm.allgather(std::span<const std::byte>(in), std::span<std::byte>(out)), invalid_argument);
    REQUIRE(out == before);
  }
  SECTION("an allgather whose block is larger than the segments on rank 0 only") {
    const std::size_t m = r == 0 ? 2 * comm.shared_memory_bytes() + 1 : n;
    const auto in = block_of(5, r, m);
    std::vector<std::byte> out(m * static_cast<std::size_t>(P), std::byte{0x22});
    const auto before = out;
    REQUIRE_THROWS_AS(comm.allgather(std::span<const std::byte>(in), std::span<std::byte>(out)), mismatch_error);
    REQUIRE(out == before);
  }
  REQUIRE_FALSE(comm.failed());
  // The halves did not move on: the next collectives are exact.
  for (std::uint64_t s = 10; s < 14; ++s) {
    auto d = data_of<float>(s, r, n);
    comm.allreduce(std::span<float>(d), reduce_op::sum);
    REQUIRE(d == folded<float>(s, P, n, reduce_op::sum));
    const auto in = block_of(s, r, n);
    std::vector<std::byte> out(n * static_cast<std::size_t>(P));
    comm.allgather(std::span<const std::byte>(in), std::span<std::byte>(out));
    REQUIRE(out == commpact_test::gathered_blocks(s, P, n));
  }
}

TEST_CASE("MpiComm: a peer that fails before a shared-memory allreduce leaves data untouched", "[comm][mpi][shm]") {
  MpiComm comm{MPI_COMM_WORLD, {.timeout = 30s}};
  const int P = comm.size(), r = comm.rank();
  if (P < 2) return;
  const std::size_t n = 100000;
  auto w = data_of<float>(1, r, n);
  comm.allreduce(std::span<float>(w), reduce_op::sum);  // the segments exist
  auto d = data_of<float>(2, r, n);
  const auto before = d;
  if (r == P - 1) {
    comm.abort("test: failure before a shared-memory allreduce");
  } else {
    bool raised = false;
    try {
      comm.allreduce(std::span<float>(d), reduce_op::sum);
    } catch (const peer_failure&) {
      raised = true;
    } catch (const std::exception& e) {
      FAIL_CHECK("expected peer_failure, got: " << e.what());
    }
    CHECK(raised);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  CHECK(d == before);
  CHECK(comm.failed());
}

TEST_CASE("MpiComm: sizes above shared_memory_max take point to point, exactly", "[comm][mpi][shm]") {
  const std::size_t most = GENERATE(std::size_t{0}, std::size_t{128 * 1024});
  MpiComm comm{MPI_COMM_WORLD, {.timeout = 30s, .shared_memory_max = most}};
  const int P = comm.size(), r = comm.rank();
  const std::size_t n = 100000;  // 400 KB of floats: above 128 KiB
  mpi_guard(comm, [&] {
    auto d = data_of<std::int32_t>(7, r, n);
    comm.allreduce(std::span<std::int32_t>(d), reduce_op::sum);
    REQUIRE(d == folded<std::int32_t>(7, P, n, reduce_op::sum));
    const auto in = block_of(8, r, 4 * n);
    std::vector<std::byte> out(4 * n * static_cast<std::size_t>(P));
    comm.allgather(std::span<const std::byte>(in), std::span<std::byte>(out));
    REQUIRE(out == commpact_test::gathered_blocks(8, P, 4 * n));
  });
  REQUIRE(comm.shared_memory_bytes() == 0);
}

TEST_CASE("MpiComm: ranks whose shared_memory_max sends them down different paths raise mismatch_error alike, at "
          "once",
          "[comm][mpi][shm]") {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  // Rank 0 takes point to point for 400 KB, the others shared memory: the path is part of
  // the signature, so the check fails on every rank instead of each waiting on its path.
  MpiComm comm{MPI_COMM_WORLD, {.timeout = 20s, .shared_memory_max = r == 0 ? std::size_t{1024} : std::size_t{64} << 20}};
  const int P = comm.size();
  if (P < 2) return;
  const std::size_t n = 100000;
  const auto t0 = std::chrono::steady_clock::now();
  auto d = data_of<float>(11, r, n);
  const auto before = d;
  std::string what;
  try {
    comm.allreduce(std::span<float>(d), reduce_op::sum);
  } catch (const mismatch_error& e) {
    what = e.what();
  }
  const auto in = block_of(12, r, 4 * n);
  std::vector<std::byte> out(4 * n * static_cast<std::size_t>(P), std::byte{0x33});
  const auto out_before = out;
  std::string what_gather;
  try {
    comm.allgather(std::span<const std::byte>(in), std::span<std::byte>(out));
  } catch (const mismatch_error& e) {
    what_gather = e.what();
  }
  const auto took = std::chrono::steady_clock::now() - t0;
  CAPTURE(r, what, what_gather);
  CHECK(what.find("shared_memory_max") != std::string::npos);
  CHECK(what_gather.find("shared_memory_max") != std::string::npos);
  CHECK(d == before);
  CHECK(out == out_before);
  CHECK(took < 10s);  // the check decided, not the 20 s deadline
  CHECK_FALSE(comm.failed());
}

TEST_CASE("MpiComm: unchecked collectives do not take the shared-memory path", "[comm][mpi][shm]") {
  MpiComm comm{MPI_COMM_WORLD, {.timeout = 30s, .verify_collectives = false}};
  const int P = comm.size(), r = comm.rank();
  const std::size_t n = 100000;
  mpi_guard(comm, [&] {
    auto d = data_of<std::int64_t>(9, r, n);
    comm.allreduce(std::span<std::int64_t>(d), reduce_op::sum);
    REQUIRE(d == folded<std::int64_t>(9, P, n, reduce_op::sum));
  });
  REQUIRE(comm.shared_memory_bytes() == 0);
}

TEST_CASE("MpiComm: no shared-memory name outlives the setup", "[comm][mpi][shm]") {
  {
    MpiComm comm{MPI_COMM_WORLD, {.timeout = 30s}};
    const int r = comm.rank();
    for (const std::size_t n : {std::size_t{100000}, std::size_t{1u << 20}}) {  // a setup, then a growth
      auto d = data_of<float>(n, r, n);
      comm.allreduce(std::span<float>(d), reduce_op::sum);
      MPI_Barrier(MPI_COMM_WORLD);
      CHECK(commpact_names_in_dev_shm() == 0);
      MPI_Barrier(MPI_COMM_WORLD);
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  CHECK(commpact_names_in_dev_shm() == 0);
}
