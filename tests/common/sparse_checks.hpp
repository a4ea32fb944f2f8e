#pragma once

#include "bits.hpp"
// Checks of TopK and gTopK written once over any communicator, run from ThreadComm tests
// (tests/test_compress_gtopk.cpp, tests/test_compress_topk.cpp) and MPI tests
// (tests/mpi/test_compress_gtopk_mpi.cpp).
//
// Every rank derives every rank's gradients from a shared seed and simulates all P ranks
// serially with a brute-force reference (plain sorting and std::map; no code shared with
// the kernels beyond the data types), then compares its own results bit for bit.
//
// Failures are not reported with Catch2 macros inside ranks (Catch2 is not thread-safe,
// and a rank that stops early would leave the others waiting). A `verdict` collects a
// rank's failures; `settle` makes every rank learn, through one allreduce, whether any
// rank failed, and then every rank throws check_failed together. The caller wraps the
// whole check in REQUIRE_NOTHROW (MPI) or run_threads inside REQUIRE_NOTHROW (threads).
#include <catch2/catch.hpp>
#include <commpact/comm/counting_comm.hpp>
#include <commpact/comm/tree_comm.hpp>
#include <commpact/compress/compressors/gtopk.hpp>
#include <commpact/compress/compressors/topk.hpp>

#include <algorithm>
#include <bit>
#include <iterator>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace commpact_test {

struct check_failed : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct verdict {
  int failures = 0;
  std::string first;
  template <class... A>
  void expect(bool ok, A&&... what) {
    if (ok) return;
    if (failures++ == 0) {
      std::ostringstream os;
      (os << ... << what);
      first = os.str();
    }
  }
};

//! Every rank learns whether any rank failed; then all throw together (or none does).
template <class Comm>
void settle(Comm& comm, verdict& v, const char* where) {
  std::int64_t f[2] = {v.failures, v.failures ? comm.rank() : -1};
  comm.allreduce(std::span<std::int64_t>(f, 2), commpact::reduce_op::max);
  if (f[0] > 0) {
    std::ostringstream os;
    os << where << ": rank " << comm.rank() << ": ";
    if (v.failures) os << v.failures << " failed checks, first: " << v.first;
    else os << "rank " << f[1] << " failed a check";
    throw check_failed(os.str());
  }
}

// ---- TreeComm ------------------------------------------------------------------------

//! A reducer whose payload is the sorted list of ranks seen so far (variable length,
//! 4 bytes per rank): after TreeComm::reduce every rank must have seen every rank.
struct union_reducer {
  std::vector<std::int32_t> seen;
  std::vector<std::byte> out;
  int absorbed = 0;
  std::span<const std::byte> payload(const commpact::tree_step&) {
    out.resize(seen.size() * 4);
    if (!seen.empty()) std::memcpy(out.data(), seen.data(), out.size());
    return out;
  }
  void absorb(const commpact::tree_step& s, std::span<const std::byte> m) {
    std::vector<std::int32_t> in(m.size() / 4);
    if (!in.empty()) std::memcpy(in.data(), m.data(), in.size() * 4);
    ++absorbed;
    if (s.stage == commpact::tree_stage::unfold_recv) {
      seen = in;
      return;
    }
    std::vector<std::int32_t> u;
    std::set_union(seen.begin(), seen.end(), in.begin(), in.end(), std::back_inserter(u));
    seen = u;
  }
};

//! TreeComm over any PointToPoint communicator: the schedule is symmetric, every rank
//! ends with all ranks' data, and no rank sends more than ceil(log2 P) messages.
template <class Comm>
void check_tree_union(Comm& comm) {
  verdict v;
  commpact::TreeComm<commpact::CountingComm<Comm>> tree{commpact::CountingComm<Comm>(comm)};
  const int P = comm.size(), me = comm.rank();
  union_reducer r;
  r.seen = {me};
  std::vector<std::byte> buf;
  tree.reduce(r, buf);
  std::vector<std::int32_t> all(P);
  for (int i = 0; i < P; ++i) all[i] = i;
  v.expect(r.seen == all, "rank ", me, " saw ", r.seen.size(), " of ", P, " ranks");
  const auto st = tree.inner().stats();
  int ceil_log2 = 0;
  while ((1 << ceil_log2) < P) ++ceil_log2;
  v.expect(st.messages_sent == tree.messages_per_reduce() && st.messages_sent <= static_cast<std::uint64_t>(ceil_log2),
           "rank ", me, " sent ", st.messages_sent, " messages, ceil(log2 P) = ", ceil_log2);
  v.expect(st.collectives == 0, "TreeComm::reduce used collectives");
  // Symmetry: my partner in round j has me as its partner in round j.
  const auto& cube = tree.schedule();
  for (const auto& s : tree.steps())
    if (s.stage == commpact::tree_stage::exchange) v.expect(cube.partner(s.peer, s.round) == me, "asymmetric round");
  settle(comm, v, "check_tree_union");
}

// ---- inputs -------------------------------------------------------------------------

//! Gradient of `rank` at `step`. kind 0: uniform(-1, 1); kind 1: small integers (many
//! ties in |value|, so tie-breaking by index matters); kind 2: heavy-tailed.
inline std::vector<float> grad_of(std::uint64_t seed, int step, int rank, std::size_t n, int kind = 0) {
  std::mt19937_64 gen(seed * 1000003u + static_cast<std::uint64_t>(step) * 7919u + static_cast<std::uint64_t>(rank));
  std::vector<float> v(n);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::uniform_int_distribution<int> small(-4, 4);
  std::cauchy_distribution<float> heavy(0.f, 0.01f);
  for (auto& x : v) {
    if (kind == 1) x = static_cast<float>(small(gen));
    else if (kind == 2) x = std::clamp(heavy(gen), -1e3f, 1e3f);
    else x = u(gen);
  }
  return v;
}

// ---- the brute-force reference --------------------------------------------------------

struct ref_set {
  std::vector<std::int32_t> idx;
  std::vector<float> val;
  bool operator==(const ref_set&) const = default;
};

//! The k entries of largest |v| (ties: smaller index), sorted by index, by full sorting.
inline ref_set ref_select(std::vector<std::pair<std::int32_t, float>> e, std::size_t k) {
  std::sort(e.begin(), e.end(), [](const auto& a, const auto& b) {
    const float x = std::fabs(a.second), y = std::fabs(b.second);
    if (x != y) return x > y;
    return a.first < b.first;
  });
  if (e.size() > k) e.resize(k);
  std::sort(e.begin(), e.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  ref_set s;
  for (const auto& [i, v] : e) {
    s.idx.push_back(i);
    s.val.push_back(v);
  }
  return s;
}

inline ref_set ref_topk(const std::vector<float>& acc, std::size_t k) {
  std::vector<std::pair<std::int32_t, float>> e;
  for (std::size_t i = 0; i < acc.size(); ++i) e.emplace_back(static_cast<std::int32_t>(i), acc[i]);
  return ref_select(std::move(e), k);
}

//! merge(a, b): union, a + b at equal indices (a is the lower rank's set), top k.
inline ref_set ref_merge(const ref_set& a, const ref_set& b, std::size_t k) {
  std::map<std::int32_t, float> m;
  for (std::size_t j = 0; j < a.idx.size(); ++j) m[a.idx[j]] = a.val[j];
  for (std::size_t j = 0; j < b.idx.size(); ++j) {
    auto it = m.find(b.idx[j]);
    if (it != m.end()) it->second = it->second + b.val[j];
    else m[b.idx[j]] = b.val[j];
  }
  return ref_select({m.begin(), m.end()}, k);
}

inline bool contains(const ref_set& s, std::int32_t i) { return std::binary_search(s.idx.begin(), s.idx.end(), i); }

constexpr std::uint64_t wire_header = 48;  // the sparse wire header, fixed by the format

//! The whole gTopKAllReduce of one step, simulated serially over all P ranks.
struct ref_gtopk_step {
  std::vector<ref_set> local;                    // S_p
  std::vector<std::vector<std::uint8_t>> alive;  // per rank, per entry of S_p: its value is inside G
  ref_set G;
  std::vector<std::uint64_t> bytes_sent, messages_sent;  // per rank, from the counts exchanged
  std::size_t reentered = 0;  // entries whose index is in G although their value was dropped

  ref_gtopk_step(const std::vector<std::vector<float>>& acc, std::size_t k) {
    const int P = static_cast<int>(acc.size());
    const int p2 = static_cast<int>(std::bit_floor(static_cast<unsigned>(P)));
    local.resize(P);
    alive.resize(P);
    bytes_sent.assign(P, 0);
    messages_sent.assign(P, 0);
    std::vector<ref_set> cur(P);
    std::vector<int> holder(P);
    for (int r = 0; r < P; ++r) {
      local[r] = ref_topk(acc[r], k);
      cur[r] = local[r];
      alive[r].assign(local[r].idx.size(), 1);
      holder[r] = r < p2 ? r : r - p2;
    }
    // Every tree message is a fixed-capacity frame of k entries (fewer entries leave zero
    // padding), plus ceil(k / 8) mask bytes on an unfold: exact, whatever the counts.
    auto sent = [&](int r, std::size_t /*count*/, std::size_t mask_bits) {
      bytes_sent[r] += wire_header + 8 * k + (mask_bits ? (k + 7) / 8 : 0);
      messages_sent[r] += 1;
    };
    auto update_alive = [&]() {
      for (int p = 0; p < P; ++p)
        for (std::size_t e = 0; e < local[p].idx.size(); ++e)
          if (!contains(cur[holder[p]], local[p].idx[e])) alive[p][e] = 0;
    };
    for (int r = p2; r < P; ++r) {  // fold
      sent(r, cur[r].idx.size(), 0);
      cur[r - p2] = ref_merge(cur[r - p2], cur[r], k);
    }
    update_alive();
    for (int bit = 1; bit < p2; bit <<= 1) {  // rounds
      std::vector<ref_set> next(P);
      for (int r = 0; r < p2; ++r) {
        const int q = r ^ bit;
        sent(r, cur[r].idx.size(), 0);
        next[r] = ref_merge(cur[std::min(r, q)], cur[std::max(r, q)], k);
      }
      for (int r = 0; r < p2; ++r) cur[r] = next[r];
      update_alive();
    }
    for (int r = p2; r < P; ++r) sent(r - p2, cur[r - p2].idx.size(), local[r].idx.size());  // unfold
    G = cur[0];
    for (int r = 0; r < p2; ++r)
      if (!(cur[r] == G)) throw std::logic_error("reference: core ranks ended with different sets");
    for (int p = 0; p < P; ++p)
      for (std::size_t e = 0; e < local[p].idx.size(); ++e)
        if (!alive[p][e] && contains(G, local[p].idx[e])) ++reentered;
  }

  std::vector<float> result(std::size_t n, int P) const {
    std::vector<float> r(n, 0.0f);
    for (std::size_t j = 0; j < G.idx.size(); ++j) r[G.idx[j]] = G.val[j] / static_cast<float>(P);
    return r;
  }
  std::vector<float> residual(const std::vector<float>& acc, int p) const {
    auto r = acc;
    for (std::size_t e = 0; e < local[p].idx.size(); ++e)
      if (alive[p][e]) r[local[p].idx[e]] = 0.0f;
    return r;
  }
};

inline std::size_t nnz(std::span<const float> v) {
  return static_cast<std::size_t>(std::count_if(v.begin(), v.end(), [](float x) { return x != 0.0f; }));
}

// ---- conservation ------------------------------------------------------------------

//! Nothing lost: for every index i,
//!   sum_r residual_new[r][i] + P * result[i]  ==  sum_r (g[r][i] + residual_old[r][i])
//! up to float rounding. Tolerance argument: each rank forms acc = fl(g + r_old)
//! (error <= u |g + r_old|, u = 2^-24); residual_new is acc or exactly 0; G[i] sums at
//! most P delivered acc values in float through the merges (error <= (P - 1) u sum|acc|);
//! result = fl(G / P) (error <= u |G| / P, times P). All other sums are done here in
//! double from the exact float values (error ~ 2^-53, negligible). So
//!   |lhs - rhs| <= (P + 1) u sum_r (|g| + |r_old|) + (P + 1) u^2 (...)
//! and we use tol_i = (P + 2) * 2^-24 * sum_r (|g[r][i]| + |r_old[r][i]|).
template <class Comm>
void check_conservation(Comm& comm, verdict& v, const std::vector<std::vector<float>>& grads,
                        const std::vector<float>& old_all, std::span<const float> residual_new,
                        std::span<const float> result, const char* who) {
  const int P = comm.size();
  const std::size_t n = result.size();
  std::vector<float> new_all(n * P);
  comm.allgather(residual_new, std::span<float>(new_all));
  std::size_t bad = 0, first = n;
  for (std::size_t i = 0; i < n; ++i) {
    double lhs = static_cast<double>(P) * static_cast<double>(result[i]), rhs = 0, mag = 0;
    for (int r = 0; r < P; ++r) {
      lhs += new_all[r * n + i];
      rhs += static_cast<double>(grads[r][i]) + static_cast<double>(old_all[r * n + i]);
      mag += std::fabs(static_cast<double>(grads[r][i])) + std::fabs(static_cast<double>(old_all[r * n + i]));
    }
    const double tol = (P + 2) * std::ldexp(1.0, -24) * mag;
    if (std::fabs(lhs - rhs) > tol) {
      if (bad++ == 0) first = i;
    }
  }
  v.expect(bad == 0, who, ": conservation broken at ", bad, " indices, first ", first);
}

// ---- gTopK against the reference -------------------------------------------------------

template <class Comm>
using counted_gtopk = commpact::gTopK<commpact::TreeComm<commpact::CountingComm<Comm>>>;

//! Runs `steps` steps of gTopK and checks, on every rank and every step: the result and
//! the residual equal the reference bit for bit; nnz <= k; conservation; the bytes and
//! messages CountingComm saw equal those the reference's exchanged counts imply, and a
//! core rank without an extra partner stays within (48 + 8k) log2(P) bytes.
//! Returns (on every rank) the number of re-entered entries seen by the reference.
template <class Comm>
std::size_t check_gtopk_reference(Comm& comm, std::uint64_t seed, std::size_t n, double density, int steps, int kind) {
  const int P = comm.size(), me = comm.rank();
  counted_gtopk<Comm> gt{commpact::CountingComm<Comm>(comm), {.density = density}};
  const std::size_t k = static_cast<std::size_t>(commpact::detail::k_of_density(density, static_cast<std::int64_t>(n)));
  std::vector<std::vector<float>> res(P, std::vector<float>(n, 0.0f));  // reference residuals
  std::size_t reentered = 0;
  verdict v;
  for (int step = 0; step < steps; ++step) {
    std::vector<std::vector<float>> g(P), acc(P);
    for (int r = 0; r < P; ++r) {
      g[r] = grad_of(seed, step, r, n, kind);
      acc[r].resize(n);
      for (std::size_t i = 0; i < n; ++i) acc[r][i] = g[r][i] + res[r][i];
    }
    const ref_gtopk_step ref(acc, k);
    reentered += ref.reentered;

    std::vector<float> old_all(n * P);
    {
      std::vector<float> mine_old(n, 0.0f);
      if (!gt.residual().empty()) std::copy(gt.residual().begin(), gt.residual().end(), mine_old.begin());
      comm.allgather(std::span<const float>(mine_old), std::span<float>(old_all));
    }
    auto grad = g[me];
    const auto before = gt.comm().inner().stats();
    const bool ok = gt.reduce(std::span<float>(grad));
    const auto d = gt.comm().inner().stats() - before;

    v.expect(ok, "step ", step, ": reduce returned false");
    v.expect(gt.k() == static_cast<std::int64_t>(k), "step ", step, ": k = ", gt.k(), ", expected ", k);
    const auto want = ref.result(n, P);
    v.expect(same_bits(grad, want), "P=", P, " seed=", seed, " step ", step, ": result differs from the reference");
    v.expect(nnz(grad) <= k && gt.last_count() <= k && gt.last_count() == ref.G.idx.size(), "step ", step,
             ": nnz ", nnz(grad), " / count ", gt.last_count(), " vs k ", k);
    const auto want_res = ref.residual(acc[me], me);
    v.expect(same_bits(gt.residual(), want_res), "P=", P, " seed=", seed, " step ", step,
             ": residual differs from the reference");
    // The first step also agrees on (n, largest k, step count, residual length, rejected)
    // with one allreduce of 9 int64; later steps use no collective.
    const auto agree_cost = step == 0 ? commpact::wire::ring_allreduce(me, P, 9, 8) : commpact::wire_cost{};
    const std::uint64_t agreement = agree_cost.bytes_sent;
    v.expect(d.bytes_sent == ref.bytes_sent[me] + agreement, "step ", step, ": sent ", d.bytes_sent,
             " bytes, the frames give ", ref.bytes_sent[me], " + ", agreement, " of agreement");
    v.expect(d.messages_sent == ref.messages_sent[me] + agree_cost.messages_sent, "step ", step, ": sent ",
             d.messages_sent, " messages, expected ", ref.messages_sent[me], " + ", agree_cost.messages_sent);
    v.expect(d.collectives == (step == 0 ? 1u : 0u), "step ", step, ": gTopK used ", d.collectives, " collectives");
    const auto& cube = gt.comm().schedule();
    if (!cube.is_extra(me) && cube.fold_partner(me) < 0)
      v.expect(d.bytes_sent - agreement == (wire_header + 8 * k) * static_cast<std::uint64_t>(cube.rounds()), "step ",
               step, ": ", d.bytes_sent - agreement, " bytes of frames, not (48 + 8k) log2 P");
    {  // every rank: at most ceil(log2 P) messages of <= 8k payload bytes, plus headers and the unfold's mask
      int cl = 0;
      while ((1 << cl) < P) ++cl;
      v.expect(d.bytes_sent - agreement <= (wire_header + 8 * k) * static_cast<std::uint64_t>(cl) + (k + 7) / 8 &&
                   d.messages_sent - agree_cost.messages_sent <= static_cast<std::uint64_t>(cl),
               "step ", step, ": ", d.bytes_sent, " bytes in ", d.messages_sent, " messages, above the ceil(log2 P) bound");
    }
    check_conservation(comm, v, g, old_all, gt.residual(), grad, "gTopK");
    res.clear();
    for (int r = 0; r < P; ++r) res.push_back(ref.residual(acc[r], r));
    settle(comm, v, "check_gtopk_reference");
  }
  return reentered;
}

// ---- TopK against the reference --------------------------------------------------------

template <class Comm>
void check_topk_reference(Comm& comm, std::uint64_t seed, std::size_t n, double density, int steps, int kind) {
  const int P = comm.size(), me = comm.rank();
  commpact::TopK<commpact::CountingComm<Comm>> tk{commpact::CountingComm<Comm>(comm), {.density = density}};
  const std::size_t k = static_cast<std::size_t>(commpact::detail::k_of_density(density, static_cast<std::int64_t>(n)));
  std::vector<std::vector<float>> res(P, std::vector<float>(n, 0.0f));
  verdict v;
  for (int step = 0; step < steps; ++step) {
    std::vector<std::vector<float>> g(P), acc(P);
    std::vector<float> want(n, 0.0f);
    std::vector<ref_set> s(P);
    for (int r = 0; r < P; ++r) {
      g[r] = grad_of(seed, step, r, n, kind);
      acc[r].resize(n);
      for (std::size_t i = 0; i < n; ++i) acc[r][i] = g[r][i] + res[r][i];
      s[r] = ref_topk(acc[r], k);
      for (std::size_t j = 0; j < k; ++j) want[s[r].idx[j]] += s[r].val[j];
    }
    for (auto& x : want) x = x / static_cast<float>(P);
    std::vector<float> old_all(n * P);
    {
      std::vector<float> mine_old(n, 0.0f);
      if (!tk.residual().empty()) std::copy(tk.residual().begin(), tk.residual().end(), mine_old.begin());
      comm.allgather(std::span<const float>(mine_old), std::span<float>(old_all));
    }
    auto grad = g[me];
    const auto before = tk.comm().stats();
    tk.reduce(std::span<float>(grad));
    const auto d = tk.comm().stats() - before;
    v.expect(same_bits(grad, want), "TopK P=", P, " step ", step, ": result differs from the reference");
    auto want_res = acc[me];
    for (auto i : s[me].idx) want_res[i] = 0.0f;
    v.expect(same_bits(tk.residual(), want_res), "TopK step ", step, ": residual differs from the reference");
    // Ring allgather of one (48 + 8k)-byte block per rank; step 0 adds the (n, k) agreement.
    auto expect = commpact::wire::ring_allgather(me, P, wire_header + 8 * k);
    if (step == 0) {
      const auto a = commpact::wire::ring_allreduce(me, P, 5, sizeof(std::int64_t));
      expect.bytes_sent += a.bytes_sent;
      expect.messages_sent += a.messages_sent;
    }
    v.expect(d.bytes_sent == expect.bytes_sent, "TopK step ", step, ": sent ", d.bytes_sent, " bytes, expected ",
             expect.bytes_sent);
    v.expect(step == 0 || d.bytes_sent == (8 * k + wire_header) * static_cast<std::uint64_t>(P - 1),
             "TopK: bytes are not (8k + 48)(P - 1)");
    v.expect(d.messages_sent == expect.messages_sent, "TopK step ", step, ": messages ", d.messages_sent);
    check_conservation(comm, v, g, old_all, tk.residual(), grad, "TopK");
    for (int r = 0; r < P; ++r) {
      res[r] = acc[r];
      for (auto i : s[r].idx) res[r][i] = 0.0f;
    }
    settle(comm, v, "check_topk_reference");
  }
}

// ---- bad input ------------------------------------------------------------------------

//! Runs f; returns 0 when it did not throw, 1 for E, 2 for another commpact::error.
template <class E, class F>
int throws_as(F&& f, std::string* what = nullptr) {
  try {
    f();
  } catch (const commpact::error& e) {
    if (what) *what = e.what();
    if constexpr (std::is_same_v<E, commpact::error>) return 1;
    else return dynamic_cast<const E*>(&e) != nullptr ? 1 : 2;
  }
  return 0;
}

//! Options that every rank rejects at construction (no communication involved).
template <class Comp, class Comm>
void check_bad_options(Comm& comm) {
  verdict v;
  using O = commpact::sparse_options;
  auto bad = [&](O o, const char* what) {
    v.expect(throws_as<commpact::invalid_argument>([&] { Comp c{comm, o}; }) == 1, "accepted ", what);
  };
  bad(O{.k = 0}, "k = 0");
  for (double d : {0.0, -0.1, 1.5, std::numeric_limits<double>::quiet_NaN()}) bad(O{.density = d}, "a bad density");
  bad(O{.density_warmup = {{0, 0.1}, {0, 0.2}}}, "a warm-up with repeated steps");
  bad(O{.density_warmup = {{0, 0.1}, {5, 2.0}}}, "a warm-up density of 2");
  bad(O{.k = 3, .density_warmup = {{0, 0.1}}}, "k together with a warm-up");
  bad(O{.momentum = 1.0f}, "momentum = 1");
  bad(O{.clip_norm = -1.0f}, "a negative clip_norm");
  v.expect(throws_as<commpact::invalid_argument>([&] { Comp c{comm, O{.density = 1.0}}; }) == 0, "rejected density 1");
  settle(comm, v, "check_bad_options");
}

//! k above n: every rank raises invalid_argument; the communicator stays usable.
template <class Comp, class Comm>
void check_k_above_n(Comm& comm) {
  verdict v;
  const std::size_t n = 50;
  Comp c{comm, {.k = n + 1}};
  std::vector<float> g = grad_of(5, 0, comm.rank(), n);
  std::string what;
  v.expect(throws_as<commpact::invalid_argument>([&] { c.reduce(std::span<float>(g)); }, &what) == 1,
           "k > n was not rejected with invalid_argument: ", what);
  v.expect(what.find("k = 51") != std::string::npos, "the message does not name k: ", what);
  Comp ok{comm, {.k = n}};  // still usable; density 1 is the dense average
  v.expect(ok.reduce(std::span<float>(g)), "a valid step after the error failed");
  settle(comm, v, "check_k_above_n");
}

//! One rank's gradient holds NaN (or Inf): by default every rank raises numeric_error;
//! with skip_step every rank returns false, gets a zero gradient and keeps its state.
template <class Comp, class Comm>
void check_nonfinite(Comm& comm, int bad_rank, float bad_value) {
  verdict v;
  const int P = comm.size();
  const std::size_t n = 200;
  bad_rank = ((bad_rank % P) + P) % P;
  for (auto mode : {commpact::nonfinite::raise, commpact::nonfinite::skip_step}) {
    Comp c{comm, {.density = 0.05, .on_nonfinite = mode}};
    auto g0 = grad_of(9, 0, comm.rank(), n);
    c.reduce(std::span<float>(g0));  // one good step: a non-zero residual
    const std::vector<float> res_before(c.residual().begin(), c.residual().end());
    auto g = grad_of(9, 1, comm.rank(), n);
    if (comm.rank() == bad_rank) g[17] = bad_value;
    if (mode == commpact::nonfinite::raise) {
      std::string what;
      v.expect(throws_as<commpact::numeric_error>([&] { c.reduce(std::span<float>(g)); }, &what) == 1,
               "non-finite input did not raise numeric_error on rank ", comm.rank(), ": ", what);
    } else {
      bool r = true;
      v.expect(throws_as<commpact::error>([&] { r = c.reduce(std::span<float>(g)); }) == 0, "skip_step raised");
      v.expect(!r && c.skipped_steps() == 1, "skip_step did not report the skipped step");
      v.expect(nnz(g) == 0, "skip_step did not zero the gradient");
    }
    v.expect(same_bits(c.residual(), res_before), "the residual changed on a failed or skipped step");
    auto g2 = grad_of(9, 2, comm.rank(), n);
    v.expect(c.reduce(std::span<float>(g2)), "the step after a non-finite one failed");
  }
  settle(comm, v, "check_nonfinite");
}

//! The last rank passes a longer gradient: every rank raises mismatch_error (none hangs),
//! and the communicator stays usable.
template <class Comp, class Comm>
void check_length_mismatch(Comm& comm) {
  verdict v;
  const int P = comm.size();
  const std::size_t n = 300 + (comm.rank() == P - 1 && P > 1 ? 7 : 0);
  Comp c{comm, {.density = 0.02}};
  auto g = grad_of(3, 0, comm.rank(), n);
  std::string what;
  const int r = throws_as<commpact::mismatch_error>([&] { c.reduce(std::span<float>(g)); }, &what);
  if (P > 1) {
    v.expect(r == 1, "rank ", comm.rank(), " did not raise mismatch_error: ", what);
    v.expect(what.find("gradient length") != std::string::npos, "the message does not say what differs: ", what);
  } else {
    v.expect(r == 0, "P = 1 raised: ", what);
  }
  Comp ok{comm, {.density = 0.02}};
  auto g2 = grad_of(3, 1, comm.rank(), 300);
  v.expect(throws_as<commpact::error>([&] { ok.reduce(std::span<float>(g2)); }) == 0, "a valid step after the error failed");
  settle(comm, v, "check_length_mismatch");
}

//! Save after a few steps, continue; a fresh compressor loading the state continues
//! with the same bits.
template <class Comp, class Comm>
void check_save_load(Comm& comm, commpact::sparse_options opt, std::size_t n) {
  verdict v;
  Comp a{comm, opt};
  for (int s = 0; s < 3; ++s) {
    auto g = grad_of(21, s, comm.rank(), n);
    a.reduce(std::span<float>(g));
  }
  std::vector<std::byte> state;
  a.save_state(state);
  std::vector<std::vector<float>> ra, rb;
  for (int s = 3; s < 6; ++s) {
    auto g = grad_of(21, s, comm.rank(), n);
    a.reduce(std::span<float>(g));
    ra.push_back(g);
    ra.emplace_back(a.residual().begin(), a.residual().end());
  }
  Comp b{comm, opt};
  b.load_state(state);
  v.expect(b.steps() == 3, "loaded step counter ", b.steps());
  for (int s = 3; s < 6; ++s) {
    auto g = grad_of(21, s, comm.rank(), n);
    b.reduce(std::span<float>(g));
    rb.push_back(g);
    rb.emplace_back(b.residual().begin(), b.residual().end());
  }
  v.expect(ra == rb, "the restored compressor diverged");
  // A truncated state is rejected.
  v.expect(throws_as<commpact::wire_error>([&] { b.load_state(std::span(state).first(state.size() - 1)); }) == 1,
           "a truncated state was accepted");
  settle(comm, v, "check_save_load");
}

}  // namespace commpact_test
