// SPDX-License-Identifier: Apache-2.0
// NcclComm's grouped point-to-point (group_begin/group_end: ncclGroupStart/End; comm/
// known_size.hpp's grouped and p2p_group), one rank:
// - a send to itself and a receive from itself in one group (the pair NCCL runs only
//   grouped), by group_begin/group_end and by grouped() with two messages of different
//   sizes, and an exchange nested inside a group;
// - inside a group a control-plane call raises invalid_argument (the group stays open and
//   then closes cleanly); group_end without a group raises invalid_argument; an exception
//   inside grouped() closes the group;
// - OkTopK<NcclComm> (SparseReduceScatter's groups, empty at one rank) against
//   OkTopK<ThreadComm> on the host, 4 steps, bit for bit (outputs and residuals).
//
// Without a device it exits 77 (skipped); docs/cuda.md, "Status", says where it has run.
// NCCL cannot place two ranks of one communicator on one GPU, so the groups' multi-rank
// path (OkTopK's all-to-all and ring at P > 1) waits for a machine with several GPUs; on
// the host, tests/test_comm_p2p_group.cpp checks it against a communicator that posts a
// group only at its end.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <span>
#include <stdexcept>
#include <vector>

#include "commpact/comm/known_size.hpp"
#include "commpact/comm/nccl_comm.hpp"
#include "commpact/comm/thread_comm.hpp"
#include "commpact/compress/compressors/oktopk.hpp"
#include "commpact/kernels/cuda/ops.cuh"
#include "commpact/space/cuda.hpp"

#include "cuda_test_common.cuh"

using commpact_test::failures;
namespace cp = commpact;
using D = cp::ops<cp::cuda_space>;
using commpact_test::download;
using commpact_test::same;
using commpact_test::upload;

static_assert(cp::req::has_p2p_group<cp::NcclComm>);

namespace {

std::vector<std::byte> bytes(std::size_t n, int seed) {
  std::vector<std::byte> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = std::byte((i * 7 + static_cast<std::size_t>(seed)) & 0xff);
  return v;
}

void check_self_groups() {
  auto c = cp::NcclComm::single();
  const auto& e = c.exec();
  // group_begin / group_end around a send to and a receive from itself.
  const auto m = bytes(100, 1);
  auto out = upload(e, m);
  cp::cuda_buffer<std::byte> in;
  in.resize(100);
  c.group_begin();
  EXPECT(c.group_depth() == 1, "group_begin did not open a group");
  cp::send_known(c, 0, out.cview());
  cp::recv_known(c, 0, in.view());
  c.group_end();
  EXPECT(c.group_depth() == 0, "group_end did not close the group");
  EXPECT(same(download(e, in.cview()), m), "a grouped send/recv to itself");

  // grouped(): two messages of different sizes, matched in order.
  const auto a = bytes(40, 2), b = bytes(7, 3);
  auto oa = upload(e, a), ob = upload(e, b);
  cp::cuda_buffer<std::byte> ia, ib;
  ia.resize(40), ib.resize(7);
  cp::grouped(c, [&] {
    cp::send_known(c, 0, oa.cview());
    cp::send_known(c, 0, ob.cview());
    cp::recv_known(c, 0, ia.view());
    cp::recv_known(c, 0, ib.view());
  });
  EXPECT(same(download(e, ia.cview()), a) && same(download(e, ib.cview()), b), "grouped(): two messages to itself");

  // An exchange (itself a group) nested in a group.
  cp::cuda_buffer<std::byte> ix;
  ix.resize(100);
  cp::grouped(c, [&] { cp::exchange(c, 0, out.cview(), ix.view()); });
  EXPECT(same(download(e, ix.cview()), m), "an exchange nested in a group");

  // A control-plane call inside a group raises; the group then closes cleanly.
  bool raised = false;
  c.group_begin();
  try {
    c.barrier();
  } catch (const cp::invalid_argument&) {
    raised = true;
  }
  EXPECT(raised, "a barrier inside a group did not raise invalid_argument");
  c.group_end();
  EXPECT(c.group_depth() == 0, "the group did not close after the refused barrier");

  raised = false;
  try {
    c.group_end();
  } catch (const cp::invalid_argument&) {
    raised = true;
  }
  EXPECT(raised, "group_end without a group did not raise invalid_argument");

  // An exception inside grouped(): the group is closed, the communicator still works.
  raised = false;
  try {
    cp::grouped(c, [&] {
      cp::send_known(c, 0, out.cview());
      cp::recv_known(c, 0, in.view());
      throw std::runtime_error("inside the group");
    });
  } catch (const std::runtime_error&) {
    raised = true;
  }
  EXPECT(raised && c.group_depth() == 0 && !c.aborted(), "an exception inside grouped() left the group open");
  c.fence(std::chrono::steady_clock::now() + c.timeout());
  c.barrier();
}

//! OkTopK<NcclComm> against OkTopK<ThreadComm>, one rank, four steps.
void check_oktopk() {
  auto c = cp::NcclComm::single();
  const auto& e = c.exec();
  const cp::oktopk_options o{.density = 0.02, .period = 2};
  cp::OkTopK<cp::NcclComm> dev{c, o};
  const std::size_t n = 20011;
  cp::run_threads(1, [&](cp::ThreadComm& tc) {
    cp::OkTopK<cp::ThreadComm> host{tc, o};
    std::mt19937_64 g(17);
    std::normal_distribution<float> d;
    for (int s = 0; s < 4; ++s) {
      std::vector<float> h(n);
      for (auto& x : h) x = d(g);
      auto dg = upload(e, h);
      dev.reduce(dg.view());
      host.reduce(std::span<float>(h));
      EXPECT(same(download(e, dg.cview()), h), "OkTopK<NcclComm> step %d: output differs from the host", s);
      const std::span<const float> hr = host.residual();
      EXPECT(same(download(e, dev.residual()), std::vector<float>(hr.begin(), hr.end())),
             "OkTopK<NcclComm> step %d: residual differs from the host", s);
    }
  });
}

}  // namespace

int main() {
  return commpact_test::run_checks("all NcclComm group checks passed\n", "%d NcclComm group checks failed\n", [] {
    check_self_groups();
    check_oktopk();
  });
}
