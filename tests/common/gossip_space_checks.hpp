#pragma once
// GossipMixer over the deferred space against host_space, written once over any host
// point-to-point communicator C: the same mixer over C and over DeferredComm<C> (model,
// public copies and messages in deferred buffers, the round queued until mix()'s one
// fence) on the same models. Run from tests/test_space_gossip.cpp (ThreadComm) and
// tests/mpi/test_gossip_mpi.cpp (MpiComm). Failures are collected in a verdict and
// settled on every rank (tests/common/sparse_checks.hpp).
#include <commpact/comm/deferred_comm.hpp>
#include <commpact/compress/codecs/quantizers.hpp>
#include <commpact/compress/codecs/sparsifiers.hpp>
#include <commpact/compress/codecs/topk_sign.hpp>
#include <commpact/gossip/gossip_mixer.hpp>
#include <commpact/kernels/deferred/ops.hpp>
#include <commpact/topology/ring.hpp>
#include <commpact/topology/torus.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "gossip_checks.hpp"
#include "space_copies.hpp"

namespace commpact_test {

template <class M>
std::vector<std::byte> gossip_saved(const M& m) {
  std::vector<std::byte> b;
  m.save_state(b);
  return b;
}

//! The bytes one round r sends to each neighbour, from the layout: PowerGossip<R>
//! alternates m x r (even rounds) and n x r (odd rounds) projections per matrix, r =
//! min(R, n, m), plus every vector; another mode sends message_bytes() every round.
template <class Mode, class M>
std::uint64_t gossip_expected_round_bytes(const M& mixer, int round) {
  if constexpr (commpact::detail::is_power_gossip<Mode>::value) {
    std::uint64_t f = 0;
    for (const auto& s : mixer.layout()) {
      const auto n = static_cast<std::uint64_t>(s.rows), m = static_cast<std::uint64_t>(s.cols);
      const std::uint64_t r = std::min<std::uint64_t>(Mode::rank, std::min(n, m));
      f += s.is_vector() ? n * m : (round % 2 == 0 ? m : n) * r;
    }
    return 4 * f;
  } else {
    return mixer.message_bytes();
  }
}

//! `rounds` mix() calls of the same mixer over C and over DeferredComm<C> on the same
//! models: the same bits after every round, one fence per deferred mix() (two at the
//! first: the setup's agreement fences the empty queue), the same saved state and
//! bytes, and a workspace that does not move after the first round. `same_model`:
//! every rank starts from rank 0's model (PowerGossip: every difference is zero, so
//! every round redraws the shared factors from the edge seeds).
template <class Topo, class Mode, class C>
void gossip_twin_rounds(C& comm, Mode mode, int rounds, verdict& v, const char* name, bool same_model = false) {
  using namespace commpact;
  using DC = DeferredComm<C>;
  const int P = comm.size();
  DC dc{comm};
  GossipMixer<Topo, Mode, C> h{comm, Topo(P), kGossipLayout, mode};
  GossipMixer<Topo, Mode, DC> d{dc, Topo(P), kGossipLayout, mode};
  auto x = rank_model(same_model ? 0 : comm.rank(), 11);
  const auto x0 = x;
  auto xd = device_copy(dc.exec(), x);
  std::vector<std::pair<const void*, std::size_t>> sig_h, sig_d;
  std::uint64_t expected_bytes = 0;
  for (int r = 0; r < rounds; ++r) {
    const bool mh = h.mix(std::span<float>(x));
    const auto fences = dc.exec().q->fences;
    const bool md = d.mix(xd.view());
    v.expect(dc.exec().q->fences == fences + (r == 0 ? 2 : 1) && dc.exec().pending() == 0, name,
             ": not one fence per mix() at round ", r);
    v.expect(mh && md, name, ": round ", r, " was skipped");
    v.expect(same_bits(x, host_copy(dc.exec(), xd.cview())), name, ": round ", r, " differs from host_space");
    if (r == 0) sig_h = h.workspace_signature(), sig_d = d.workspace_signature();
    expected_bytes += d.neighbors().size() * gossip_expected_round_bytes<Mode>(d, r);
  }
  if (P > 1 && !same_model) v.expect(!same_bits(x, x0), name, ": the model did not move");
  v.expect(gossip_saved(h) == gossip_saved(d), name, ": the saved states differ");
  v.expect(h.stats().bytes_sent == d.stats().bytes_sent && h.stats().messages_sent == d.stats().messages_sent &&
               d.stats().bytes_sent == expected_bytes,
           name, ": bytes ", d.stats().bytes_sent, " (host ", h.stats().bytes_sent, ")");
  v.expect(!sig_d.empty() && sig_h == h.workspace_signature() && sig_d == d.workspace_signature(), name,
           ": the workspace moved after the first round");
}

//! D-PSGD, CHOCO (top-k, sign, QSGD, and threshold, whose messages carry their length)
//! and PowerGossip (ranks 1 and 2, gamma 1 and 0.6; 5 rounds, so both phases and the
//! warm start; and models that agree, so the zero factors are redrawn) on Ring and
//! Torus2D: deferred equals host bit for bit over every round.
template <class C>
void check_gossip_deferred_twins(C& comm) {
  using namespace commpact;
  verdict v;
  gossip_twin_rounds<Ring>(comm, exact_mixing{}, 4, v, "D-PSGD ring");
  gossip_twin_rounds<Torus2D>(comm, exact_mixing{}, 4, v, "D-PSGD torus");
  gossip_twin_rounds<Ring>(comm, choco_gossip<topk_codec>{topk_codec{0.1}, 0.3}, 4, v, "CHOCO top-k ring");
  gossip_twin_rounds<Torus2D>(comm, choco_gossip<topk_codec>{topk_codec{0.05}, 0.3}, 4, v, "CHOCO top-k torus");
  gossip_twin_rounds<Torus2D>(comm, choco_gossip<sign_codec>{{}, 0.3}, 4, v, "CHOCO sign torus");
  gossip_twin_rounds<Ring>(comm, choco_gossip<qsgd_codec>{qsgd_codec{16, 3}, 0.4}, 4, v, "CHOCO QSGD ring");
  gossip_twin_rounds<Ring>(comm, choco_gossip<threshold_codec>{threshold_codec{0.5f, 0.05}, 0.4}, 4, v,
                           "CHOCO threshold ring");
  gossip_twin_rounds<Ring>(comm, power_gossip<1>{}, 5, v, "PowerGossip r1 ring");
  gossip_twin_rounds<Torus2D>(comm, power_gossip<1>{0.6, 7}, 5, v, "PowerGossip r1 torus");
  gossip_twin_rounds<Ring>(comm, power_gossip<2>{0.6, 7}, 5, v, "PowerGossip r2 ring");
  gossip_twin_rounds<Torus2D>(comm, power_gossip<2>{}, 5, v, "PowerGossip r2 torus");
  gossip_twin_rounds<Ring>(comm, power_gossip<2>{}, 3, v, "PowerGossip r2 ring, equal models", true);
  gossip_twin_rounds<Torus2D>(comm, power_gossip<1>{}, 3, v, "PowerGossip r1 torus, equal models", true);
  settle(comm, v, "check_gossip_deferred_twins");
}

//! One good round, then rank 1 % P holds a NaN: over C and DeferredComm<C> every rank
//! raises numeric_error with the same message (naming the rank and index on that rank,
//! "another rank" elsewhere) or, under skip_step, returns false; the model, the state and
//! the bytes are unchanged (skip_step: one more skipped round); the next good round
//! agrees bit for bit. D-PSGD, CHOCO top-k and PowerGossip r2 on Ring. Needs P >= 2.
template <class C>
void check_gossip_deferred_nonfinite(C& comm) {
  using namespace commpact;
  using DC = DeferredComm<C>;
  const int P = comm.size();
  if (P < 2) return;
  const int bad = 1 % P;
  verdict v;
  auto run = [&]<class Mode>(Mode mode, bool skip, const char* name) {
    const gossip_options opt{.on_nonfinite = skip ? nonfinite::skip_step : nonfinite::raise};
    DC dc{comm};
    GossipMixer<Ring, Mode, C> h{comm, Ring(P), kGossipLayout, mode, opt};
    GossipMixer<Ring, Mode, DC> d{dc, Ring(P), kGossipLayout, mode, opt};
    auto x = rank_model(comm.rank(), 3);
    auto xd = device_copy(dc.exec(), x);
    h.mix(std::span<float>(x));
    d.mix(xd.view());
    auto y = x;
    if (comm.rank() == bad) y[5] = std::numeric_limits<float>::quiet_NaN();
    const auto y0 = y;
    auto yd = device_copy(dc.exec(), y);
    const auto before_h = gossip_saved(h), before_d = gossip_saved(d);
    const auto stats_d = d.stats();
    std::string what_h, what_d;
    int got_h = 0, got_d = 0;
    try {
      got_h = h.mix(std::span<float>(y)) ? 0 : 2;
    } catch (const numeric_error& e) {
      got_h = 1, what_h = e.what();
    }
    try {
      got_d = d.mix(yd.view()) ? 0 : 2;
    } catch (const numeric_error& e) {
      got_d = 1, what_d = e.what();
    }
    const char* how = skip ? " skip_step" : " raise";
    v.expect(got_h == (skip ? 2 : 1) && got_d == got_h, name, how, ": host ", got_h, ", deferred ", got_d);
    v.expect(what_h == what_d, name, how, ": the messages differ: ", what_h, " | ", what_d);
    if (!skip)
      v.expect(what_d.find(comm.rank() == bad ? "rank " + std::to_string(bad) + " (index 5)" : "another rank") !=
                   std::string::npos,
               name, how, ": message ", what_d);
    v.expect(std::memcmp(y.data(), y0.data(), 4 * y.size()) == 0 &&
                 same_bits(y, host_copy(dc.exec(), yd.cview())),
             name, how, ": the model changed");
    v.expect(skip ? d.stats().steps == stats_d.steps + 1 && d.stats().skipped == 1
                  : gossip_saved(d) == before_d && gossip_saved(h) == before_h,
             name, how, ": the state changed");
    v.expect(d.stats().bytes_sent == stats_d.bytes_sent, name, how, ": a failed round counted bytes");
    h.mix(std::span<float>(x));
    d.mix(xd.view());
    v.expect(same_bits(x, host_copy(dc.exec(), xd.cview())), name, how, ": the next round differs");
  };
  for (bool skip : {false, true}) {
    run(exact_mixing{}, skip, "D-PSGD");
    run(choco_gossip<topk_codec>{topk_codec{0.1}, 0.3}, skip, "CHOCO top-k");
    run(power_gossip<2>{}, skip, "PowerGossip r2");
  }
  settle(comm, v, "check_gossip_deferred_nonfinite");
}

}  // namespace commpact_test
