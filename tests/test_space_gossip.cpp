// GossipMixer over the deferred space: D-PSGD, CHOCO-SGD and PowerGossip with
// the model, the public copies, the shared factors and every message in deferred buffers, the exchange queued on
// DeferredComm<ThreadComm> until mix()'s one fence. Against the same mixer over
// ThreadComm (host_space), on Ring and Torus2D for P = 1 ... 5: the same model bits after
// every round, the same saved state and bytes; NaN on one rank raises (or skips) alike on
// every rank and changes nothing; a codec's short message raises invalid_argument on
// every rank; a malformed message raises wire_error on its receiver and changes nothing
// there; no allocation after the first round. The comparisons with host_space are
// written once in tests/common/gossip_space_checks.hpp (run under MPI too), and the
// checks of tests/common/gossip_checks.hpp run over DeferredComm<CheckedComm<ThreadComm>>.
// commpact-standalone: it specialises commpact::variable_length_codec (COMMPACT_TESTS_UNITY)
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
#include "common/gossip_space_checks.hpp"

using namespace commpact;
using commpact_test::rank_model;
using commpact_test::same_bits;
using commpact_test::device_copy;
using commpact_test::host_copy;
using commpact_test::gossip_saved;

namespace {

using DC = DeferredComm<ThreadComm>;
const tensor_layout& kLayout = commpact_test::kGossipLayout;
constexpr std::size_t kN = commpact_test::kGossipN;
const thread_options quick{std::chrono::seconds(60)};

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

// What one rank saw, asserted on the main thread.
struct seen {
  std::string failures;
  void expect(bool ok, const std::string& what) {
    if (!ok) failures += what + "; ";
  }
};

}  // namespace

TEST_CASE("GossipMixer over the deferred space equals host_space bit for bit (D-PSGD, CHOCO, PowerGossip; ring, torus)",
          "[space][gossip]") {
  const int P = GENERATE(1, 2, 3, 4, 5);
  CAPTURE(P);
  REQUIRE_NOTHROW(commpact_test::run_checked_threads(
      P, [&](commpact_test::checked_thread_comm& comm) { commpact_test::check_gossip_deferred_twins(comm); }, quick));
}

TEST_CASE("GossipMixer over the deferred space: NaN on one rank raises or skips on every rank, changes nothing",
          "[space][gossip][transactional]") {
  const int P = GENERATE(2, 3, 5);
  CAPTURE(P);
  REQUIRE_NOTHROW(commpact_test::run_checked_threads(
      P, [&](commpact_test::checked_thread_comm& comm) { commpact_test::check_gossip_deferred_nonfinite(comm); },
      quick));
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
        commpact_test::verdict v;
        commpact_test::gossip_twin_rounds<Ring>(comm, framed_short_sign{}, 3, v, "framed short codec");
        s.expect(v.failures == 0, v.first);
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
        const auto before = gossip_saved(d);
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
          s.expect(same_bits(x, now) && gossip_saved(d) == before && d.stats().steps == 0 && d.stats().bytes_sent == 0,
                   "the failed round changed something");
        } else {
          s.expect(mixed && what.empty() && !same_bits(x, now), "the other ranks mix: " + what);
        }
        // The receiver did not count its round: at the next one every rank raises.
        std::string next;
        try {
          d.mix(xd.view());
        } catch (const mismatch_error& e) {
          next = e.what();
        }
        s.expect(next.find("different rounds (from 0 to 1") != std::string::npos, "the next round: " + next);
        s.expect(same_bits(now, host_copy(dc.exec(), xd.cview())), "the next round changed the model");
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
        commpact_test::check_power_gossip_contraction(comm, 6);
        commpact_test::check_gossip_topology_size(comm);
        commpact_test::check_gossip_mixer_mismatch(comm);
        commpact_test::check_gossip_length_mismatch(comm);
        commpact_test::check_gossip_restored_alone(comm);
      },
      quick));
}
