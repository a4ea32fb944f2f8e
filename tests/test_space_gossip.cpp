// GossipMixer over the deferred space (issue 18): D-PSGD and CHOCO-SGD with the model,
// the public copies and every message in deferred buffers, the exchange queued on
// DeferredComm<ThreadComm> until mix()'s one fence. Against the same mixer over
// ThreadComm (host_space), on Ring and Torus2D for P = 1 ... 5: the same model bits after
// every round, the same saved state and bytes; NaN on one rank raises (or skips) alike on
// every rank and changes nothing; a codec's short message raises invalid_argument on
// every rank; a malformed message raises wire_error on its receiver and changes nothing
// there; no allocation after the first round. The checks of tests/common/gossip_checks.hpp
// run over DeferredComm<CheckedComm<ThreadComm>> too.
#include <catch2/catch.hpp>
#include <commpact/comm/deferred_comm.hpp>
#include <commpact/comm/thread_comm.hpp>
#include <commpact/compress/codecs/quantizers.hpp>
#include <commpact/compress/codecs/sparsifiers.hpp>
#include <commpact/compress/codecs/topk_sign.hpp>
#include <commpact/gossip/gossip_mixer.hpp>
#include <commpact/topology/ring.hpp>
#include <commpact/topology/torus.hpp>

#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "common/checked_runs.hpp"
#include "common/gossip_checks.hpp"

using namespace commpact;
using commpact_test::rank_model;
using commpact_test::same_bits;  // tests/common/sparse_checks.hpp (space_copies.hpp defines it again)

namespace {

using DC = DeferredComm<ThreadComm>;
const tensor_layout& kLayout = commpact_test::kGossipLayout;
constexpr std::size_t kN = commpact_test::kGossipN;
const thread_options quick{std::chrono::seconds(60)};

// Copies between host vectors and deferred buffers (queued, then fenced), as
// tests/common/space_copies.hpp has them (that header cannot join gossip_checks.hpp:
// both define same_bits).
std::vector<float> host_copy(const deferred_space::exec& e, deferred_span<const float> s) {
  std::vector<float> h(s.size());
  ops<deferred_space>::to_host(e, s, std::span<float>(h));
  deferred_space::fence(e, no_deadline());
  return h;
}
deferred_space::buffer<float> device_copy(const deferred_space::exec& e, const std::vector<float>& h) {
  deferred_space::buffer<float> b;
  b.resize(h.size());
  ops<deferred_space>::from_host(e, std::span<const float>(h), b.view());
  deferred_space::fence(e, no_deadline());
  return b;
}

// A codec that writes 4 bytes less than it announces: the known-size exchange cannot
// carry it unless it is declared variable-length (then each message carries its length).
struct short_sign {
  sign_codec inner;
  std::size_t max_encoded_bytes(std::size_t n) const { return inner.max_encoded_bytes(n) + 4; }
  std::size_t encode(std::span<const float> v, std::span<std::byte> msg, std::span<float> approx) {
    return inner.encode(v, msg, approx);
  }
  void decode_add(std::span<const std::byte> msg, std::span<float> acc) const { inner.decode_add(msg, acc); }
};
struct framed_short_sign : short_sign {};
}  // namespace
namespace commpact {
template <>
struct variable_length_codec<framed_short_sign> : std::true_type {};
}  // namespace commpact
namespace {

// sign_codec whose decode on one rank (bad_rank) rejects every message.
struct picky_sign {
  sign_codec inner;
  int rank = -1, bad_rank = -1;
  void bind_rank(int r) { rank = r; }
  std::size_t max_encoded_bytes(std::size_t n) const { return inner.max_encoded_bytes(n); }
  std::size_t encode(std::span<const float> v, std::span<std::byte> msg, std::span<float> approx) {
    return inner.encode(v, msg, approx);
  }
  void decode_add(std::span<const std::byte> msg, std::span<float> acc) const {
    if (rank == bad_rank) throw wire_error("picky_sign: this rank rejects the message");
    inner.decode_add(msg, acc);
  }
};

std::vector<std::byte> saved(const auto& m) {
  std::vector<std::byte> b;
  m.save_state(b);
  return b;
}

// What one rank saw, asserted on the main thread.
struct seen {
  std::string failures;
  void expect(bool ok, const std::string& what) {
    if (!ok) failures += what + "; ";
  }
};

// `rounds` mix() calls of the same mixer over ThreadComm and over DC on the same models:
// bits after every round, one fence per deferred mix(), the state and the bytes; the
// workspace does not move after the first round.
template <class Topo, class Mode>
void twin_rounds(ThreadComm& comm, Mode mode, int rounds, seen& s, const char* name) {
  const int P = comm.size();
  DC dc{comm};
  GossipMixer<Topo, Mode, ThreadComm> h{comm, Topo(P), kLayout, mode};
  GossipMixer<Topo, Mode, DC> d{dc, Topo(P), kLayout, mode};
  auto x = rank_model(comm.rank(), 11);
  auto xd = device_copy(dc.exec(), x);
  std::vector<std::pair<const void*, std::size_t>> sig_h, sig_d;
  for (int r = 0; r < rounds; ++r) {
    const bool mh = h.mix(std::span<float>(x));
    const auto fences = dc.exec().q->fences;
    const bool md = d.mix(xd.view());
    // One fence per round; the first mix() agrees on the setup first (a control-plane
    // allreduce on host memory, which fences the empty queue).
    s.expect(dc.exec().q->fences == fences + (r == 0 ? 2 : 1) && dc.exec().pending() == 0,
             std::string(name) + ": not one fence per mix()");
    s.expect(mh && md, std::string(name) + ": a round was skipped");
    s.expect(same_bits(x, host_copy(dc.exec(), xd.cview())), std::string(name) + ": round " + std::to_string(r) +
                                                                 " differs from host_space");
    if (r == 0) sig_h = h.workspace_signature(), sig_d = d.workspace_signature();
  }
  s.expect(saved(h) == saved(d), std::string(name) + ": saved states differ");
  s.expect(h.stats().bytes_sent == d.stats().bytes_sent && h.stats().messages_sent == d.stats().messages_sent &&
               d.stats().bytes_sent == static_cast<std::uint64_t>(rounds) * d.neighbors().size() * d.message_bytes(),
           std::string(name) + ": bytes differ");
  s.expect(!sig_d.empty() && sig_h == h.workspace_signature() && sig_d == d.workspace_signature(),
           std::string(name) + ": the workspace moved after the first round");
}

}  // namespace

TEST_CASE("GossipMixer over the deferred space equals host_space bit for bit (D-PSGD, CHOCO; ring, torus)",
          "[space][gossip]") {
  const int P = GENERATE(1, 2, 3, 4, 5);
  CAPTURE(P);
  std::vector<seen> out(P);
  run_threads(
      P,
      [&](ThreadComm& comm) {
        auto& s = out[comm.rank()];
        twin_rounds<Ring>(comm, exact_mixing{}, 4, s, "D-PSGD ring");
        twin_rounds<Torus2D>(comm, exact_mixing{}, 4, s, "D-PSGD torus");
        twin_rounds<Ring>(comm, choco_gossip<topk_codec>{topk_codec{0.1}, 0.3}, 4, s, "CHOCO top-k ring");
        twin_rounds<Torus2D>(comm, choco_gossip<topk_codec>{topk_codec{0.05}, 0.3}, 4, s, "CHOCO top-k torus");
        twin_rounds<Torus2D>(comm, choco_gossip<sign_codec>{{}, 0.3}, 4, s, "CHOCO sign torus");
        twin_rounds<Ring>(comm, choco_gossip<qsgd_codec>{qsgd_codec{16, 3}, 0.4}, 4, s, "CHOCO QSGD ring");
        // Variable-length: each message carries its length (4 bytes more per edge).
        twin_rounds<Ring>(comm, choco_gossip<threshold_codec>{threshold_codec{0.5f, 0.05}, 0.4}, 4, s,
                          "CHOCO threshold ring");
      },
      quick);
  for (int r = 0; r < P; ++r) {
    INFO("rank " << r << ": " << out[r].failures);
    CHECK(out[r].failures.empty());
  }
}

TEST_CASE("GossipMixer over the deferred space: NaN on one rank raises or skips on every rank, changes nothing",
          "[space][gossip][transactional]") {
  const int P = GENERATE(2, 3, 5);
  const bool skip = GENERATE(false, true);
  CAPTURE(P, skip);
  const gossip_options opt{.on_nonfinite = skip ? nonfinite::skip_step : nonfinite::raise};
  std::vector<seen> out(P);
  run_threads(
      P,
      [&](ThreadComm& comm) {
        auto& s = out[comm.rank()];
        const int bad = 1 % P;
        auto run = [&]<class Mode>(Mode mode, const char* name) {
          DC dc{comm};
          GossipMixer<Ring, Mode, ThreadComm> h{comm, Ring(P), kLayout, mode, opt};
          GossipMixer<Ring, Mode, DC> d{dc, Ring(P), kLayout, mode, opt};
          auto x = rank_model(comm.rank(), 3);
          auto xd = device_copy(dc.exec(), x);
          h.mix(std::span<float>(x));
          d.mix(xd.view());
          // Round 2: rank `bad` holds a NaN (both spaces).
          auto y = x;
          if (comm.rank() == bad) y[5] = std::numeric_limits<float>::quiet_NaN();
          auto yd = device_copy(dc.exec(), y);
          const auto before_h = saved(h), before_d = saved(d);
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
          const std::string tag = std::string(name) + (skip ? " skip" : " raise");
          s.expect(got_h == (skip ? 2 : 1) && got_d == got_h, tag + ": host " + std::to_string(got_h) +
                                                                  ", deferred " + std::to_string(got_d));
          s.expect(what_h == what_d, tag + ": messages differ: " + what_h + " | " + what_d);
          if (!skip)
            s.expect(what_d.find(comm.rank() == bad ? "rank " + std::to_string(bad) + " (index 5)" : "another rank") !=
                         std::string::npos,
                     tag + ": message " + what_d);
          s.expect(same_bits(y, host_copy(dc.exec(), yd.cview())), tag + ": the deferred model differs");
          auto y0 = x;
          if (comm.rank() == bad) y0[5] = std::numeric_limits<float>::quiet_NaN();
          s.expect(std::memcmp(y.data(), y0.data(), 4 * kN) == 0, tag + ": the model changed");
          const auto after_d = saved(d);
          // The counters advance by one skipped round under skip_step; nothing else moves.
          s.expect(skip ? d.stats().steps == stats_d.steps + 1 && d.stats().skipped == 1
                        : after_d == before_d && saved(h) == before_h,
                   tag + ": the state changed");
          s.expect(d.stats().bytes_sent == stats_d.bytes_sent, tag + ": a failed round counted bytes");
          // The next good round still agrees bit for bit.
          h.mix(std::span<float>(x));
          d.mix(xd.view());
          s.expect(same_bits(x, host_copy(dc.exec(), xd.cview())), tag + ": the next round differs");
        };
        run(exact_mixing{}, "D-PSGD");
        run(choco_gossip<topk_codec>{topk_codec{0.1}, 0.3}, "CHOCO top-k");
      },
      quick);
  for (int r = 0; r < P; ++r) {
    INFO("rank " << r << ": " << out[r].failures);
    CHECK(out[r].failures.empty());
  }
}

TEST_CASE("GossipMixer over a space: a codec's short message raises on every rank; declared variable, it travels",
          "[space][gossip][errors]") {
  const int P = 3;
  std::vector<seen> out(P);
  run_threads(
      P,
      [&](ThreadComm& comm) {
        auto& s = out[comm.rank()];
        DC dc{comm};
        GossipMixer<Ring, short_sign, DC> d{dc, Ring(P), kLayout};
        auto x = rank_model(comm.rank(), 5);
        auto xd = device_copy(dc.exec(), x);
        std::string what;
        try {
          d.mix(xd.view());
        } catch (const invalid_argument& e) {
          what = e.what();
        }
        s.expect(what.find("variable_length_codec") != std::string::npos, "no invalid_argument naming the fix: " + what);
        s.expect(same_bits(x, host_copy(dc.exec(), xd.cview())) && d.stats().steps == 0, "the round changed something");
        // Declared variable-length: the same rounds on both spaces, 4 + max bytes per edge.
        twin_rounds<Ring>(comm, framed_short_sign{}, 3, s, "framed short codec");
        GossipMixer<Ring, framed_short_sign, DC> f{dc, Ring(P), kLayout};
        s.expect(f.message_bytes() == 4 + 4 + sign_codec{}.max_encoded_bytes(kN), "framed message bytes");
      },
      quick);
  for (int r = 0; r < P; ++r) {
    INFO("rank " << r << ": " << out[r].failures);
    CHECK(out[r].failures.empty());
  }
}

TEST_CASE("GossipMixer over a space: a malformed message raises wire_error on its receiver and changes nothing there",
          "[space][gossip][errors]") {
  const int P = 3;
  std::vector<seen> out(P);
  run_threads(
      P,
      [&](ThreadComm& comm) {
        auto& s = out[comm.rank()];
        DC dc{comm};
        picky_sign codec;
        codec.bad_rank = 1;
        GossipMixer<Ring, picky_sign, DC> d{dc, Ring(P), kLayout, codec};
        auto x = rank_model(comm.rank(), 5);
        auto xd = device_copy(dc.exec(), x);
        const auto before = saved(d);
        std::string what;
        bool mixed = false;
        try {
          mixed = d.mix(xd.view());
        } catch (const wire_error& e) {
          what = e.what();
        }
        const auto now = host_copy(dc.exec(), xd.cview());
        if (comm.rank() == 1) {
          s.expect(what.find("picky_sign") != std::string::npos && what.find("from rank 0") != std::string::npos,
                   "message: " + what);
          s.expect(same_bits(x, now) && saved(d) == before && d.stats().steps == 0 && d.stats().bytes_sent == 0,
                   "the failed round changed something");
        } else {
          s.expect(mixed && what.empty() && !same_bits(x, now), "the other ranks mix: " + what);
        }
      },
      quick);
  for (int r = 0; r < P; ++r) {
    INFO("rank " << r << ": " << out[r].failures);
    CHECK(out[r].failures.empty());
  }
}

TEST_CASE("gossip checks over DeferredComm<CheckedComm<ThreadComm>>: average, contraction, bad input",
          "[space][gossip]") {
  using DCC = DeferredComm<commpact_test::checked_thread_comm>;
  const int P = GENERATE(1, 2, 3, 4, 5);
  CAPTURE(P);
  REQUIRE_NOTHROW(commpact_test::run_checked_threads(
      P,
      [&](commpact_test::checked_thread_comm& c) {
        DCC comm{c};
        commpact_test::check_average_preserved_all_modes(comm);
        commpact_test::check_dpsgd_contraction(comm, 6);
        commpact_test::check_gossip_topology_size(comm);
        commpact_test::check_gossip_mixer_mismatch(comm);
      },
      quick));
}
