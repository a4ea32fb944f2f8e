// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file gloo.hpp
//! A helper for programs that build their own c10d group (LibTorch C++): a
//! ProcessGroupGloo on a store (torch_guard, in torch_comm.hpp, turns an exception on
//! one rank into a failure every other rank sees).
//!
//! \code
//! auto store = c10::make_intrusive<c10d::FileStore>("/tmp/rendezvous", P);   // or a TCPStore
//! auto pg = commpact::torch_gloo_group(store, rank, P);
//! commpact::TorchComm comm{pg, store};
//! commpact::torch_guard(comm, [&] { train(comm); });
//! \endcode

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <chrono>
#include <string>
#include <type_traits>

#include "../error.hpp"
#include "torch_comm.hpp"

namespace commpact {

// LibTorch 2 split c10d's groups into a ProcessGroup that dispatches by device and the
// Backends behind it (ProcessGroupGloo is one), so a ProcessGroupGloo is no longer a group
// TorchComm can take. commpact builds only against LibTorch 1.13 (docs/pytorch.md), and
// commpact/torch.hpp leaves this header out under LibTorch 2.
static_assert(std::is_convertible_v<c10d::ProcessGroupGloo*, c10d::ProcessGroup*>,
              "commpact/torch/gloo.hpp (torch_gloo_group) needs LibTorch 1.x, where ProcessGroupGloo is a "
              "c10d::ProcessGroup; under LibTorch 2 it is a c10d::Backend: pass TorchComm the program's own "
              "c10d::ProcessGroup instead (docs/pytorch.md, TorchComm).");

//! A ProcessGroupGloo of `size` ranks on `store` (collective: every rank calls it),
//! over TCP on `host` (loopback by default). `timeout` bounds Gloo's own waits; keep it
//! at least TorchComm's timeout.
inline c10::intrusive_ptr<c10d::ProcessGroupGloo> torch_gloo_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                                   int rank, int size,
                                                                   std::chrono::milliseconds timeout =
                                                                       std::chrono::seconds(120),
                                                                   const std::string& host = "127.0.0.1",
                                                                   int threads = 2) {
  require(size >= 1 && rank >= 0 && rank < size, "commpact::torch_gloo_group: rank ", rank, " of ", size,
          " ranks; rank must be in [0, size) and size >= 1.");
  auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
  opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(host));
  opts->threads = threads;
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, opts);
}

}  // namespace commpact
