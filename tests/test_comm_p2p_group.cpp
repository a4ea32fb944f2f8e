// SPDX-License-Identifier: Apache-2.0
// Grouped point-to-point (comm/known_size.hpp's `grouped` and `p2p_group`): a
// host stand-in for NcclComm's ncclGroupStart/End. grouped_comm wraps a ThreadComm and
// posts the known-size sends and receives of a group only when the outermost group ends
// (every send, then every receive), so a receive's bytes are not there before the group
// ends, a send reads its buffer at the end, and a receive buffer is poisoned when it is
// posted: an algorithm that reads a receive inside its group, writes a buffer a send of
// the group still reads, or overlaps two buffers of a group gets wrong bits. It counts
// the groups and the known-size calls made outside any group.
// - the wrapper calls group_begin/group_end when the communicator has them (and the
//   decorators forward them), does nothing otherwise, and closes a group on an exception;
// - OkTopK (SparseReduceScatter) over grouped_comm and over DeferredComm<grouped_comm>
//   equals OkTopK over ThreadComm bit for bit (outputs, residuals, regions, theta) for
//   P = 1..5, every known-size call inside a group, 2P groups per step (each all-to-all
//   and each ring round);
// - GossipMixer (D-PSGD, CHOCO top-k, PowerGossip) and CastAllreduce's ring likewise.

#include <catch2/catch.hpp>
#include <commpact/comm/checked_comm.hpp>
#include <commpact/comm/counting_comm.hpp>
#include <commpact/comm/deferred_comm.hpp>
#include <commpact/comm/known_size.hpp>
#include <commpact/comm/thread_comm.hpp>
#include <commpact/comm/tree_comm.hpp>
#include <commpact/compress/codecs/sparsifiers.hpp>
#include <commpact/compress/compressors/cast_allreduce.hpp>
#include <commpact/compress/compressors/oktopk.hpp>
#include <commpact/gossip/gossip_mixer.hpp>
#include <commpact/topology/ring.hpp>
#include <commpact/topology/torus.hpp>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string_view>
#include <vector>

#include "common/space_copies.hpp"

using namespace commpact;
using namespace commpact_test::deferred_twins;

namespace {

//! What a grouped_comm saw (shared by its copies: one per rank).
struct group_log {
  int depth = 0;
  std::uint64_t begins = 0, groups = 0;    // group_begin calls; outermost groups closed
  std::uint64_t grouped = 0, ungrouped = 0;  // known-size calls inside / outside a group
  std::uint64_t collectives_in_group = 0;
  struct pending {
    bool send;
    int peer;
    std::span<const std::byte> out;
    std::span<std::byte> in;
  };
  std::vector<pending> posted;
};

//! A ThreadComm whose known-size calls are grouped as NCCL groups them (see the file comment).
class grouped_comm {
 public:
  explicit grouped_comm(ThreadComm c) : c_(std::move(c)), log_(std::make_shared<group_log>()) {}

  int rank() const { return c_.rank(); }
  int size() const { return c_.size(); }
  template <class T>
  void allreduce(std::span<T> d, reduce_op op = reduce_op::sum) {
    collective();
    c_.allreduce(d, op);
  }
  template <class T>
  void allgather(std::span<const T> in, std::span<T> out) {
    collective();
    c_.allgather(in, out);
  }
  template <class T>
  void broadcast(std::span<T> d, int root) {
    collective();
    c_.broadcast(d, root);
  }
  void barrier() {
    collective();
    c_.barrier();
  }
  void abort(std::string_view why) { c_.abort(why); }
  void send(int peer, std::span<const std::byte> m) { c_.send(peer, m); }
  void recv(int peer, std::vector<std::byte>& b) { c_.recv(peer, b); }
  void sendrecv(int peer, std::span<const std::byte> m, std::vector<std::byte>& b) { c_.sendrecv(peer, m, b); }

  void send_known(int peer, std::span<const std::byte> out) {
    if (log_->depth == 0) {
      ++log_->ungrouped;
      commpact::send_known(c_, peer, out);
      return;
    }
    ++log_->grouped;
    log_->posted.push_back({true, peer, out, {}});
  }
  void recv_known(int peer, std::span<std::byte> in) {
    if (log_->depth == 0) {
      ++log_->ungrouped;
      commpact::recv_known(c_, peer, in);
      return;
    }
    ++log_->grouped;
    std::fill(in.begin(), in.end(), std::byte{0xA5});  // nothing may read it before the group ends
    log_->posted.push_back({false, peer, {}, in});
  }
  void group_begin() {
    ++log_->depth;
    ++log_->begins;
  }
  void group_end() {
    if (log_->depth == 0) throw invalid_argument("grouped_comm::group_end: no open group");
    if (--log_->depth > 0) return;
    ++log_->groups;
    auto posted = std::move(log_->posted);
    log_->posted.clear();
    for (const auto& p : posted)
      if (p.send) commpact::send_known(c_, p.peer, p.out);
    for (const auto& p : posted)
      if (!p.send) commpact::recv_known(c_, p.peer, p.in);
  }

  const group_log& log() const { return *log_; }
  void reset_log() { *log_ = {}; }

 private:
  void collective() {
    if (log_->depth) ++log_->collectives_in_group;
  }
  ThreadComm c_;
  std::shared_ptr<group_log> log_;
};

static_assert(PointToPoint<grouped_comm>);
static_assert(req::has_p2p_group<grouped_comm>);
static_assert(!req::has_p2p_group<ThreadComm>);
static_assert(!req::has_p2p_group<DeferredComm<ThreadComm>>);
static_assert(!req::has_p2p_group<CountingComm<ThreadComm>>);
static_assert(req::has_p2p_group<DeferredComm<grouped_comm>>);
static_assert(req::has_p2p_group<CountingComm<grouped_comm>>);
static_assert(req::has_p2p_group<CheckedComm<grouped_comm>>);
static_assert(req::has_p2p_group<TreeComm<grouped_comm>>);

using DG = DeferredComm<grouped_comm>;

std::vector<float> ok_grad(int step, int rank, std::size_t n) {
  auto g = normal(7919 * step + rank, n);
  for (std::size_t i = 0; i < n; ++i) g[i] *= (i % 97 < 20 ? 3.f : 1.f);
  return g;
}
template <class A, class B>
bool same_oktopk_state(const A& a, const B& b, std::span<const float> b_residual) {
  return same_bits(std::vector<float>(a.residual().begin(), a.residual().end()),
                   std::vector<float>(b_residual.begin(), b_residual.end())) &&
         std::vector<std::int64_t>(a.bounds().begin(), a.bounds().end()) ==
             std::vector<std::int64_t>(b.bounds().begin(), b.bounds().end()) &&
         std::bit_cast<std::uint32_t>(a.theta()) == std::bit_cast<std::uint32_t>(b.theta());
}

}  // namespace

TEST_CASE("grouped() calls group_begin/group_end when the communicator has them, nothing otherwise",
          "[comm][p2p_group]") {
  std::vector<int> ok(2, 0);
  run_threads(2, [&](ThreadComm& tc) {
    bool good = true;
    auto expect = [&](bool c) { good = good && c; };
    grouped_comm g{tc};
    const int peer = 1 - tc.rank();
    std::vector<std::byte> out(24, std::byte(tc.rank() + 1)), in(24);
    grouped(g, [&] {
      send_known(g, peer, std::span<const std::byte>(out));
      recv_known(g, peer, std::span<std::byte>(in));
      expect(g.log().depth == 1 && in[0] == std::byte{0xA5});  // posted, not received yet
    });
    expect(g.log().depth == 0 && g.log().groups == 1 && g.log().grouped == 2 && g.log().ungrouped == 0);
    expect(std::all_of(in.begin(), in.end(), [&](std::byte b) { return b == std::byte(peer + 1); }));

    // Nested groups post at the outermost end; the decorators forward the group.
    CountingComm<grouped_comm> counted{g};
    CheckedComm<grouped_comm> checked{g};
    TreeComm<grouped_comm> tree{g};
    p2p_group outer(counted);
    {
      p2p_group a(checked);
      p2p_group b(tree);
      expect(g.log().depth == 3);
      b.end();
      a.end();
    }
    expect(g.log().depth == 1);
    outer.end();
    outer.end();  // a second end() does nothing
    expect(g.log().depth == 0 && g.log().groups == 2);

    // An exception inside the group: the destructor closes it, the exception goes on.
    bool thrown = false;
    try {
      grouped(g, [&] { throw std::runtime_error("inside"); });
    } catch (const std::runtime_error&) {
      thrown = true;
    }
    expect(thrown && g.log().depth == 0 && g.log().groups == 3);

    // A communicator without groups: the calls run where they are written.
    std::fill(in.begin(), in.end(), std::byte{0});
    grouped(tc, [&] {
      send_known(tc, peer, std::span<const std::byte>(out));
      recv_known(tc, peer, std::span<std::byte>(in));
      expect(in[0] == std::byte(peer + 1));
    });
    ok[tc.rank()] = good;
  });
  CHECK(ok[0] == 1);
  CHECK(ok[1] == 1);
}

TEST_CASE("DeferredComm queues a group around its calls: they run, grouped, at the fence", "[comm][p2p_group][space]") {
  const int P = 3;
  std::vector<int> ok(P, 0);
  run_threads(P, [&](ThreadComm& tc) {
    using K = ops<deferred_space>;
    grouped_comm g{tc};
    DG d{g};
    const auto e = d.exec();
    const int r = tc.rank();
    const std::vector<std::byte> h(16, std::byte(r + 1));
    std::vector<std::byte> got(16);
    deferred_space::buffer<std::byte> out, in;
    out.resize(16), in.resize(16);
    K::from_host(e, std::span<const std::byte>(h), out.view());
    grouped(d, [&] {
      send_known(d, (r + 1) % P, out.cview());
      recv_known(d, (r + P - 1) % P, in.view());
    });
    bool good = g.log().begins == 0;  // queued, not run
    K::to_host(e, in.cview(), std::span<std::byte>(got));
    deferred_space::fence(e, no_deadline());
    good = good && g.log().groups == 1 && g.log().grouped == 2 && g.log().ungrouped == 0;
    good = good && got == std::vector<std::byte>(16, std::byte((r + P - 1) % P + 1));
    ok[r] = good;
  });
  for (int r = 0; r < P; ++r) CHECK(ok[r] == 1);
}

TEST_CASE("OkTopK over a grouping communicator: every send and receive in a group, the same bits as ThreadComm",
          "[comm][p2p_group][oktopk]") {
  const int P = GENERATE(1, 2, 3, 4, 5);
  const std::size_t n = 1500;
  const int steps = 7;
  CAPTURE(P);
  std::vector<int> ok(P, 0);
  run_threads(P, [&](ThreadComm& tc) {
    const oktopk_options o{.density = 0.03, .period = 3};
    grouped_comm gc{tc};
    OkTopK<ThreadComm> h{tc, o};
    OkTopK<grouped_comm> g{gc, o};
    OkTopK<DG> d{DG{gc}, o};
    const auto e = d.comm().exec();
    bool good = true, moved = false;
    for (int step = 0; step < steps; ++step) {
      auto gh = ok_grad(step, tc.rank(), n);
      auto gg = gh;
      auto gd = device_copy(e, gh);
      good = good && h.reduce(std::span<float>(gh)) && g.reduce(std::span<float>(gg)) && d.reduce(gd.view());
      good = good && same_bits(gh, gg) && same_bits(gh, host_copy(e, gd.cview()));
      good = good && same_oktopk_state(h, g, g.residual());
      good = good && same_oktopk_state(h, d, host_copy(e, d.residual()));
      moved = moved || (P > 1 && h.bounds()[1] != std::int64_t(n) / P);
    }
    const auto& log = gc.log();
    // Two OkTopKs over it, `steps` steps each: 2 all-to-alls and 2 (P - 1) ring rounds a step.
    good = good && log.ungrouped == 0 && log.collectives_in_group == 0 && log.depth == 0;
    good = good && log.groups == std::uint64_t(2 * steps) * std::uint64_t(2 * P);
    good = good && (P == 1 || (moved && log.grouped >= std::uint64_t(2 * steps) * std::uint64_t(4 * (P - 1))));
    ok[tc.rank()] = good;
  });
  for (int r = 0; r < P; ++r) CHECK(ok[r] == 1);
}

namespace {
template <class Topo, class Mode>
bool gossip_twins(ThreadComm& tc, Mode mode, int rounds) {
  const tensor_layout layout = {{12, 10}, {10}, {8, 16}, {5}, {20, 6}};
  const std::size_t n = 120 + 10 + 128 + 5 + 120;
  const int P = tc.size();
  grouped_comm gc{tc};
  GossipMixer<Topo, Mode, ThreadComm> h{tc, Topo(P), layout, mode};
  GossipMixer<Topo, Mode, grouped_comm> g{gc, Topo(P), layout, mode};
  auto xh = normal(500 + tc.rank(), n);
  auto xg = xh;
  bool good = true;
  for (int r = 0; r < rounds; ++r) {
    h.mix(std::span<float>(xh));
    g.mix(std::span<float>(xg));
    good = good && same_bits(xh, xg);
  }
  const auto& log = gc.log();
  return good && log.ungrouped == 0 && log.collectives_in_group == 0 && log.depth == 0 &&
         (P == 1 || (log.groups >= std::uint64_t(rounds) && log.grouped > 0));
}
}  // namespace

TEST_CASE("GossipMixer over a grouping communicator: each round's exchange one group, the same bits as ThreadComm",
          "[comm][p2p_group][gossip]") {
  const int P = GENERATE(1, 2, 3, 5);
  CAPTURE(P);
  std::vector<int> ok(P, 0);
  run_threads(P, [&](ThreadComm& tc) {
    bool good = gossip_twins<Ring>(tc, exact_mixing{}, 4);
    good = gossip_twins<Torus2D>(tc, exact_mixing{}, 4) && good;
    good = gossip_twins<Ring>(tc, choco_gossip<topk_codec>{topk_codec{0.1}, 0.3}, 4) && good;
    good = gossip_twins<Ring>(tc, power_gossip<1>{0.6, 7}, 5) && good;
    good = gossip_twins<Torus2D>(tc, power_gossip<2>{}, 5) && good;
    ok[tc.rank()] = good;
  });
  for (int r = 0; r < P; ++r) CHECK(ok[r] == 1);
}

TEST_CASE("CastAllreduce's ring over a grouping communicator: a group a ring step, the same bits as ThreadComm",
          "[comm][p2p_group][cast_allreduce]") {
  const int P = GENERATE(1, 2, 3, 5);
  const std::size_t n = 517;
  CAPTURE(P);
  std::vector<int> ok(P, 0);
  run_threads(P, [&](ThreadComm& tc) {
    grouped_comm gc{tc};
    CastAllreduce<fp16_codec, ThreadComm> h{tc, {}};
    CastAllreduce<fp16_codec, grouped_comm> g{gc, {}};
    bool good = true;
    for (int step = 0; step < 3; ++step) {
      auto gh = ok_grad(step, tc.rank(), n);
      auto gg = gh;
      good = good && h.reduce(std::span<float>(gh)) && g.reduce(std::span<float>(gg)) && same_bits(gh, gg);
    }
    const auto& log = gc.log();
    good = good && log.ungrouped == 0 && log.depth == 0 && log.groups == std::uint64_t(3 * 2 * (P - 1));
    ok[tc.rank()] = good;
  });
  for (int r = 0; r < P; ++r) CHECK(ok[r] == 1);
}
