// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file group_link.hpp
//! torch_group_link: what commpact's CUDA-space code needs of a PyTorch process group,
//! behind an interface that names neither torch nor CUDA. nvcc cannot compile LibTorch
//! 1.13's headers in C++20 (ATen/core/List.h destroys a vector of an incomplete IValue),
//! so a program splits in two: a C++ translation unit builds the link over its
//! `c10d::ProcessGroup` (torch_group_link.hpp: make_torch_group_link), and the .cu
//! translation unit runs commpact's algorithms over it with TorchCudaComm
//! (torch_cuda_comm.hpp).
//!
//! Device plane: each call is ordered on `stream` (a cudaStream_t) of `device`: after
//! the work queued there before it, and before the work queued after it. Over a group
//! whose backend takes CUDA tensors (NCCL) no call waits on the host; a staged link
//! (Gloo) copies through host memory, waiting for the stream at each call.
//! Host plane: TorchComm's calls (torch_comm.hpp), blocking. Failures, notices and the
//! deadline are TorchComm's: poll() raises what the device plane's Works or a peer
//! reported, on_timeout() tells the other ranks and aborts the Works in flight.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "../concepts.hpp"
#include "../error.hpp"

namespace commpact {

//! Element types of the device plane's allreduce.
enum class torch_link_dtype : int { f32 = 0, f64 = 1, i32 = 2, i64 = 3 };

template <class T>
constexpr torch_link_dtype torch_link_dtype_of() {
  if constexpr (std::is_same_v<T, float>) return torch_link_dtype::f32;
  else if constexpr (std::is_same_v<T, double>) return torch_link_dtype::f64;
  else if constexpr (std::is_same_v<T, std::int32_t>) return torch_link_dtype::i32;
  else {
    static_assert(std::is_same_v<T, std::int64_t>, "commpact::torch_group_link reduces float, double, int32 and "
                                                  "int64 (the element types c10d reduces).");
    return torch_link_dtype::i64;
  }
}

//! One rank's link to a c10d::ProcessGroup (see the file comment). Thread use as TorchComm.
class torch_group_link {
 public:
  virtual ~torch_group_link() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::chrono::milliseconds timeout() const = 0;
  virtual std::chrono::milliseconds poll_interval() const = 0;
  virtual bool failed() const = 0;

  // ---- device plane: device pointers, ordered on `stream` (a cudaStream_t) ----------
  virtual void device_allreduce(void* stream, int device, void* data, std::size_t n, torch_link_dtype t,
                                reduce_op op) = 0;
  //! `out` holds size() blocks of `bytes`; `in` may be this rank's block of it.
  virtual void device_allgather(void* stream, int device, const void* in, void* out, std::size_t bytes) = 0;
  virtual void device_broadcast(void* stream, int device, void* data, std::size_t bytes, int root) = 0;
  virtual void device_send(void* stream, int device, int peer, const void* data, std::size_t bytes) = 0;
  virtual void device_recv(void* stream, int device, int peer, void* data, std::size_t bytes) = 0;
  //! Raises the error of a device-plane Work that failed, or a peer's failure notice
  //! (looked up at most every poll_interval()). Called by every fence.
  virtual void poll() = 0;
  //! A fence's deadline passed in `what`: aborts the Works in flight, tells the others.
  virtual void on_timeout(const char* what) noexcept = 0;

  // ---- host plane: TorchComm's ---------------------------------------------------------
  virtual void allreduce_f(std::span<float> v, reduce_op op) = 0;
  virtual void allreduce_d(std::span<double> v, reduce_op op) = 0;
  virtual void allreduce_i(std::span<std::int32_t> v, reduce_op op) = 0;
  virtual void allreduce_l(std::span<std::int64_t> v, reduce_op op) = 0;
  virtual void allgather_b(std::span<const std::byte> in, std::span<std::byte> out) = 0;
  virtual void broadcast_b(std::span<std::byte> v, int root) = 0;
  virtual void barrier() = 0;
  virtual void send(int peer, std::span<const std::byte> msg) = 0;
  virtual void recv(int peer, std::vector<std::byte>& buf) = 0;
  virtual void sendrecv(int peer, std::span<const std::byte> msg, std::vector<std::byte>& buf) = 0;
  //! Marks the group failed here and leaves the notice for the other ranks. Never throws.
  virtual void abort(std::string_view why) noexcept = 0;
};

}  // namespace commpact
