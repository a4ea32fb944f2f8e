// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file cost_model.hpp
//! The alpha-beta-gamma cost model of commpact's algorithms: time per step =
//! alpha * (message latencies on the critical path) + beta * (bytes serialised on the
//! busiest link of the critical path) + gamma * (elements touched by local passes).
//!
//! \code
//! using namespace commpact::cost;
//! const commpact::cost::link net = link_from_rate(1e9, 50e-6);  // 1 Gbit/s, 50 us per message (POSIX has a ::link)
//! const auto d = dense(32, 25'600'000);                    // ResNet-50, ring allreduce
//! const auto g = gtopk(32, 25'600'000, 25'600);            // density 0.001
//! double speedup = comm_time(d, net) / comm_time(g, net);
//! double eff = scaling_efficiency(0.25, comm_time(g, net)); // 0.25 s of compute per step
//! \endcode
//!
//! Each model returns a step_cost with two views of the same step:
//! - `bytes_sent` and `messages_sent`: the most any one rank sends, exactly as
//!   CountingComm counts it (collectives charged by the ring formulas of wire_model.hpp,
//!   point-to-point messages as sent, sparse messages 48 header bytes + 8 per entry);
//! - `latency_rounds` and `path_bytes`: what the time depends on, for the algorithm that
//!   actually runs. OpenMPI's nonblocking allreduce (libnbc, under MpiComm) reduces to one
//!   rank and broadcasts back (binomial) for P < 4 or messages under 64 KiB, and runs a
//!   ring above; `allreduce_algorithm::openmpi` picks the same way.
//!
//! The parameters come from measurements: fit_link() solves the least-squares problem
//! t = alpha * rounds + beta * bytes over measured communication times, fit_gamma() the
//! per-element compute cost.
//!
//! A link may carry three more terms, all zero by default (then comm_time is alpha-beta):
//! - `burst`: a token-bucket link (tc tbf, as scripts/cluster builds) lets `burst` bytes
//!   through without waiting for its rate each time the path starts sending after a wait
//!   (`step_cost::bursts` such starts), so beta applies to max(0, path_bytes - bursts burst);
//! - `host_beta`: seconds per byte of host work on the critical path (copies, the TCP
//!   stack between namespaces), paid by every byte, inside the burst too;
//! - `sched`: seconds of scheduling delay per latency round and per extra rank sharing a
//!   core: with rho ranks per core, a round's partner waits on average for its turn behind
//!   rho - 1 others, so each round adds sched * max(0, rho - 1) (comm_time's third argument).
//! fit_host_link() (cost_fit.hpp) fits alpha, beta, host_beta and sched together. scaling_efficiency() is the gTop-k paper's definition:
//! throughput of P workers over P times the throughput of one, that is
//! t_compute / (t_compute + t_comm) when every worker keeps its batch size.

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "../comm/wire_model.hpp"
#include "../error.hpp"

namespace commpact::cost {

//! One step of one algorithm (see the file comment for the two views).
struct step_cost {
  std::uint64_t bytes_sent = 0;     //!< the most bytes any rank sends
  std::uint64_t messages_sent = 0;  //!< the most messages any rank sends
  double latency_rounds = 0;        //!< sequential message latencies on the critical path
  double path_bytes = 0;            //!< bytes serialised on one link along the critical path
  double compute_elements = 0;      //!< elements of local O(n) passes (gamma's unit)
  //! times the critical path starts sending after a wait (a token bucket is full again)
  double bursts = 0;

  step_cost& operator+=(const step_cost& o) {
    bytes_sent += o.bytes_sent;
    messages_sent += o.messages_sent;
    latency_rounds += o.latency_rounds;
    path_bytes += o.path_bytes;
    compute_elements += o.compute_elements;
    bursts += o.bursts;
    return *this;
  }
  friend step_cost operator+(step_cost a, const step_cost& b) { return a += b; }
  //! The step amortised over `steps` steps (Local SGD: one round every H steps). Byte and
  //! message counts are rounded to the nearest integer.
  step_cost amortised(double steps) const {
    require(steps >= 1, "commpact::cost::step_cost::amortised: steps = ", steps, " must be >= 1.");
    step_cost c = *this;
    c.bytes_sent = static_cast<std::uint64_t>(std::llround(static_cast<double>(bytes_sent) / steps));
    c.messages_sent = static_cast<std::uint64_t>(std::llround(static_cast<double>(messages_sent) / steps));
    c.latency_rounds /= steps;
    c.path_bytes /= steps;
    c.compute_elements /= steps;
    c.bursts /= steps;
    return c;
  }
};

//! A link: alpha seconds per latency round, beta seconds per byte at the link's rate; the
//! host terms (file comment) are zero unless fitted.
struct link {
  double alpha = 0;      //!< seconds per latency round
  double beta = 0;       //!< seconds per byte beyond the burst (the link's rate)
  double host_beta = 0;  //!< seconds per byte of host work, every byte
  double burst = 0;      //!< bytes a token bucket passes at once after a wait (0: none)
  double sched = 0;      //!< seconds per latency round per extra rank sharing a core
};

//! The link of a given rate in bit/s and latency alpha.
inline link link_from_rate(double bits_per_second, double alpha) {
  require(bits_per_second > 0, "commpact::cost::link_from_rate: the rate ", bits_per_second,
          " bit/s must be positive.");
  return {alpha, 8.0 / bits_per_second};
}

//! Bytes of the critical path that wait for the link's rate: those beyond the bursts.
inline double rate_bytes(const step_cost& c, double burst) { return std::max(0.0, c.path_bytes - c.bursts * burst); }

//! Communication time of a step on a link, with `ranks_per_core` ranks sharing each core
//! (1: a core per rank, no scheduling delay):
//! alpha L + beta max(0, B - bursts burst) + host_beta B + sched L max(0, rho - 1).
inline double comm_time(const step_cost& c, const link& l, double ranks_per_core = 1) {
  require(ranks_per_core > 0, "commpact::cost::comm_time: ranks_per_core = ", ranks_per_core,
          " must be > 0 (ranks divided by cores).");
  return c.latency_rounds * (l.alpha + l.sched * std::max(0.0, ranks_per_core - 1)) +
         rate_bytes(c, l.burst) * l.beta + c.path_bytes * l.host_beta;
}
inline double compute_time(const step_cost& c, double gamma) { return c.compute_elements * gamma; }

//! The gTop-k paper's scaling efficiency (throughput of P workers / (P x one worker's)).
inline double scaling_efficiency(double t_compute, double t_comm) {
  require(t_compute > 0 && t_comm >= 0, "commpact::cost::scaling_efficiency: t_compute = ", t_compute,
          " must be > 0 and t_comm = ", t_comm, " >= 0.");
  return t_compute / (t_compute + t_comm);
}

enum class allreduce_algorithm {
  ring,      //!< reduce-scatter + allgather: 2(P-1) rounds of n/P elements
  binomial,  //!< binomial reduce to rank 0, then binomial broadcast: 2 ceil(log2 P) rounds of n
  openmpi,   //!< what OpenMPI's libnbc picks: binomial for P < 4 or < 64 KiB, else ring
};

namespace detail {
inline int ceil_log2(int P) { return P <= 1 ? 0 : std::bit_width(static_cast<unsigned>(P - 1)); }
inline void check_ranks(int P, const char* who) {
  require(P >= 1, "commpact::cost::", who, ": P = ", P, " ranks; it must be >= 1.");
}
}  // namespace detail

//! Allreduce of n elements of elem_bytes each.
inline step_cost allreduce(int P, std::uint64_t n, std::uint64_t elem_bytes = 4,
                           allreduce_algorithm algo = allreduce_algorithm::openmpi) {
  detail::check_ranks(P, "allreduce");
  step_cost c;
  if (P == 1 || n == 0) return c;
  for (int r = 0; r < P; ++r) {  // CountingComm's view: the ring's exact per-rank bytes
    const auto w = wire::ring_allreduce(r, P, n, elem_bytes);
    c.bytes_sent = std::max(c.bytes_sent, w.bytes_sent);
    c.messages_sent = std::max(c.messages_sent, w.messages_sent);
  }
  if (algo == allreduce_algorithm::openmpi)
    algo = (P < 4 || n * elem_bytes < 65536) ? allreduce_algorithm::binomial : allreduce_algorithm::ring;
  if (algo == allreduce_algorithm::ring) {  // one stream: each step's chunk follows the last
    c.latency_rounds = 2.0 * (P - 1);
    c.path_bytes = c.latency_rounds * static_cast<double>(wire::ring_chunk(n, P, 0) * elem_bytes);
    c.bursts = 1;
  } else {  // each round waits for the previous one to arrive whole
    c.latency_rounds = 2.0 * detail::ceil_log2(P);
    c.path_bytes = c.latency_rounds * static_cast<double>(n * elem_bytes);
    c.bursts = c.latency_rounds;
  }
  return c;
}

//! Allgather of one block of block_bytes per rank: P-1 blocks leave each rank (a ring, as
//! CountingComm charges it, or OpenMPI libnbc's linear algorithm, which posts all P-1 sends
//! at once: one latency on the critical path, as modelled here).
inline step_cost allgather(int P, std::uint64_t block_bytes) {
  detail::check_ranks(P, "allgather");
  step_cost c;
  if (P == 1) return c;
  c.bytes_sent = static_cast<std::uint64_t>(P - 1) * block_bytes;
  c.messages_sent = static_cast<std::uint64_t>(P - 1);
  c.latency_rounds = 1;
  c.path_bytes = static_cast<double>(c.bytes_sent);
  c.bursts = 1;
  return c;
}

//! Binomial broadcast of `bytes` from one root.
inline step_cost broadcast(int P, std::uint64_t bytes) {
  detail::check_ranks(P, "broadcast");
  step_cost c;
  if (P == 1) return c;
  const auto w = wire::binomial_broadcast(0, P, 0, bytes);  // the root sends the most
  c.bytes_sent = w.bytes_sent;
  c.messages_sent = w.messages_sent;
  c.latency_rounds = detail::ceil_log2(P);
  c.path_bytes = c.latency_rounds * static_cast<double>(bytes);
  c.bursts = c.latency_rounds;
  return c;
}

//! The step count that commpact's Dense, LinearCompressor, CastAllreduce and
//! PowerCompressor agree on at every step (compress/step_check.hpp): an allreduce of 6
//! floats (the count in three exact 21-bit pieces, each with its negation). Not part of
//! dense() and powersgd(), which cost the algorithms (and fit measurements taken before
//! the check existed): add it for what those compressors send, as CountingComm counts.
inline step_cost step_check(int P, allreduce_algorithm algo = allreduce_algorithm::openmpi) {
  return allreduce(P, 6, 4, algo);
}

//! Dense S-SGD: one allreduce of n floats, then the mean; the first step (and a change
//! of length) adds the agreement allreduce of 3 int64 (n, -n, rejected: comm/agree.hpp).
inline step_cost dense(int P, std::uint64_t n, bool first_step = false,
                       allreduce_algorithm algo = allreduce_algorithm::openmpi) {
  auto c = allreduce(P, n, 4, algo);
  if (first_step) c += allreduce(P, 3, 8);
  c.compute_elements = static_cast<double>(n);
  return c;
}

inline constexpr std::uint64_t sparse_header_bytes = 48;  //!< sparse_wire::header_bytes
inline constexpr std::uint64_t sparse_entry_bytes = 8;    //!< int32 index + float32 value

//! Top-k S-SGD: an allgather of every rank's k entries (48 + 8k bytes); the first step
//! (and a density warm-up boundary) adds an allreduce of 5 int64 to agree on (n, k).
inline step_cost topk(int P, std::uint64_t n, std::uint64_t k, bool first_step = false) {
  auto c = allgather(P, sparse_header_bytes + sparse_entry_bytes * k);
  if (first_step) c += allreduce(P, 5, 8);
  c.compute_elements = static_cast<double>(n);
  return c;
}

//! gTop-k S-SGD: recursive doubling over p2 = bit_floor(P) core ranks, log2(p2) exchanges
//! of 48 + 8k bytes; for P not a power of two an extra rank folds its set into a core rank
//! first and gets the result back with a survival mask of ceil(k/8) bytes. Every message is
//! a fixed-capacity frame of k entries. The first step (and the first after reset() or
//! load_state()) adds the agreement allreduce of 9 int64 (n, largest k, step count,
//! residual length, each with its negation, and the rejected flag).
inline step_cost gtopk(int P, std::uint64_t n, std::uint64_t k, bool first_step = false) {
  detail::check_ranks(P, "gtopk");
  step_cost c;
  const int p2 = static_cast<int>(std::bit_floor(static_cast<unsigned>(P)));
  const int rounds = std::countr_zero(static_cast<unsigned>(p2));
  const std::uint64_t msg = sparse_header_bytes + sparse_entry_bytes * k;
  const std::uint64_t unfold = msg + (k + 7) / 8;
  if (P > 1) {
    c.bytes_sent = static_cast<std::uint64_t>(rounds) * msg + (P > p2 ? unfold : 0);
    c.messages_sent = static_cast<std::uint64_t>(rounds) + (P > p2 ? 1 : 0);
    c.latency_rounds = rounds + (P > p2 ? 2 : 0);
    c.path_bytes = static_cast<double>(rounds * msg + (P > p2 ? msg + unfold : 0));
    c.bursts = c.latency_rounds;  // every exchange waits for the partner's set
  }
  if (first_step) {
    // The busiest rank of the step: its tree messages plus its part of the ring
    // allreduce of the agreement (ranks differ in both).
    std::uint64_t bytes = 0, messages = 0;
    for (int r = 0; r < P && P > 1; ++r) {
      const bool extra = r >= p2, partner = r + p2 < P;
      const auto w = wire::ring_allreduce(r, P, 9, 8);
      const std::uint64_t tb = extra ? msg : static_cast<std::uint64_t>(rounds) * msg + (partner ? unfold : 0);
      const std::uint64_t tm = extra ? 1 : static_cast<std::uint64_t>(rounds) + (partner ? 1 : 0);
      bytes = std::max(bytes, tb + w.bytes_sent);
      messages = std::max(messages, tm + w.messages_sent);
    }
    c += allreduce(P, 9, 8);
    c.bytes_sent = bytes;
    c.messages_sent = messages;
  }
  c.compute_elements = static_cast<double>(n);
  return c;
}

//! A tensor of the flat buffer: rows x cols (cols = 1 for a vector).
struct shape {
  std::uint64_t rows = 0, cols = 1;
  bool is_vector() const { return rows == 1 || cols == 1; }
};

//! PowerSGD of rank r: allreduces of sum rows*r_t (P factors), of the uncompressed
//! tensors and of sum cols*r_t (Q factors), r_t = min(r, rows, cols); a matrix is
//! compressed when (rows + cols) r_t * min_rate < rows * cols (PyTorch's rule, as
//! PowerCompressor). The first step adds the agreement on the layout hash and the length
//! (an allreduce of 5 int64: each with its negation, and the rejected flag).
inline step_cost powersgd(int P, std::span<const shape> layout, int r, double min_rate = 2.0, bool first_step = false,
                          allreduce_algorithm algo = allreduce_algorithm::openmpi) {
  std::uint64_t p = 0, q = 0, d = 0, n = 0;
  for (const auto& s : layout) {
    n += s.rows * s.cols;
    const std::uint64_t rt = std::min<std::uint64_t>(static_cast<std::uint64_t>(r), std::min(s.rows, s.cols));
    const double low = static_cast<double>(s.rows + s.cols) * static_cast<double>(rt);
    if (!s.is_vector() && low * min_rate < static_cast<double>(s.rows * s.cols)) {
      p += s.rows * rt;
      q += s.cols * rt;
    } else {
      d += s.rows * s.cols;
    }
  }
  step_cost c = allreduce(P, p, 4, algo) + allreduce(P, d, 4, algo) + allreduce(P, q, 4, algo);
  if (first_step) c += allreduce(P, 5, 8);
  c.compute_elements = static_cast<double>(n);
  return c;
}

//! GossipMixer's per-round agreement that every model is finite and that the ranks are at
//! the same round: one allreduce of three int64 (gossip_options::check_finite, on by
//! default). Add it to dpsgd() and
//! power_gossip() for a mixer with the default options.
inline step_cost gossip_check(int P, allreduce_algorithm algo = allreduce_algorithm::openmpi) {
  return allreduce(P, 3, 8, algo);
}

namespace detail {
//! One gossip round: a message of `bytes` to each of `degree` neighbours through this
//! rank's one link, over a model of n elements.
inline step_cost neighbour_round(int degree, std::uint64_t bytes, std::uint64_t n) {
  step_cost c;
  c.bytes_sent = static_cast<std::uint64_t>(degree) * bytes;
  c.messages_sent = static_cast<std::uint64_t>(degree);
  c.latency_rounds = degree > 0 ? 1 : 0;
  c.path_bytes = static_cast<double>(c.bytes_sent);
  c.bursts = c.latency_rounds;
  c.compute_elements = static_cast<double>(n);
  return c;
}
}  // namespace detail

//! D-PSGD on a topology where this rank has `degree` neighbours: 4n bytes to each, all
//! through the rank's one link, in one round.
inline step_cost dpsgd(int degree, std::uint64_t n) { return detail::neighbour_round(degree, 4 * n, n); }

//! PowerGossip of rank r: to each of `degree` neighbours one message of 4 (vector elements
//! + sum over matrices of cols*r) bytes in phase 0 (even steps), rows*r in phase 1.
inline step_cost power_gossip(int degree, std::span<const shape> layout, int r, int phase) {
  std::uint64_t f = 0, n = 0;
  for (const auto& s : layout) {
    n += s.rows * s.cols;
    f += s.is_vector() ? s.rows * s.cols : (phase % 2 == 0 ? s.cols : s.rows) * static_cast<std::uint64_t>(r);
  }
  return detail::neighbour_round(degree, 4 * f, n);
}

//! Local SGD (and QSR, with H its mean period): a dense parameter average every H steps.
inline step_cost local_sgd(int P, std::uint64_t n, double H) { return dense(P, n).amortised(H); }

//! Hierarchical allreduce on N nodes of M ranks (HierarchicalComm): ring reduce-scatter
//! inside each node (fast links), allreduce of each 1/M shard among the N ranks of equal
//! node rank (slow links; the node's M shards share its uplink, so the uplink carries
//! M times one shard's ring), ring allgather inside the node (fast links).
struct hierarchical_cost {
  step_cost intra;  //!< on the fast links
  step_cost inter;  //!< on the slow links
  double time(const link& fast, const link& slow, double ranks_per_core = 1) const {
    return comm_time(intra, fast, ranks_per_core) + comm_time(inter, slow, ranks_per_core);
  }
};

inline hierarchical_cost hierarchical(int N, int M, std::uint64_t n,
                                      allreduce_algorithm inter = allreduce_algorithm::openmpi) {
  detail::check_ranks(N, "hierarchical (nodes)");
  detail::check_ranks(M, "hierarchical (ranks per node)");
  hierarchical_cost h;
  h.intra = allreduce(M, n, 4, allreduce_algorithm::ring);
  h.inter = allreduce(N, wire::ring_chunk(n, M, 0), 4, inter);
  h.inter.path_bytes *= M;
  h.intra.compute_elements = static_cast<double>(n);
  return h;
}

//! A measured communication time and the model's step cost of that run (with the run's
//! ranks per core, for fit_host_link; fit_link ignores it).
struct comm_sample {
  step_cost cost;
  double seconds = 0;
  double ranks_per_core = 1;
};

//! Alpha and beta (both >= 0) of t = alpha * latency_rounds + beta * path_bytes that
//! minimise the sum of squared errors relative to max(t, floor_seconds) over the samples
//! (one network): times spanning orders of magnitude weigh alike, and times below the
//! floor (where a loaded machine's scheduling noise dominates) weigh as absolute errors.
inline link fit_link(std::span<const comm_sample> s, double floor_seconds = 0) {
  require(!s.empty(), "commpact::cost::fit_link: no samples; pass at least two measured runs.");
  require(floor_seconds >= 0, "commpact::cost::fit_link: floor_seconds = ", floor_seconds, " must be >= 0.");
  double ll = 0, lb = 0, bb = 0, lt = 0, bt = 0;
  auto scale = [&](const comm_sample& x) { return std::max(x.seconds, floor_seconds); };
  for (const auto& x : s) {
    require(x.seconds > 0, "commpact::cost::fit_link: a measured time is ", x.seconds, " s; times must be > 0.");
    // dividing each equation by its scale turns relative errors into plain residuals
    const double d = scale(x), L = x.cost.latency_rounds / d, B = x.cost.path_bytes / d, t = x.seconds / d;
    ll += L * L, lb += L * B, bb += B * B, lt += L * t, bt += B * t;
  }
  const double det = ll * bb - lb * lb;
  link l;
  if (std::abs(det) > 1e-12 * ll * bb && ll > 0 && bb > 0) {
    l.alpha = (lt * bb - bt * lb) / det;
    l.beta = (ll * bt - lb * lt) / det;
  }
  // Fall back to one parameter where the two-parameter fit is singular or negative.
  if (!(l.alpha >= 0 && l.beta >= 0)) {
    const double e_beta = bb > 0 ? bt / bb : 0, e_alpha = ll > 0 ? lt / ll : 0;
    double r_beta = 0, r_alpha = 0;
    for (const auto& x : s) {
      r_beta += std::pow((x.seconds - e_beta * x.cost.path_bytes) / scale(x), 2);
      r_alpha += std::pow((x.seconds - e_alpha * x.cost.latency_rounds) / scale(x), 2);
    }
    l = r_beta <= r_alpha ? link{0, std::max(0.0, e_beta)} : link{std::max(0.0, e_alpha), 0};
  }
  return l;
}

//! Gamma of t = gamma * compute_elements minimising the squared relative errors over
//! (cost, measured compute time) samples.
inline double fit_gamma(std::span<const comm_sample> s) {
  double ee = 0, et = 0;
  for (const auto& x : s) {
    require(x.seconds > 0, "commpact::cost::fit_gamma: a measured time is ", x.seconds, " s; times must be > 0.");
    const double e = x.cost.compute_elements / x.seconds;
    ee += e * e, et += e;
  }
  require(ee > 0, "commpact::cost::fit_gamma: no sample has compute_elements > 0; pass measured compute times.");
  return et / ee;
}

//! Relative error of the model's prediction against a measured time.
inline double relative_error(double predicted, double measured) {
  require(measured > 0, "commpact::cost::relative_error: the measured time ", measured, " must be > 0.");
  return (predicted - measured) / measured;
}

}  // namespace commpact::cost
