// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file torch_group_link.hpp
//! make_torch_group_link(pg, store, opt, staged): the torch_group_link (group_link.hpp)
//! of a `c10d::ProcessGroup`, for the .cu code that runs commpact's CUDA space over it
//! (TorchCudaComm). Compiled by the host compiler with LibTorch's headers and its CUDA
//! headers (c10/cuda); not by nvcc.
//!
//! Compiled to objects against Debian's LibTorch 1.13 headers in CI
//! (tests/torch/check_torch_cuda_objects.cmake); where it has run: docs/cuda.md, "Status".
//!
//! - Device plane: each call wraps the device pointer in a CUDA tensor (at::from_blob: no
//!   copy, no allocation, no deleter), makes the given stream PyTorch's current stream for
//!   the call (ProcessGroupNCCL's own stream then waits for the work queued on it) and
//!   calls `Work::synchronize()`, which makes that stream wait for the operation (an
//!   event; no host wait). allgather is c10d's flat `_allgather_base`. Point to point
//!   uses the tag torch_payload_tag (NCCL ignores tags). The memory is the caller's:
//!   ProcessGroupNCCL's record_stream on it is a no-op (not its allocation); the caller
//!   keeps it alive in the order of its stream, which waits for each operation.
//! - Staged (`staged`: a group whose backend takes CPU tensors only, Gloo): each
//!   device-plane call copies the device data to host memory on the stream (waiting for
//!   it), runs the host plane's operation, and copies the result back on the stream.
//! - Host plane: a TorchComm over the same group and store (torch_comm.hpp).
//! - Failures: the device plane keeps the Works queued since the last poll; poll() raises
//!   comm_error for one that failed (and tells the other ranks), peer_failure for a
//!   notice in the store (key `<name>/failed`, TorchComm's); on_timeout() aborts the
//!   Works in flight and writes the notice. Both planes read and write the same notice.

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "group_link.hpp"
#include "torch_comm.hpp"

namespace commpact {

namespace detail {

class torch_group_link_impl final : public torch_group_link {
 public:
  torch_group_link_impl(c10::intrusive_ptr<c10d::ProcessGroup> pg, c10::intrusive_ptr<c10d::Store> store,
                        torch_options opt, bool staged)
      : host_(pg, store, opt), dev_(std::move(pg), std::move(store), std::move(opt)), staged_(staged) {}

  int rank() const override { return host_.rank(); }
  int size() const override { return host_.size(); }
  std::chrono::milliseconds timeout() const override { return host_.options().timeout; }
  std::chrono::milliseconds poll_interval() const override { return host_.options().poll; }
  bool failed() const override { return host_.failed() || dev_.failed(); }

  void device_allreduce(void* stream, int device, void* data, std::size_t n, torch_link_dtype t,
                        reduce_op op) override {
    require(op == reduce_op::sum || op == reduce_op::min || op == reduce_op::max, "commpact::torch_group_link: rank ",
            rank(), " passed reduce_op ", static_cast<int>(op), "; use reduce_op::sum, min or max.");
    if (n == 0) return;
    static constexpr at::ScalarType types[] = {at::kFloat, at::kDouble, at::kInt, at::kLong};
    if (staged_) {
      staged(stream, device, data, static_cast<std::int64_t>(n), types[static_cast<int>(t)], [&](at::Tensor& h) {
        switch (t) {
          case torch_link_dtype::f32: host_.allreduce(std::span(h.data_ptr<float>(), n), op); break;
          case torch_link_dtype::f64: host_.allreduce(std::span(h.data_ptr<double>(), n), op); break;
          case torch_link_dtype::i32: host_.allreduce(std::span(h.data_ptr<std::int32_t>(), n), op); break;
          case torch_link_dtype::i64: host_.allreduce(std::span(h.data_ptr<std::int64_t>(), n), op); break;
        }
      });
      return;
    }
    c10d::AllreduceOptions o;
    o.reduceOp = op == reduce_op::sum ? c10d::ReduceOp::SUM : op == reduce_op::min ? c10d::ReduceOp::MIN
                                                                                   : c10d::ReduceOp::MAX;
    std::vector<at::Tensor> v{wrap(data, static_cast<std::int64_t>(n), types[static_cast<int>(t)], device)};
    post(stream, device, "allreduce", [&] { return dev_.pg().allreduce(v, o); });
  }
  void device_allgather(void* stream, int device, const void* in, void* out, std::size_t bytes) override {
    if (bytes == 0) return;
    if (staged_) {
      at::Tensor in_h;
      staged(stream, device, const_cast<void*>(in), static_cast<std::int64_t>(bytes), at::kByte,
             [&](at::Tensor& h) { in_h = h; }, true, false);
      staged(stream, device, out, static_cast<std::int64_t>(bytes) * size(), at::kByte, [&](at::Tensor& h) {
        host_.allgather(std::span<const std::byte>(static_cast<const std::byte*>(in_h.data_ptr()), bytes),
                        std::span<std::byte>(static_cast<std::byte*>(h.data_ptr()), bytes * size()));
      }, false, true);
      return;
    }
    at::Tensor i = wrap(const_cast<void*>(in), static_cast<std::int64_t>(bytes), at::kByte, device);
    at::Tensor o = wrap(out, static_cast<std::int64_t>(bytes) * size(), at::kByte, device);
    post(stream, device, "allgather", [&] { return dev_.pg()._allgather_base(o, i); });
  }
  void device_broadcast(void* stream, int device, void* data, std::size_t bytes, int root) override {
    require(root >= 0 && root < size(), "commpact::torch_group_link::broadcast: rank ", rank(), " passed root ", root,
            ", outside [0, ", size(), ").");
    if (bytes == 0) return;
    c10d::BroadcastOptions o;
    o.rootRank = root;
    o.rootTensor = 0;
    if (staged_) {
      staged(stream, device, data, static_cast<std::int64_t>(bytes), at::kByte, [&](at::Tensor& h) {
        host_.broadcast(std::span<std::byte>(static_cast<std::byte*>(h.data_ptr()), bytes), root);
      });
      return;
    }
    std::vector<at::Tensor> v{wrap(data, static_cast<std::int64_t>(bytes), at::kByte, device)};
    post(stream, device, "broadcast", [&] { return dev_.pg().broadcast(v, o); });
  }
  void device_send(void* stream, int device, int peer, const void* data, std::size_t bytes) override {
    if (bytes == 0) return;
    if (staged_) {
      staged(stream, device, const_cast<void*>(data), static_cast<std::int64_t>(bytes), at::kByte, [&](at::Tensor& h) {
        host_.send(peer, std::span<const std::byte>(static_cast<const std::byte*>(h.data_ptr()), bytes));
      }, true, false);
      return;
    }
    std::vector<at::Tensor> v{wrap(const_cast<void*>(data), static_cast<std::int64_t>(bytes), at::kByte, device)};
    post(stream, device, "send", [&] { return dev_.pg().send(v, peer, torch_payload_tag); });
  }
  void device_recv(void* stream, int device, int peer, void* data, std::size_t bytes) override {
    if (bytes == 0) return;
    if (staged_) {
      staged(stream, device, data, static_cast<std::int64_t>(bytes), at::kByte, [&](at::Tensor& h) {
        std::vector<std::byte> buf;
        host_.recv(peer, buf);
        require<mismatch_error>(buf.size() == bytes, "commpact::torch_group_link::recv: rank ", rank(), " expected ",
                                bytes, " bytes from rank ", peer, " and got ", buf.size(), ".");
        std::memcpy(h.data_ptr(), buf.data(), bytes);
      }, false, true);
      return;
    }
    std::vector<at::Tensor> v{wrap(data, static_cast<std::int64_t>(bytes), at::kByte, device)};
    post(stream, device, "recv", [&] { return dev_.pg().recv(v, peer, torch_payload_tag); });
  }

  void poll() override {
    if (dev_.failed()) dev_.raise_failed("commpact::torch_group_link::", "poll");
    std::vector<c10::intrusive_ptr<c10d::Work>> failed;
    {
      std::lock_guard<std::mutex> g(m_);
      for (auto it = works_.begin(); it != works_.end();) {
        if (!(*it)->isCompleted()) {
          ++it;
        } else {
          if ((*it)->exception()) failed.push_back(*it);  // not isSuccess(): WorkNCCL throws there
          it = works_.erase(it);
        }
      }
      if (!failed.empty()) works_.clear();
    }
    if (!failed.empty()) {
      const auto why = cat("rank ", rank(), ": the process group failed: ", exception_text(failed.front()->exception()));
      dev_.fail_and_tell(why);
      throw comm_error(cat("commpact::torch_group_link: ", why));
    }
    dev_.enter("fence");  // a peer's notice, looked up at most every poll interval
  }
  void on_timeout(const char* what) noexcept override {
    std::vector<c10::intrusive_ptr<c10d::Work>> ws;
    {
      std::lock_guard<std::mutex> g(m_);
      ws.swap(works_);
    }
    for (auto& w : ws) {
      try {
        w->abort();
      } catch (...) {
      }
    }
    try {
      dev_.fail_and_tell(cat("rank ", rank(), " timed out after ", timeout().count(), " ms in ", what,
                             " (a rank did not join, or ranks called different operations)"),
                         true);
    } catch (...) {
    }
  }

  void allreduce_f(std::span<float> v, reduce_op op) override { host_.allreduce(v, op); }
  void allreduce_d(std::span<double> v, reduce_op op) override { host_.allreduce(v, op); }
  void allreduce_i(std::span<std::int32_t> v, reduce_op op) override { host_.allreduce(v, op); }
  void allreduce_l(std::span<std::int64_t> v, reduce_op op) override { host_.allreduce(v, op); }
  void allgather_b(std::span<const std::byte> in, std::span<std::byte> out) override { host_.allgather(in, out); }
  void broadcast_b(std::span<std::byte> v, int root) override { host_.broadcast(v, root); }
  void barrier() override { host_.barrier(); }
  void send(int peer, std::span<const std::byte> msg) override { host_.send(peer, msg); }
  void recv(int peer, std::vector<std::byte>& buf) override { host_.recv(peer, buf); }
  void sendrecv(int peer, std::span<const std::byte> msg, std::vector<std::byte>& buf) override {
    host_.sendrecv(peer, msg, buf);
  }
  void abort(std::string_view why) noexcept override { host_.abort(why); }

 private:
  //! PyTorch's stream for a commpact executor's stream. PyTorch's default stream is the
  //! legacy NULL stream, which an executor names cudaStreamLegacy (make_exec reads a null
  //! handle as "make a stream of your own"): PyTorch gets its own default stream back.
  static c10::cuda::CUDAStream torch_stream(void* stream, c10::DeviceIndex d) {
    const auto s = static_cast<cudaStream_t>(stream);
    if (s == nullptr || s == cudaStreamLegacy) return c10::cuda::getDefaultCUDAStream(d);
    return c10::cuda::getStreamFromExternal(s, d);
  }
  static at::Tensor wrap(void* p, std::int64_t n, at::ScalarType t, int device) {
    return at::from_blob(p, {n}, at::TensorOptions().dtype(t).device(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(device))));
  }
  //! Staging: the device data to host memory (`down`, waiting for the stream), f on it,
  //! and back to the device on the stream (`up`).
  template <class F>
  void staged(void* stream, int device, void* data, std::int64_t n, at::ScalarType t, F&& f, bool down = true,
              bool up = true) {
    dev_.enter("staged call");
    const auto d = static_cast<c10::DeviceIndex>(device);
    c10::cuda::CUDAGuard dg(d);
    c10::cuda::CUDAStreamGuard sg(torch_stream(stream, d));
    at::Tensor dev = wrap(data, n, t, device);
    at::Tensor h = down ? dev.to(at::kCPU) : at::empty({n}, at::TensorOptions().dtype(t));
    f(h);
    if (up) dev.copy_(h);
  }
  template <class F>
  void post(void* stream, int device, const char* what, F&& start) {
    dev_.enter(what);
    const auto d = static_cast<c10::DeviceIndex>(device);
    c10::cuda::CUDAGuard dg(d);
    c10::cuda::CUDAStreamGuard sg(torch_stream(stream, d));
    auto w = dev_.start(what, std::forward<F>(start));
    try {
      w->synchronize();
    } catch (const std::exception&) {
      const auto why = cat("rank ", rank(), ": the process group failed in ", what, ": ",
                           exception_text(std::current_exception()));
      dev_.fail_and_tell(why);
      throw comm_error(cat("commpact::torch_group_link::", what, ": ", why));
    }
    std::lock_guard<std::mutex> g(m_);
    works_.push_back(std::move(w));
  }

  TorchComm host_;
  torch_state dev_;
  bool staged_ = false;
  std::mutex m_;
  std::vector<c10::intrusive_ptr<c10d::Work>> works_;
};

}  // namespace detail

//! The link of `pg`, failure notices through `store` (may be null). `staged`: the
//! device plane copies through host memory (a backend that takes CPU tensors only:
//! Gloo); otherwise the backend must take CUDA tensors (NCCL).
inline std::shared_ptr<torch_group_link> make_torch_group_link(c10::intrusive_ptr<c10d::ProcessGroup> pg,
                                                               c10::intrusive_ptr<c10d::Store> store = {},
                                                               torch_options opt = {}, bool staged = false) {
  return std::make_shared<detail::torch_group_link_impl>(std::move(pg), std::move(store), std::move(opt), staged);
}

}  // namespace commpact
