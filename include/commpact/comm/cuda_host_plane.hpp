// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file cuda_host_plane.hpp
//! The control plane of a CUDA-space communicator, written once: host-memory collectives
//! (the agreement's small allreduce, allgather, broadcast, barrier) and variable-length
//! point to point (send, recv, sendrecv), each staged through pinned host memory and a
//! device buffer and fenced at once under the communicator's deadline, on top of the
//! communicator's own data plane on device spans. NcclComm (nccl_comm.hpp) and
//! TorchCudaComm (torch/torch_cuda_comm.hpp) derive from it (CRTP). Only nvcc compiles it.
//!
//! A variable-length message travels as an 8-byte length, then the bytes (NCCL has no
//! probe): recv and sendrecv wait once for the length before the body.
//!
//! What the derived communicator D provides (the base is its friend's friend: D declares
//! `friend class cuda_host_plane<D>`):
//! - `static constexpr const char* comm_name` ("NcclComm"): the name in error messages;
//! - `rank()`, `size()`, `device()`, `exec()`;
//! - the data plane on device spans: `allreduce`, `allgather`, `broadcast`,
//!   `send_known`, `recv_known`, `exchange`;
//! - `cuda_host_stage& host_stage()`: the staging buffers, kept in D's shared state;
//! - `no_group(what)`: raises when a group is open (a staged copy could not wait for a
//!   receive the group has not posted yet), and whatever D checks first (its failure);
//! - `fence_now()`: the fence under D's deadline (its failure handling: polls, aborts);
//! - `exchange_bodies(peer, out, in)`: sendrecv's bodies, `out` to and `in` from peer,
//!   either possibly empty (the peer knows both lengths).
//! D brings the host overloads into scope next to its device ones:
//! `using cuda_host_plane<D>::allreduce;` (allgather, broadcast likewise).

#if !defined(__CUDACC__)
#error "commpact/comm/cuda_host_plane.hpp needs nvcc: include it from a .cu file only."
#endif

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "../concepts.hpp"
#include "../error.hpp"
#include "../space/cuda.hpp"

namespace commpact {

//! The control plane's staging: the same byte offsets on the device and in pinned memory.
struct cuda_host_stage {
  cuda_buffer<std::byte> dev;      //!< the device staging
  cuda_pinned_buffer<std::byte> host;  //!< the pinned host staging
};

template <class D>
class cuda_host_plane {
 public:
  // ---- control plane on host memory: staged, fenced at once ---------------------------
  template <class T>
  void allreduce(std::span<T> data, reduce_op op = reduce_op::sum) {
    d().no_group("allreduce (host memory)");
    const std::size_t b = data.size_bytes();
    stage(b);
    up(0, data.data(), b);
    d().allreduce(device_at<T>(0, data.size()), op);
    down(0, b);
    d().fence_now();
    copy_out(data.data(), 0, b);
  }
  template <class T>
  void allgather(std::span<const T> in, std::span<T> out) {
    require(out.size() == in.size() * static_cast<std::size_t>(d().size()), "commpact::", D::comm_name,
            "::allgather: the output holds ", out.size(), " values; it needs ", in.size(), " x ", d().size(),
            " ranks.");
    d().no_group("allgather (host memory)");
    const std::size_t at = static_cast<std::size_t>(d().rank()) * in.size();
    stage(out.size_bytes());
    up(at * sizeof(T), in.data(), in.size_bytes());
    const auto dv = device_at<T>(0, out.size());
    d().allgather(cuda_span<const T>(dv.subspan(at, in.size())), dv);  // in place: the rank's block of the output
    down(0, out.size_bytes());
    d().fence_now();
    copy_out(out.data(), 0, out.size_bytes());
  }
  template <class T>
  void broadcast(std::span<T> data, int root) {
    d().no_group("broadcast (host memory)");
    const std::size_t b = data.size_bytes();
    stage(b);
    up(0, data.data(), b);
    d().broadcast(device_at<T>(0, data.size()), root);
    down(0, b);
    d().fence_now();
    copy_out(data.data(), 0, b);
  }
  void barrier() {
    std::int32_t one = 1;
    allreduce(std::span<std::int32_t>(&one, 1));
  }
  void send(int peer, std::span<const std::byte> msg) {
    d().no_group("send");
    const std::uint64_t len = msg.size();
    stage(8 + msg.size());
    std::memcpy(host_at(0), &len, 8);
    if (!msg.empty()) std::memcpy(host_at(8), msg.data(), msg.size());
    queue_up(0, 8 + msg.size());
    d().send_known(peer, cuda_span<const std::byte>(device_at<std::byte>(0, 8)));
    if (!msg.empty()) d().send_known(peer, cuda_span<const std::byte>(device_at<std::byte>(8, msg.size())));
    d().fence_now();
  }
  void recv(int peer, std::vector<std::byte>& buf) {
    d().no_group("recv");
    std::uint64_t len = 0;
    stage(8);
    d().recv_known(peer, device_at<std::byte>(0, 8));
    down(0, 8);
    d().fence_now();
    copy_out(&len, 0, 8);
    buf.resize(len);
    if (len == 0) return;
    stage(len);
    d().recv_known(peer, device_at<std::byte>(0, len));
    down(0, len);
    d().fence_now();
    copy_out(buf.data(), 0, len);
  }
  void sendrecv(int peer, std::span<const std::byte> msg, std::vector<std::byte>& buf) {
    // Lengths first (both directions at once), then the bodies.
    d().no_group("sendrecv");
    const std::uint64_t len = msg.size();
    stage(16);
    up(0, &len, 8);
    d().exchange(peer, cuda_span<const std::byte>(device_at<std::byte>(0, 8)), device_at<std::byte>(8, 8));
    down(8, 8);
    d().fence_now();
    std::uint64_t in_len = 0;
    copy_out(&in_len, 8, 8);
    const std::size_t at = aligned(msg.size());
    stage(at + in_len);
    if (!msg.empty()) up(0, msg.data(), msg.size());
    d().exchange_bodies(peer, cuda_span<const std::byte>(device_at<std::byte>(0, msg.size())),
                        device_at<std::byte>(at, in_len));
    buf.resize(in_len);
    if (in_len) down(at, in_len);
    d().fence_now();
    if (in_len) copy_out(buf.data(), at, in_len);
  }

 protected:
  // ---- the staging: the same byte offsets on the device and in pinned memory; grown at
  // the start of a call (the previous call fenced before it returned).
  static std::size_t aligned(std::size_t b) { return (b + 255) / 256 * 256; }
  void stage(std::size_t bytes) {
    const std::size_t b = aligned(bytes == 0 ? 1 : bytes);
    auto& s = d().host_stage();
    if (s.dev.size() < b) s.dev.resize(b, d().exec());
    if (s.host.size() < b) s.host.resize(b);
  }
  template <class T>
  cuda_span<T> device_at(std::size_t byte_off, std::size_t n) {
    return cuda_access::wrap(reinterpret_cast<T*>(cuda_access::ptr(d().host_stage().dev.view()) + byte_off), n);
  }
  std::byte* host_at(std::size_t byte_off) { return d().host_stage().host.view().data() + byte_off; }
  //! Queues the copy of the pinned bytes [off, off + b) to the device bytes there.
  void queue_up(std::size_t off, std::size_t b) {
    if (b == 0) return;
    cuda_device_guard g(d().device());
    const cudaError_t e = cudaMemcpyAsync(cuda_access::ptr(d().host_stage().dev.view()) + off, host_at(off), b,
                                          cudaMemcpyHostToDevice, d().exec().stream());
    require<device_error>(e == cudaSuccess, "commpact::", D::comm_name, ": staging to the device failed: ",
                          cudaGetErrorString(e));
  }
  //! src's b bytes into pinned memory at off, then queued to the device there.
  void up(std::size_t off, const void* src, std::size_t b) {
    if (b == 0) return;
    std::memcpy(host_at(off), src, b);
    queue_up(off, b);
  }
  //! Queues the copy of the device bytes [off, off + b) to pinned memory there.
  void down(std::size_t off, std::size_t b) {
    if (b == 0) return;
    cuda_device_guard g(d().device());
    const cudaError_t e = cudaMemcpyAsync(host_at(off), cuda_access::ptr(d().host_stage().dev.view()) + off, b,
                                          cudaMemcpyDeviceToHost, d().exec().stream());
    require<device_error>(e == cudaSuccess, "commpact::", D::comm_name, ": staging to the host failed: ",
                          cudaGetErrorString(e));
  }
  //! After the fence: the pinned bytes [off, off + b) into dst.
  void copy_out(void* dst, std::size_t off, std::size_t b) {
    if (b) std::memcpy(dst, host_at(off), b);
  }

 private:
  D& d() { return static_cast<D&>(*this); }
  const D& d() const { return static_cast<const D&>(*this); }
};

}  // namespace commpact
