#pragma once
// Checks of PowerCompressor (PowerSGD) written once over any communicator, run from the
// ThreadComm tests (tests/test_compress_power.cpp) and the MPI tests
// (tests/mpi/test_compress_power_mpi.cpp).
//
// Every rank derives every rank's gradient from a shared seed, computes the references
// itself, and checks its own results; results that must agree across ranks are compared
// through allgather. Failures are collected in a `verdict` and `settle`d, so every rank
// throws check_failed together (see tests/common/sparse_checks.hpp). Wrap a check in
// REQUIRE_NOTHROW(run_threads(...)) or REQUIRE_NOTHROW(mpi_guard(comm, ...)).
#include <catch2/catch.hpp>
#include <commpact/comm/checked_comm.hpp>
#include <commpact/comm/counting_comm.hpp>
#include <commpact/comm/thread_comm.hpp>
#include <commpact/comm/wire_model.hpp>
#include <commpact/compress/compressors/power.hpp>

#include <Eigen/Dense>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "random.hpp"
#include "sparse_checks.hpp"  // verdict, settle, throws_as

namespace commpact_test {

using PowerRowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

//! True for communicators whose allreduce adds the ranks' values in rank order (so a
//! serial rank-order sum is a bit-exact reference); MPI's order is its own.
template <class Comm>
inline constexpr bool sums_in_rank_order =
    std::is_same_v<Comm, commpact::ThreadComm> || std::is_same_v<Comm, commpact::CountingComm<commpact::ThreadComm>> ||
    std::is_same_v<Comm, commpact::CheckedComm<commpact::ThreadComm>> ||
    std::is_same_v<Comm, commpact::CountingComm<commpact::CheckedComm<commpact::ThreadComm>>>;

inline std::size_t numel(const commpact::tensor_layout& l) {
  std::size_t n = 0;
  for (auto& s : l) n += static_cast<std::size_t>(s.numel());
  return n;
}

// Rank `rank`'s gradient: tensor t of shape n x m with n, m > 1 is U_t V_{t,rank}^T with
// U_t (n x k) shared by all ranks, so the mean over ranks has rank <= k; vectors are
// random per rank.
inline std::vector<float> low_rank_grad(const commpact::tensor_layout& l, int k, int rank, std::uint64_t seed) {
  std::vector<float> g;
  for (std::size_t t = 0; t < l.size(); ++t) {
    const auto n = l[t].rows, m = l[t].cols;
    if (l[t].is_vector()) {
      auto v = normal(seed * 7919 + t * 31 + rank, static_cast<std::size_t>(n * m));
      g.insert(g.end(), v.begin(), v.end());
      continue;
    }
    auto u = normal(seed * 104729 + t, static_cast<std::size_t>(n * k));
    auto w = normal(seed * 15485863 + t * 131 + rank + 1, static_cast<std::size_t>(m * k));
    Eigen::Map<PowerRowMat> U(u.data(), n, k), W(w.data(), m, k);
    PowerRowMat M = U * W.transpose();
    g.insert(g.end(), M.data(), M.data() + n * m);
  }
  return g;
}

// Mean over ranks summed in rank order, then divided by P like the compressors do (the
// one definition, kernels/mean.hpp, written out here).
inline std::vector<float> rank_order_mean(const std::vector<std::vector<float>>& per_rank) {
  std::vector<float> s = per_rank[0];
  for (std::size_t r = 1; r < per_rank.size(); ++r)
    for (std::size_t i = 0; i < s.size(); ++i) s[i] += per_rank[r][i];
  const auto P = static_cast<float>(per_rank.size());
  for (auto& x : s) x = x / P;
  return s;
}

inline double rel_err(std::span<const float> a, std::span<const float> b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / (den > 0 ? den : 1));
}

inline std::uint64_t fnv_bytes(const void* p, std::size_t n, std::uint64_t h = 1469598103934665603ull) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

//! True on every rank when every rank holds the same bytes (one allgather of a hash).
template <class Comm, class T>
bool same_on_all_ranks(Comm& comm, std::span<const T> v) {
  const std::uint64_t h = fnv_bytes(v.data(), v.size_bytes()) ^ (v.size() * 0x9E3779B97F4A7C15ull);
  std::vector<std::uint64_t> all(static_cast<std::size_t>(comm.size()));
  comm.allgather(std::span<const std::uint64_t>(&h, 1), std::span<std::uint64_t>(all));
  return std::all_of(all.begin(), all.end(), [&](std::uint64_t a) { return a == h; });
}

inline const commpact::tensor_layout kPowerLayout = {{32, 48}, {48}, {8, 6}, {20, 30}, {1, 7}, {64, 27}};

//! The dense part of a PowerCompressor step computed the way the compressor does: the
//! uncompressed tensors packed in layout order, one allreduce (sum), times 1/P. Returns
//! the full-length buffer with those tensors filled in (others zero).
template <class Comm>
std::vector<float> packed_dense_mean(Comm& comm, const commpact::tensor_layout& l, const std::vector<int>& compressed,
                                     const std::vector<float>& in) {
  std::vector<float> packed;
  std::size_t off = 0;
  for (std::size_t t = 0; t < l.size(); ++t) {
    const auto n = static_cast<std::size_t>(l[t].numel());
    if (!compressed[t]) packed.insert(packed.end(), in.begin() + off, in.begin() + off + n);
    off += n;
  }
  if (!packed.empty()) comm.allreduce(std::span<float>(packed), commpact::reduce_op::sum);
  const auto fP = static_cast<float>(comm.size());
  for (auto& x : packed) x = x / fP;
  std::vector<float> out(in.size(), 0.0f);
  off = 0;
  std::size_t p = 0;
  for (std::size_t t = 0; t < l.size(); ++t) {
    const auto n = static_cast<std::size_t>(l[t].numel());
    if (!compressed[t]) {
      std::copy(packed.begin() + p, packed.begin() + p + n, out.begin() + off);
      p += n;
    }
    off += n;
  }
  return out;
}

//! Recovery of a mean of exact rank k <= 2 at Rank 2 and 4 after `steps` steps: compressed
//! tensors to 2e-6 relative, dense tensors bit for bit (the compressor's own dense
//! arithmetic, and on rank-order communicators the serial rank-order mean), results
//! bit-identical on every rank, and the expected tensors compressed.
template <class Comm>
void check_power_lowrank_recovery(Comm& comm, int k, int steps = 3) {
  using commpact::PowerCompressor;
  const auto& l = kPowerLayout;
  const int P = comm.size(), me = comm.rank();
  verdict v;
  std::vector<std::vector<float>> in(P);
  for (int r = 0; r < P; ++r) in[r] = low_rank_grad(l, k, r, 42);
  const auto mean = rank_order_mean(in);
  PowerCompressor<2> c2{comm, l, {.min_compression_rate = 1.0}};
  PowerCompressor<4> c4{comm, l, {.min_compression_rate = 1.0}};
  std::vector<float> out2, out4;
  for (int s = 0; s < steps; ++s) {
    out2 = in[me];
    out4 = in[me];
    c2.reduce(std::span<float>(out2));
    c4.reduce(std::span<float>(out4));
  }
  std::vector<int> compressed2(l.size()), compressed4(l.size());
  for (std::size_t t = 0; t < l.size(); ++t) {
    compressed2[t] = c2.is_compressed(t);
    compressed4[t] = c4.is_compressed(t);
  }
  // Which tensors are compressed: matrices with (n + m) r * 1 < n m.
  v.expect(compressed2 == std::vector<int>{1, 0, 1, 1, 0, 1}, "Rank 2 compresses the wrong tensors");
  v.expect(compressed4 == std::vector<int>{1, 0, 0, 1, 0, 1}, "Rank 4 compresses the wrong tensors");
  const auto dense2 = packed_dense_mean(comm, l, compressed2, in[me]);
  const auto dense4 = packed_dense_mean(comm, l, compressed4, in[me]);
  std::size_t off = 0;
  for (std::size_t t = 0; t < l.size(); ++t) {
    const auto n = static_cast<std::size_t>(l[t].numel());
    for (int which : {2, 4}) {
      const auto& out = which == 2 ? out2 : out4;
      std::span<const float> got(out.data() + off, n), want(mean.data() + off, n);
      const bool dense = (which == 2 ? compressed2[t] : compressed4[t]) == 0;
      if (dense) {
        // Dense tensors are the exact mean, summed as the communicator sums.
        const auto& d = which == 2 ? dense2 : dense4;
        v.expect(same_bits(got, std::span<const float>(d.data() + off, n)), "Rank ", which, " tensor ", t,
                 ": dense tensor is not the communicator's mean bit for bit");
        if constexpr (sums_in_rank_order<Comm>)
          v.expect(std::equal(got.begin(), got.end(), want.begin()), "Rank ", which, " tensor ", t,
                   ": dense tensor is not the rank-order mean");
      } else {
        const double e = rel_err(got, want);
        v.expect(e < 2e-6, "P=", P, " k=", k, " Rank ", which, " tensor ", t, ": relative error ", e);
      }
    }
    off += n;
  }
  v.expect(same_on_all_ranks(comm, std::span<const float>(out2)), "Rank 2 results differ between ranks");
  v.expect(same_on_all_ranks(comm, std::span<const float>(out4)), "Rank 4 results differ between ranks");
  settle(comm, v, "check_power_lowrank_recovery");
}

//! Rank 1 on a rank-3 mean: lossy per step, but no mass is lost globally. Per step
//! A_t = P P^T mean_r(M_r), mean_r(e_r) = mean_r(M_r) - A_t, so
//! sum_t A_t + mean_r(e_{r,T}) = sum_t mean_r(g_r). Returns nothing; settles.
template <class Comm>
void check_power_conservation(Comm& comm, int T = 20) {
  const commpact::tensor_layout l = {{40, 30}};
  const int P = comm.size(), me = comm.rank();
  verdict v;
  std::vector<std::vector<float>> in(P);
  for (int r = 0; r < P; ++r) in[r] = low_rank_grad(l, 3, r, 7);
  const auto mean = rank_order_mean(in);
  commpact::PowerCompressor<1> c{comm, l};
  std::vector<double> sum_out(1200, 0.0);
  double first_err = 0;
  std::vector<float> x;
  for (int s = 0; s < T; ++s) {
    x = in[me];
    c.reduce(std::span<float>(x));
    for (std::size_t i = 0; i < x.size(); ++i) sum_out[i] += x[i];
    if (s == 0) first_err = rel_err(x, mean);
  }
  v.expect(same_on_all_ranks(comm, std::span<const float>(x)), "outputs differ between ranks");
  v.expect(first_err > 0.1, "rank 1 recovered a rank-3 mean in one step (error ", first_err, ")");
  // Sum of the residuals over ranks, in rank order on every communicator (allgather).
  const auto e = c.residual(0);
  std::vector<float> all_e(static_cast<std::size_t>(P) * 1200);
  comm.allgather(std::span<const float>(e.data(), e.size()), std::span<float>(all_e));
  double num = 0, den = 0;
  for (std::size_t i = 0; i < 1200; ++i) {
    double em = 0;
    for (int r = 0; r < P; ++r) em += all_e[static_cast<std::size_t>(r) * 1200 + i];
    const double d = sum_out[i] + em / P - double(T) * mean[i];
    num += d * d;
    den += double(T) * mean[i] * double(T) * mean[i];
  }
  v.expect(std::sqrt(num / den) < 1e-5, "mass lost: relative ", std::sqrt(num / den));
  // The time-averaged output approaches the mean (error feedback at work).
  std::vector<float> avg(1200);
  for (std::size_t i = 0; i < 1200; ++i) avg[i] = static_cast<float>(sum_out[i] / T);
  v.expect(rel_err(avg, mean) < 0.1, "time-averaged output is ", rel_err(avg, mean), " from the mean");
  settle(comm, v, "check_power_conservation");
}

//! Error feedback: residual = (g + e_old) - approximation, bit for bit as defined.
template <class Comm>
void check_power_error_feedback(Comm& comm) {
  const auto& l = kPowerLayout;
  verdict v;
  commpact::PowerCompressor<2> c{comm, l};
  std::vector<std::vector<float>> e_old(l.size());
  std::size_t checked = 0;
  for (int s = 0; s < 6; ++s) {
    auto g = normal(1000 * s + comm.rank() + 17, numel(l));
    const auto g_in = g;
    for (std::size_t t = 0; t < l.size(); ++t) {
      auto e = c.residual(t);
      e_old[t].assign(e.begin(), e.end());
    }
    c.reduce(std::span<float>(g));
    std::size_t off = 0;
    for (std::size_t t = 0; t < l.size(); ++t) {
      const auto n = static_cast<std::size_t>(l[t].numel());
      const auto e = c.residual(t);
      if (c.is_compressed(t)) {
        for (std::size_t i = 0; i < n; ++i) {
          const float M = g_in[off + i] + (s == 0 ? 0.0f : e_old[t][i]);
          const float want = M - g[off + i];
          // approximation + residual = M, bit for bit as the algorithm computes it
          v.expect(std::memcmp(&want, &e[i], sizeof(float)) == 0, "step ", s, " tensor ", t, " index ", i,
                   ": residual ", e[i], " != M - approximation ", want);
          ++checked;
        }
      } else {
        v.expect(e.empty(), "dense tensor ", t, " has a residual");
      }
      off += n;
    }
  }
  v.expect(checked > 0, "no compressed entry was checked");
  settle(comm, v, "check_power_error_feedback");
}

//! Results and Q factors bit-identical on every rank, each rank's buffer misaligned
//! differently (offset of `rank % 8` floats).
template <class Comm>
void check_power_bit_identical(Comm& comm) {
  const auto& l = kPowerLayout;
  const std::size_t n = numel(l);
  verdict v;
  commpact::PowerCompressor<3> c{comm, l, {.min_compression_rate = 1.0}};
  std::vector<float> storage(n + 8);
  std::span<float> g(storage.data() + comm.rank() % 8, n);
  for (int s = 0; s < 4; ++s) {
    auto x = normal(77 * s + comm.rank(), n);
    std::copy(x.begin(), x.end(), g.begin());
    c.reduce(g);
  }
  std::vector<float> q;
  for (std::size_t t = 0; t < l.size(); ++t) {
    auto f = c.q_factor(t);
    q.insert(q.end(), f.begin(), f.end());
  }
  v.expect(same_on_all_ranks(comm, std::span<const float>(g)), "outputs differ between ranks");
  v.expect(same_on_all_ranks(comm, std::span<const float>(q)), "Q factors differ between ranks");
  settle(comm, v, "check_power_bit_identical");
}

//! Bytes per step through CountingComm<Comm>: (n + m) r 4 per matrix plus the dense part,
//! exact ring counts, plus each step's step count (6 floats, compress/step_check.hpp);
//! step 0 dense (+ the one-off layout check), then compressed.
template <class Comm>
void check_power_bytes(Comm& comm) {
  constexpr int R = 2;
  const auto& l = kPowerLayout;
  const int P = comm.size(), r = comm.rank();
  verdict v;
  std::size_t want_p = 0, want_q = 0, want_d = 0;
  for (auto& s : l) {
    const bool comp = !s.is_vector() && double((s.rows + s.cols) * R) * 2.0 < double(s.rows * s.cols);  // PyTorch's rule
    if (comp) {
      want_p += static_cast<std::size_t>(s.rows) * R;
      want_q += static_cast<std::size_t>(s.cols) * R;
    } else {
      want_d += static_cast<std::size_t>(s.numel());
    }
  }
  using CC = commpact::CountingComm<Comm>;
  CC counted{comm};
  commpact::PowerCompressor<R> c{counted, l, {.start_step = 1}};
  auto g = normal(5 + r, numel(l));
  auto x = g;
  c.reduce(std::span<float>(x));  // step 0: dense (+ the one-off layout check)
  const auto dense_stats = c.comm().template target<CC>()->stats();
  c.comm().template target<CC>()->reset_stats();
  x = g;
  c.reduce(std::span<float>(x));  // step 1: compressed
  const auto step_stats = c.comm().template target<CC>()->stats();
  c.comm().template target<CC>()->reset_stats();
  x = g;
  c.reduce(std::span<float>(x));  // step 2: compressed, warm
  const auto warm_stats = c.comm().template target<CC>()->stats();
  const auto wp = commpact::wire::ring_allreduce(r, P, want_p, 4);
  const auto wq = commpact::wire::ring_allreduce(r, P, want_q, 4);
  const auto wd = commpact::wire::ring_allreduce(r, P, want_d, 4);
  const auto check = commpact::wire::ring_allreduce(r, P, 5, 8);  // layout hash and length on step 0 (agree.hpp)
  const auto step_check = commpact::wire::ring_allreduce(r, P, 6, 4);  // the step count, every step
  const auto full = commpact::wire::ring_allreduce(r, P, numel(l), 4);
  v.expect(c.floats_per_step() == want_p + want_q + want_d, "floats_per_step ", c.floats_per_step());
  v.expect(step_stats.bytes_sent == wp.bytes_sent + wq.bytes_sent + wd.bytes_sent + step_check.bytes_sent,
           "step bytes sent ", step_stats.bytes_sent);
  v.expect(step_stats.bytes_received ==
               wp.bytes_received + wq.bytes_received + wd.bytes_received + step_check.bytes_received,
           "step bytes received ", step_stats.bytes_received);
  v.expect(step_stats.collectives == 4, "step collectives ", step_stats.collectives);
  v.expect(warm_stats == step_stats, "the warm step counts differently");
  v.expect(dense_stats.bytes_sent == full.bytes_sent + check.bytes_sent + step_check.bytes_sent, "dense step bytes ",
           dense_stats.bytes_sent);
  v.expect(dense_stats.collectives == 3, "dense step collectives ", dense_stats.collectives);
  // Compressed traffic is well below dense traffic.
  if (P > 1) v.expect(step_stats.bytes_sent * 2 < full.bytes_sent, "compressed traffic is not below dense");
  settle(comm, v, "check_power_bytes");
}

//! Ranks that register different shapes (same total length; rank P-1 differs) all raise
//! mismatch_error naming the layout, and the communicator stays usable. Needs P >= 2.
template <class Comm>
void check_power_shape_mismatch(Comm& comm) {
  const int P = comm.size();
  if (P < 2) return;
  verdict v;
  const commpact::tensor_layout l =
      comm.rank() == P - 1 ? commpact::tensor_layout{{20, 10}, {10}} : commpact::tensor_layout{{10, 20}, {10}};
  commpact::PowerCompressor<2> c{comm, l};
  std::vector<float> g(210, 1.0f);
  std::string what;
  const int got = throws_as<commpact::mismatch_error>([&] { c.reduce(std::span<float>(g)); }, &what);
  v.expect(got == 1, "expected mismatch_error, got ", got == 0 ? "no error" : "another error", ": ", what);
  v.expect(what.find("ranks disagree on the PowerCompressor layout") != std::string::npos, "message: ", what);
  settle(comm, v, "check_power_shape_mismatch");
}

//! A NaN in one rank's gradient (rank 1 % P) makes every rank raise numeric_error.
template <class Comm>
void check_power_nonfinite_raises(Comm& comm) {
  const commpact::tensor_layout l = {{12, 10}, {10}};
  verdict v;
  commpact::PowerCompressor<1> c{comm, l};
  auto g = normal(comm.rank(), 130);
  if (comm.rank() == 1 % comm.size()) g[5] = std::nanf("");
  const int got = throws_as<commpact::numeric_error>([&] { c.reduce(std::span<float>(g)); });
  v.expect(got == 1, "expected numeric_error on every rank, got ", got);
  settle(comm, v, "check_power_nonfinite_raises");
}

}  // namespace commpact_test
