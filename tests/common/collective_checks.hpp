#pragma once
// Checks of the Communicator operations written once over any communicator, so the
// same assertions run on ThreadComm (tests/test_comm_thread.cpp) and MpiComm
// (tests/mpi/test_comm_mpi.cpp), and under CheckedComm (tests/test_comm_checked.cpp,
// tests/mpi/test_comm_mpi_checked.cpp). Communicators with nonblocking forms
// (AsyncCommunicator) also get check_nonblocking_collectives. Every rank derives the other ranks' inputs from a
// shared seed and computes the serial reference itself.
#include <catch2/catch.hpp>
#include <commpact/concepts.hpp>

#include "rank_checks.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <span>
#include <vector>

namespace commpact_test {

// Deterministic per-(seed, rank) random input.
inline std::vector<float> rank_floats(std::uint64_t seed, int rank, std::size_t n, bool integral = false) {
  std::mt19937_64 gen(seed * 1000003u + static_cast<std::uint64_t>(rank));
  std::vector<float> v(n);
  std::uniform_real_distribution<float> real(-1.f, 1.f);
  std::uniform_int_distribution<int> small(-1000, 1000);
  for (auto& x : v) x = integral ? static_cast<float>(small(gen)) : real(gen);
  return v;
}

inline std::vector<std::byte> rank_bytes(std::uint64_t seed, int from, int to, std::size_t n) {
  std::mt19937_64 gen(seed ^ (static_cast<std::uint64_t>(from) << 20) ^ static_cast<std::uint64_t>(to) * 7919u);
  std::vector<std::byte> v(n);
  for (auto& b : v) b = static_cast<std::byte>(gen() & 0xff);
  return v;
}

// Rank q's allgather block for seed s: bytes every rank can compute for every other rank.
inline std::vector<std::byte> block_of(std::uint64_t s, int q, std::size_t n) {
  std::vector<std::byte> b(n);
  std::uint64_t x = s * 0x9e3779b97f4a7c15ull + static_cast<std::uint64_t>(q) * 0xbf58476d1ce4e5b9ull + n;
  for (auto& v : b) {
    x ^= x >> 31;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 29;
    v = static_cast<std::byte>(x >> 56);
  }
  return b;
}
// The brute-force allgather of block_of(s, q, n) over ranks q = 0 .. P-1.
inline std::vector<std::byte> gathered_blocks(std::uint64_t s, int P, std::size_t n) {
  std::vector<std::byte> all;
  for (int q = 0; q < P; ++q) {
    const auto b = block_of(s, q, n);
    all.insert(all.end(), b.begin(), b.end());
  }
  return all;
}

// Every rank checks that all ranks hold the same bytes (through allgather).
template <class Comm, class T>
void require_identical_on_all_ranks(Comm& comm, std::span<const T> data) {
  std::uint64_t h = 1469598103934665603ull;
  const auto* p = reinterpret_cast<const unsigned char*>(data.data());
  for (std::size_t i = 0; i < data.size_bytes(); ++i) h = (h ^ p[i]) * 1099511628211ull;
  std::vector<std::uint64_t> all(comm.size());
  comm.allgather(std::span<const std::uint64_t>(&h, 1), std::span<std::uint64_t>(all));
  for (int r = 0; r < comm.size(); ++r) RANK_REQUIRE(all[r] == h);
}

template <class Comm>
void check_allreduce(Comm& comm, std::uint64_t seed, std::size_t n, bool rank_order_bitwise) {
  const int P = comm.size();
  // Integral values: any summation order is exact, so the result must equal the reference.
  {
    auto mine = rank_floats(seed, comm.rank(), n, true);
    std::vector<float> ref(n, 0.f);
    for (int r = 0; r < P; ++r) {
      auto v = rank_floats(seed, r, n, true);
      for (std::size_t i = 0; i < n; ++i) ref[i] += v[i];
    }
    comm.allreduce(std::span<float>(mine), commpact::reduce_op::sum);
    RANK_REQUIRE(mine == ref);
  }
  // Real values: identical on every rank; rank-order sum bit for bit where promised.
  {
    auto mine = rank_floats(seed + 1, comm.rank(), n);
    std::vector<float> ref = rank_floats(seed + 1, 0, n);
    for (int r = 1; r < P; ++r) {
      auto v = rank_floats(seed + 1, r, n);
      for (std::size_t i = 0; i < n; ++i) ref[i] += v[i];
    }
    comm.allreduce(std::span<float>(mine), commpact::reduce_op::sum);
    require_identical_on_all_ranks(comm, std::span<const float>(mine));
    if (rank_order_bitwise) {
      RANK_REQUIRE((n == 0 || std::memcmp(mine.data(), ref.data(), n * sizeof(float)) == 0));
    } else {
      for (std::size_t i = 0; i < n; ++i) RANK_REQUIRE(mine[i] == Approx(ref[i]).margin(1e-5));
    }
  }
  // min / max on doubles and int64.
  {
    std::vector<double> mn(n), mx(n);
    std::vector<std::int64_t> imx(n);
    for (std::size_t i = 0; i < n; ++i) {
      mn[i] = mx[i] = std::sin(double(i) * 0.37 + comm.rank());
      imx[i] = static_cast<std::int64_t>((i * 31 + comm.rank() * 17) % 101) - 50;
    }
    comm.allreduce(std::span<double>(mn), commpact::reduce_op::min);
    comm.allreduce(std::span<double>(mx), commpact::reduce_op::max);
    comm.allreduce(std::span<std::int64_t>(imx), commpact::reduce_op::max);
    for (std::size_t i = 0; i < n; ++i) {
      double lo = 1e300, hi = -1e300;
      std::int64_t ihi = INT64_MIN;
      for (int r = 0; r < P; ++r) {
        lo = std::min(lo, std::sin(double(i) * 0.37 + r));
        hi = std::max(hi, std::sin(double(i) * 0.37 + r));
        ihi = std::max<std::int64_t>(ihi, static_cast<std::int64_t>((i * 31 + r * 17) % 101) - 50);
      }
      RANK_REQUIRE(mn[i] == lo);
      RANK_REQUIRE(mx[i] == hi);
      RANK_REQUIRE(imx[i] == ihi);
    }
  }
}

template <class Comm>
void check_allgather(Comm& comm, std::uint64_t seed, std::size_t block) {
  const int P = comm.size();
  auto mine = rank_floats(seed, comm.rank(), block);
  std::vector<float> out(block * P, -7.f);
  comm.allgather(std::span<const float>(mine), std::span<float>(out));
  for (int r = 0; r < P; ++r) {
    auto v = rank_floats(seed, r, block);
    RANK_REQUIRE(std::equal(v.begin(), v.end(), out.begin() + r * block));
  }
}

template <class Comm>
void check_broadcast(Comm& comm, std::uint64_t seed, std::size_t n) {
  for (int root = 0; root < comm.size(); ++root) {
    auto data = rank_floats(seed + root, comm.rank(), n);
    comm.broadcast(std::span<float>(data), root);
    RANK_REQUIRE(data == rank_floats(seed + root, root, n));
  }
}

// Pairwise exchange with variable lengths (including empty messages), then a ring of
// one-way sends followed by receives.
template <class Comm>
void check_point_to_point(Comm& comm, std::uint64_t seed) {
  const int P = comm.size(), r = comm.rank();
  std::vector<std::byte> buf;
  for (int bit = 1; bit < P; bit <<= 1) {
    const int peer = r ^ bit;
    if (peer >= P) continue;
    const auto len_to = [&](int a, int b) { return static_cast<std::size_t>((a * 37 + b * 11 + bit) % 97); };
    auto msg = rank_bytes(seed, r, peer, len_to(r, peer));
    comm.sendrecv(peer, std::span<const std::byte>(msg), buf);
    RANK_REQUIRE(buf == rank_bytes(seed, peer, r, len_to(peer, r)));
  }
  if (P > 1) {
    const int next = (r + 1) % P, prev = (r + P - 1) % P;
    for (int round = 0; round < 3; ++round) {  // several messages queued in order
      auto msg = rank_bytes(seed + round, r, next, 1000 + 10 * r + round);
      comm.send(next, std::span<const std::byte>(msg));
    }
    for (int round = 0; round < 3; ++round) {
      comm.recv(prev, buf);
      RANK_REQUIRE(buf == rank_bytes(seed + round, prev, r, 1000 + 10 * prev + round));
    }
  }
  comm.barrier();
}

// Nonblocking collectives (AsyncCommunicator): several in flight, completed out of
// order and partly through test(), give exactly what the blocking forms give.
template <class Comm>
void check_nonblocking_collectives(Comm& comm, std::uint64_t seed, std::size_t n) {
  const int P = comm.size(), r = comm.rank();
  auto a = rank_floats(seed, r, n, true), b = rank_floats(seed + 1, r, n);
  auto ra = a, rb = b;
  comm.allreduce(std::span<float>(ra), commpact::reduce_op::sum);
  comm.allreduce(std::span<float>(rb), commpact::reduce_op::max);
  auto blk = rank_floats(seed + 2, r, n);
  std::vector<float> all(n * P, -7.f), ref_all(n * P);
  comm.allgather(std::span<const float>(blk), std::span<float>(ref_all));
  auto bc = rank_floats(seed + 3, r, n), ref_bc = bc;
  comm.broadcast(std::span<float>(ref_bc), P - 1);

  auto h1 = comm.iallreduce(std::span<float>(a), commpact::reduce_op::sum);
  auto h2 = comm.iallreduce(std::span<float>(b), commpact::reduce_op::max);
  auto h3 = comm.iallgather(std::span<const float>(blk), std::span<float>(all));
  auto h4 = comm.ibroadcast(std::span<float>(bc), P - 1);
  h3.wait();
  while (!h2.test()) {
  }
  h4.wait();
  h1.wait();
  RANK_REQUIRE(a == ra);
  RANK_REQUIRE(b == rb);
  RANK_REQUIRE(all == ref_all);
  RANK_REQUIRE(bc == ref_bc);
}

template <class Comm>
void check_all_collectives(Comm& comm, std::uint64_t seed, bool rank_order_bitwise) {
  if constexpr (commpact::AsyncCommunicator<Comm>) {
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{1000}, std::size_t{70000}})
      check_nonblocking_collectives(comm, seed + 2 * n, n);
  }
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{65537}}) {
    check_allreduce(comm, seed + n, n, rank_order_bitwise);
    check_allgather(comm, seed + n, n);
    check_broadcast(comm, seed + n, n);
  }
  check_point_to_point(comm, seed);
  comm.barrier();
}

}  // namespace commpact_test
