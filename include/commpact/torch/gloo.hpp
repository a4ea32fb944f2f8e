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

#include "../error.hpp"
#include "torch_comm.hpp"

namespace commpact {

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
