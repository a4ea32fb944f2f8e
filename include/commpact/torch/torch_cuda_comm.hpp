// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file torch_cuda_comm.hpp
//! TorchCudaComm: a communicator of the CUDA space (space/cuda.hpp) over a PyTorch
//! process group whose backend takes CUDA tensors (ProcessGroupNCCL), reached through a
//! torch_group_link (group_link.hpp; made in a C++ translation unit by
//! make_torch_group_link, torch_group_link.hpp), so commpact's device algorithms run over
//! the NCCL communicator the program already has, not a second one. Only nvcc compiles
//! it; it includes no LibTorch header.
//!
//! Compiled to objects by nvcc 13 in CI (tests/torch/check_torch_cuda_objects.cmake);
//! where it has run: docs/cuda.md, "Status".
//!
//! <!-- snippet: link=std::shared_ptr<commpact::torch_group_link>; stream=cudaStream_t; grad=commpact::cuda_span<float> -->
//! \code
//! // C++ (host compiler): auto link = commpact::make_torch_group_link(pg, store, {.timeout = 60s});
//! // .cu (nvcc):
//! #include <commpact/torch/torch_cuda_comm.hpp>
//! auto e = commpact::cuda_space::make_exec(stream);          // PyTorch's current stream
//! commpact::TorchCudaComm comm{link, e};
//! commpact::gTopK<commpact::TreeComm<commpact::TorchCudaComm>> g{comm, {.density = 0.01}};
//! g.reduce(grad);   // grad: a cuda_span<float>; queued on e's stream, one fence per step
//! \endcode
//!
//! Data plane (device spans): allreduce (float, double, int32, int64; sum, min, max),
//! allgather (in place when `in` is the rank's block of `out`), broadcast, and known-size
//! point to point (`exchange`, `send_known`, `recv_known`), each ordered on the
//! executor's stream by the link (after the work queued there before it, before the work
//! queued after it; no host wait), as NcclComm's calls are.
//! Point to point with one peer keeps one order on both sides: `exchange` sends first
//! on the lower rank and receives first on the higher one. `group_begin()` /
//! `group_end()` hold the known-size calls and post them at the group's end, per peer in
//! order of first appearance, sends first towards a higher rank and receives first from a
//! lower one (each direction in its own order), so that a ring step or a pairwise
//! exchange does not wait on a receive queued behind its own send.
//! Control plane (host spans: the agreement's allreduce, barrier, variable-length
//! send / recv / sendrecv): staged through pinned host memory and a device buffer and
//! fenced at once under the deadline: NcclComm's, written once in
//! comm/cuda_host_plane.hpp; a message is an 8-byte length then the bytes.
//!
//! Failures: TorchComm's semantics through the link. The communicator installs a hook
//! on its executor: every fence calls the link's poll() (a Work that failed raises
//! comm_error and tells the other ranks; a peer's notice raises peer_failure with its
//! reason), and a fence whose deadline passes calls on_timeout() (the Works in flight are
//! aborted, the other ranks told) before timeout_error. abort(why) writes the notice.
//!
//! Memory: the spans are the caller's (commpact's buffers, from the executor's allocator
//! hook, e.g. PyTorch's caching allocator with the stream), freed in the order of the
//! executor's stream, which waits for each operation.
//!
//! Gloo with CUDA tensors: a staged link (make_torch_group_link(..., staged = true))
//! copies each call's device data through host memory over TorchComm.

#if !defined(__CUDACC__)
#error "commpact/torch/torch_cuda_comm.hpp needs nvcc: include it from a .cu file only."
#endif

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "../comm/cuda_host_plane.hpp"
#include "../comm/known_size.hpp"
#include "../comm/wire_model.hpp"
#include "../space/cuda.hpp"
#include "group_link.hpp"

namespace commpact {

class TorchCudaComm : public cuda_host_plane<TorchCudaComm> {
  friend class cuda_host_plane<TorchCudaComm>;
  struct state {
    std::shared_ptr<torch_group_link> link;
    cuda_space::exec exec;
    int device = 0;
    int group_depth = 0;
    std::uint64_t bytes_sent = 0;                      // wire_model.hpp's count of the data plane
    std::vector<std::function<void()>> held;           // the known-size calls of the open group, in order
    std::vector<int> held_peer, held_kind;            // their peer and kind (0 send, 1 receive)
    cuda_host_stage staging;                           // the control plane's device and pinned host staging
    state() = default;
    state(const state&) = delete;
    state& operator=(const state&) = delete;
    ~state() { exec.remove_hook(this); }
  };

 public:
  using space_type = cuda_space;
  static constexpr const char* comm_name = "TorchCudaComm";
  // The control plane on host memory (cuda_host_plane.hpp): staged, fenced at once.
  using cuda_host_plane<TorchCudaComm>::allreduce;
  using cuda_host_plane<TorchCudaComm>::allgather;
  using cuda_host_plane<TorchCudaComm>::broadcast;

  //! `link`: the group (its backend takes CUDA tensors on e's device: NCCL); `e`: the
  //! executor the data plane is queued on (PyTorch's current stream: make_exec(stream)).
  TorchCudaComm(std::shared_ptr<torch_group_link> link, cuda_space::exec e) : s_(std::make_shared<state>()) {
    require(link != nullptr, "commpact::TorchCudaComm: the link is null; make one with make_torch_group_link.");
    require(e.s != nullptr, "commpact::TorchCudaComm: the executor has no stream; make one with "
                            "cuda_space::make_exec(stream).");
    s_->link = std::move(link);
    s_->device = e.device();
    s_->exec = std::move(e);
    std::weak_ptr<state> w = s_;
    s_->exec.add_hook({s_.get(),
                       [w] {
                         if (auto st = w.lock()) st->link->poll();
                       },
                       [w](const char* what) {
                         if (auto st = w.lock()) st->link->on_timeout(what);
                       }});
  }

  int rank() const { return s_->link->rank(); }
  int size() const { return s_->link->size(); }
  int device() const { return s_->device; }
  const cuda_space::exec& exec() const { return s_->exec; }
  const std::shared_ptr<torch_group_link>& link() const { return s_->link; }
  //! How long a host-side wait (a fence) may last: the link's (torch_options::timeout).
  std::chrono::milliseconds timeout() const { return s_->link->timeout(); }
  bool failed() const { return s_->link->failed(); }
  //! Bytes this rank sent (every call goes through the data plane): collectives charged
  //! by wire_model.hpp's textbook algorithms, as CountingComm charges them; point to
  //! point as sent. Copies share the count.
  std::uint64_t bytes_sent() const { return s_->bytes_sent; }
  //! Waits for the work queued on the executor, until the communicator's deadline.
  void fence() { fence_now(); }
  void fence(deadline until) { cuda_space::fence(s_->exec, until); }

  // ---- data plane on device spans: queued on the stream --------------------------------
  template <class T>
  void allreduce(cuda_span<T> data, reduce_op op = reduce_op::sum) {
    live("allreduce");
    s_->link->device_allreduce(stream(), s_->device, cuda_access::ptr(data), data.size(),
                               torch_link_dtype_of<std::remove_const_t<T>>(), op);
    s_->bytes_sent += wire::ring_allreduce(rank(), size(), data.size(), sizeof(T)).bytes_sent;
  }
  template <class T>
  void allgather(cuda_span<const T> in, cuda_span<T> out) {
    live("allgather");
    const std::size_t n = in.size();
    require(out.size() == n * static_cast<std::size_t>(size()), "commpact::TorchCudaComm::allgather: the output holds ",
            out.size(), " values; it needs ", n, " x ", size(), " ranks.");
    s_->link->device_allgather(stream(), s_->device, cuda_access::ptr(in), cuda_access::ptr(out), in.size_bytes());
    s_->bytes_sent += wire::ring_allgather(rank(), size(), in.size_bytes()).bytes_sent;
  }
  template <class T>
  void broadcast(cuda_span<T> data, int root) {
    live("broadcast");
    s_->link->device_broadcast(stream(), s_->device, cuda_access::ptr(data), data.size_bytes(), root);
    s_->bytes_sent += wire::binomial_broadcast(rank(), size(), root, data.size_bytes()).bytes_sent;
  }
  void exchange(int peer, cuda_span<const std::byte> out, cuda_span<std::byte> in) {
    check_peer(peer, "exchange");
    if (rank() < peer) {
      send_known(peer, out);
      recv_known(peer, in);
    } else {
      recv_known(peer, in);
      send_known(peer, out);
    }
  }
  void send_known(int peer, cuda_span<const std::byte> out) {
    check_peer(peer, "send_known");
    live("send_known");
    const void* p = cuda_access::ptr(out);
    const std::size_t b = out.size();
    hold_or_run(peer, 0, [s = s_.get(), peer, p, b] { s->link->device_send(s->exec.stream(), s->device, peer, p, b); });
    s_->bytes_sent += b;
  }
  void recv_known(int peer, cuda_span<std::byte> in) {
    check_peer(peer, "recv_known");
    live("recv_known");
    void* p = cuda_access::ptr(in);
    const std::size_t b = in.size();
    hold_or_run(peer, 1, [s = s_.get(), peer, p, b] { s->link->device_recv(s->exec.stream(), s->device, peer, p, b); });
  }
  //! Opens a group: the known-size calls up to group_end() are posted at its end, in an
  //! order that cannot wait on itself (see the file comment).
  void group_begin() {
    live("group_begin");
    ++s_->group_depth;
  }
  void group_end() {
    require(s_->group_depth > 0, "commpact::TorchCudaComm::group_end: rank ", rank(),
            " has no open group; call group_begin() first (or use commpact::grouped).");
    if (--s_->group_depth > 0) return;
    auto held = std::move(s_->held);
    auto peer = std::move(s_->held_peer), kind = std::move(s_->held_kind);
    s_->held.clear();
    s_->held_peer.clear();
    s_->held_kind.clear();
    // Per peer in order of first appearance: towards a higher rank its sends first, from
    // a lower rank its receives first; each direction keeps its own order.
    std::vector<int> peers;
    for (int p : peer)
      if (std::find(peers.begin(), peers.end(), p) == peers.end()) peers.push_back(p);
    for (int p : peers)
      for (int pass = 0; pass < 2; ++pass) {
        const int k = (rank() < p) == (pass == 0) ? 0 : 1;
        for (std::size_t i = 0; i < held.size(); ++i)
          if (peer[i] == p && kind[i] == k) held[i]();
      }
  }
  int group_depth() const { return s_->group_depth; }

  //! Marks the communicator failed here and leaves a notice in the store, so every other
  //! rank's next fence or call raises peer_failure. Never throws.
  void abort(std::string_view why) noexcept {
    s_->link->abort(why);
  }

 private:
  void* stream() const { return static_cast<void*>(s_->exec.stream()); }
  deadline until() const { return std::chrono::steady_clock::now() + timeout(); }
  void fence_now() { cuda_space::fence(s_->exec, until()); }
  //! After a failure every call raises at once.
  void live(const char* what) const {
    if (s_->link->failed())
      throw peer_failure(detail::cat("commpact::TorchCudaComm::", what, ": rank ", rank(),
                                     ": the communicator failed earlier; no further operation runs on it."));
  }

  void hold_or_run(int peer, int kind, std::function<void()> go) {
    if (s_->group_depth == 0) {
      go();
      return;
    }
    s_->held.push_back(std::move(go));
    s_->held_peer.push_back(peer);
    s_->held_kind.push_back(kind);
  }

  void check_peer(int peer, const char* what) const {
    require(peer >= 0 && peer < size() && peer != rank(), "commpact::TorchCudaComm::", what, ": rank ", rank(),
            " named peer ", peer, "; a peer must be another rank in [0, ", size(), ").");
  }
  void no_group(const char* what) const {
    require(s_->group_depth == 0, "commpact::TorchCudaComm::", what, ": rank ", rank(),
            " is inside a group (group_begin without group_end); a group holds known-size sends and receives on "
            "device spans only: end the group first.");
  }

  cuda_host_stage& host_stage() { return s_->staging; }
  //! sendrecv's bodies: an exchange (either may be empty).
  void exchange_bodies(int peer, cuda_span<const std::byte> out, cuda_span<std::byte> in) { exchange(peer, out, in); }

  std::shared_ptr<state> s_;
};

static_assert(PointToPoint<TorchCudaComm>);

}  // namespace commpact
