// CountingComm: totals equal the message sizes for point-to-point traffic, and the
// textbook formulas (brute-force simulated here) for collectives.
#include <catch2/catch.hpp>
#include <commpact/comm/counting_comm.hpp>
#include <commpact/comm/thread_comm.hpp>

#include <mutex>

#include "common/rank_checks.hpp"

using namespace commpact;

namespace {
// Brute-force ring allreduce simulation: who sends which chunk in which step.
std::vector<wire_cost> simulate_ring_allreduce(int P, std::uint64_t n, std::uint64_t esz) {
  std::vector<wire_cost> c(P);
  if (P == 1) return c;
  std::vector<std::uint64_t> chunk(P);
  for (int i = 0; i < P; ++i) chunk[i] = n / P + (std::uint64_t(i) < n % P);
  for (int phase = 0; phase < 2; ++phase)
    for (int s = 0; s < P - 1; ++s)
      for (int r = 0; r < P; ++r) {
        const int ch = ((phase == 0 ? r - s : r + 1 - s) % P + P) % P;
        const int to = (r + 1) % P;
        c[r].bytes_sent += chunk[ch] * esz;
        c[to].bytes_received += chunk[ch] * esz;
        ++c[r].messages_sent;
        ++c[to].messages_received;
      }
  return c;
}
std::vector<wire_cost> simulate_binomial(int P, int root, std::uint64_t bytes) {
  std::vector<wire_cost> c(P);
  std::vector<bool> has(P, false);
  has[root] = true;
  for (int dist = 1; dist < P; dist <<= 1) {
    std::vector<bool> next = has;
    for (int v = 0; v < dist && v < P; ++v) {
      const int from = (v + root) % P;
      if (v + dist < P) {
        const int to = (v + dist + root) % P;
        c[from].bytes_sent += bytes;
        ++c[from].messages_sent;
        c[to].bytes_received += bytes;
        ++c[to].messages_received;
        next[to] = true;
      }
    }
    has = next;
  }
  for (bool h : has) REQUIRE(h);
  return c;
}
}  // namespace

TEST_CASE("wire formulas equal a brute-force simulation", "[comm][counting]") {
  const int P = GENERATE(1, 2, 3, 4, 5, 7, 8, 13);
  const std::uint64_t n = GENERATE(0u, 1u, 5u, 1000u, 1001u);
  auto sim = simulate_ring_allreduce(P, n, 4);
  std::uint64_t total_sent = 0, total_recv = 0;
  for (int r = 0; r < P; ++r) {
    auto f = wire::ring_allreduce(r, P, n, 4);
    REQUIRE(f.bytes_sent == sim[r].bytes_sent);
    REQUIRE(f.bytes_received == sim[r].bytes_received);
    REQUIRE(f.messages_sent == sim[r].messages_sent);
    total_sent += f.bytes_sent;
    total_recv += f.bytes_received;
  }
  REQUIRE(total_sent == total_recv);
  if (P > 1) REQUIRE(total_sent == 2 * (P - 1) * n * 4);  // every chunk crosses 2(P-1) links in all
  for (int root = 0; root < P; ++root) {
    auto b = simulate_binomial(P, root, n);
    for (int r = 0; r < P; ++r) {
      auto f = wire::binomial_broadcast(r, P, root, n);
      REQUIRE(f.bytes_sent == b[r].bytes_sent);
      REQUIRE(f.bytes_received == b[r].bytes_received);
      REQUIRE(f.messages_sent == b[r].messages_sent);
      REQUIRE(f.messages_received == b[r].messages_received);
    }
  }
}

TEST_CASE("CountingComm totals equal the messages passed", "[comm][counting]") {
  const int P = GENERATE(1, 2, 3, 4, 5, 8);
  std::vector<comm_stats> all(P);
  run_threads(P, [&](ThreadComm& tc) {
    CountingComm<ThreadComm> c{tc};
    const int r = c.rank();
    std::vector<float> g(1001, 1.f);
    c.allreduce(std::span<float>(g));
    RANK_REQUIRE(g[0] == float(P));
    std::vector<double> in(7, r), out(7 * P);
    c.allgather(std::span<const double>(in), std::span<double>(out));
    std::vector<std::int32_t> b(33, r);
    c.broadcast(std::span<std::int32_t>(b), P - 1);
    c.barrier();
    std::vector<std::byte> buf;
    std::uint64_t p2p_sent = 0, p2p_recv = 0, msgs = 0;
    for (int bit = 1; bit < P; bit <<= 1) {
      const int peer = r ^ bit;
      if (peer >= P) continue;
      std::vector<std::byte> msg(static_cast<std::size_t>(r * 10 + bit));
      c.sendrecv(peer, msg, buf);
      RANK_REQUIRE(buf.size() == static_cast<std::size_t>(peer * 10 + bit));
      p2p_sent += msg.size();
      p2p_recv += buf.size();
      ++msgs;
    }
    auto s = c.stats();
    wire_cost expect = wire::ring_allreduce(r, P, 1001, 4);
    auto add = [&](wire_cost w) {
      expect.bytes_sent += w.bytes_sent;
      expect.bytes_received += w.bytes_received;
      expect.messages_sent += w.messages_sent;
      expect.messages_received += w.messages_received;
    };
    add(wire::ring_allgather(r, P, 7 * 8));
    add(wire::binomial_broadcast(r, P, P - 1, 33 * 4));
    RANK_REQUIRE(s.collectives == 4);
    RANK_REQUIRE(s.point_to_point_bytes_sent == p2p_sent);
    RANK_REQUIRE(s.bytes_sent == expect.bytes_sent + p2p_sent);
    RANK_REQUIRE(s.bytes_received == expect.bytes_received + p2p_recv);
    RANK_REQUIRE(s.messages_sent == expect.messages_sent + msgs);
    RANK_REQUIRE(s.messages_received == expect.messages_received + msgs);
    all[r] = s;
    c.reset_stats();
    RANK_REQUIRE(c.stats() == comm_stats{});
  });
  // Across ranks, everything sent is received.
  std::uint64_t sent = 0, recv = 0, ms = 0, mr = 0;
  for (auto& s : all) {
    sent += s.bytes_sent;
    recv += s.bytes_received;
    ms += s.messages_sent;
    mr += s.messages_received;
  }
  REQUIRE(sent == recv);
  REQUIRE(ms == mr);
}

TEST_CASE("CountingComm copies share one counter", "[comm][counting]") {
  run_threads(2, [](ThreadComm& tc) {
    CountingComm<ThreadComm> kept{tc};
    auto given = kept;  // e.g. handed to a compressor
    std::vector<float> g(10, 1.f);
    given.allreduce(std::span<float>(g));
    RANK_REQUIRE(kept.stats().collectives == 1);
    RANK_REQUIRE(kept.stats().bytes_sent == wire::ring_allreduce(tc.rank(), 2, 10, 4).bytes_sent);
  });
}
