// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file cuda_staged_comm.hpp
//! CudaStagedComm<C>: a host communicator (MpiComm, ThreadComm, any PointToPoint one) seen
//! from the CUDA space, staging device data through pinned host memory. So:
//! - MpiComm serves device buffers when MPI is not CUDA-aware;
//! - ThreadComm ranks, each with a stream of its own, run the CUDA space's algorithms at
//!   P > 1 on one GPU (NCCL cannot place two ranks of a communicator on one device), so
//!   every compressor's multi-rank path can be checked against the host on one GPU.
//!
//! <!-- snippet: grad=commpact::cuda_span<float> -->
//! \code
//! commpact::run_threads(3, [&](commpact::ThreadComm& c) {
//!   commpact::gTopK<commpact::TreeComm<commpact::CudaStagedComm<commpact::ThreadComm>>> g{
//!       commpact::CudaStagedComm{c}, {.density = 0.01}};
//!   g.reduce(grad);   // grad: a cuda_span<float> on this rank's stream
//! });
//! \endcode
//!
//! Data-plane calls on device spans (allreduce, allgather, broadcast, exchange, send_known,
//! recv_known) queue the copy device to pinned and fence the executor (the data must be
//! final: a host collective cannot wait on a stream), run C's call on host memory, and
//! queue the copy back on the stream (ordered before later work on it; the pinned memory
//! is not reused before the next call has fenced the stream again). Every fence ends at
//! the communicator's deadline (now + C's timeout(), when C has one): past it, C is
//! aborted (its peers stop waiting) and timeout_error raised. Errors of C (a peer's
//! failure, a timeout, a mismatch) are raised by the call itself, a CUDA failure as
//! device_error. Control-plane calls on host memory fence the stream, then run at once.
//! The pinned staging buffer grows to the largest message and is then reused: no
//! allocation after the first step. Bytes on the wire are C's, unchanged.
//!
//! Tests: tests/cuda/test_cuda_staged_comm.cu (every compressor's device path over it, against
//! the host; docs/cuda.md, "Status", says where it has run).

#if !defined(__CUDACC__)
#error "commpact/comm/cuda_staged_comm.hpp needs nvcc: include it from a .cu file only."
#endif

#include <cuda_runtime.h>

#include <cstddef>
#include <cstring>
#include <memory>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "../concepts.hpp"
#include "../error.hpp"
#include "../kernels/cuda/check.cuh"
#include "../space/cuda.hpp"
#include "known_size.hpp"

namespace commpact {

template <class C>
class CudaStagedComm {
  static_assert(diagnose_point_to_point<C>());

 public:
  using space_type = cuda_space;
  using inner_type = C;

  explicit CudaStagedComm(C comm, cuda_space::exec e = cuda_space::make_exec())
      : comm_(std::move(comm)), exec_(std::move(e)), pin_(std::make_shared<cuda_pinned_buffer<std::byte>>()) {}

  int rank() const { return comm_.rank(); }
  int size() const { return comm_.size(); }
  const cuda_space::exec& exec() const { return exec_; }
  //! C's timeout: the deadline of every fence this communicator makes.
  auto timeout() const
    requires requires(const C& c) { c.timeout(); }
  {
    return comm_.timeout();
  }
  void fence(deadline until = no_deadline()) { cuda_space::fence(exec_, until); }

  // ---- data plane: staged through pinned memory -------------------------------------
  template <class T>
  void allreduce(cuda_span<T> data, reduce_op op = reduce_op::sum) {
    T* h = down(cuda_span<const T>(data), 0, data.size_bytes());
    comm_.allreduce(std::span<T>(h, data.size()), op);
    up(data, h);
  }
  template <class T>
  void allgather(cuda_span<const T> in, cuda_span<T> out) {
    require(out.size() == in.size() * static_cast<std::size_t>(size()), "commpact::CudaStagedComm::allgather: the "
            "output holds ", out.size(), " values; it needs ", in.size(), " x ", size(), " ranks.");
    const std::size_t at = aligned(in.size_bytes());
    T* hin = down(in, 0, at + out.size_bytes());
    T* hout = reinterpret_cast<T*>(pinned_at(at));
    comm_.allgather(std::span<const T>(hin, in.size()), std::span<T>(hout, out.size()));
    up(out, hout);
  }
  template <class T>
  void broadcast(cuda_span<T> data, int root) {
    T* h = down(cuda_span<const T>(data), 0, data.size_bytes());
    comm_.broadcast(std::span<T>(h, data.size()), root);
    up(data, h);
  }
  void exchange(int peer, cuda_span<const std::byte> out, cuda_span<std::byte> in) {
    const std::size_t at = aligned(out.size_bytes());
    std::byte* hout = down(out, 0, at + in.size_bytes());
    std::byte* hin = pinned_at(at);
    commpact::exchange(comm_, peer, std::span<const std::byte>(hout, out.size()), std::span<std::byte>(hin, in.size()));
    up(in, hin);
  }
  void send_known(int peer, cuda_span<const std::byte> out) {
    std::byte* h = down(out, 0, out.size_bytes());
    commpact::send_known(comm_, peer, std::span<const std::byte>(h, out.size()));
  }
  void recv_known(int peer, cuda_span<std::byte> in) {
    sync();  // earlier copies up from the pinned memory have run
    grow(in.size_bytes());
    std::byte* h = pinned_at(0);
    commpact::recv_known(comm_, peer, std::span<std::byte>(h, in.size()));
    up(in, h);
  }

  // ---- control plane on host memory: wait for the stream, then at once -------------
  template <class T>
  void allreduce(std::span<T> data, reduce_op op = reduce_op::sum) {
    sync();
    comm_.allreduce(data, op);
  }
  template <class T>
  void allgather(std::span<const T> in, std::span<T> out) {
    sync();
    comm_.allgather(in, out);
  }
  template <class T>
  void broadcast(std::span<T> data, int root) {
    sync();
    comm_.broadcast(data, root);
  }
  void barrier() {
    sync();
    comm_.barrier();
  }
  void send(int peer, std::span<const std::byte> msg) {
    sync();
    comm_.send(peer, msg);
  }
  void recv(int peer, std::vector<std::byte>& buf) {
    sync();
    comm_.recv(peer, buf);
  }
  void sendrecv(int peer, std::span<const std::byte> msg, std::vector<std::byte>& buf) {
    sync();
    comm_.sendrecv(peer, msg, buf);
  }
  //! Marks the group failed at once: the others raise instead of waiting.
  void abort(std::string_view why) { comm_.abort(why); }

  C& inner() { return comm_; }
  const C& inner() const { return comm_; }

 private:
  static void check(cudaError_t e, const char* what) { cuda_kernels::detail::check(e, what, "commpact::CudaStagedComm"); }
  static std::size_t aligned(std::size_t b) { return (b + 255) / 256 * 256; }
  //! Fences the executor until the communicator's deadline; past it, aborts C (its
  //! peers stop waiting) and raises timeout_error.
  void sync() {
    try {
      cuda_space::fence(exec_, comm_deadline(comm_));
    } catch (const timeout_error& e) {
      comm_.abort(e.what());
      throw;
    }
  }
  //! Grows the pinned buffer to `need` bytes; growing frees the old storage, so the
  //! stream is fenced first (a queued copy up may still read it).
  void grow(std::size_t need) {
    if (need <= pin_->size()) return;
    sync();
    pin_->resize(need);
  }
  std::byte* pinned_at(std::size_t at) { return pin_->view().data() + at; }

  //! Copies src to the pinned buffer (grown to `need` bytes) at byte offset `at`, queued
  //! behind the work on the stream, and fences once; returns the host copy.
  template <class T>
  T* down(cuda_span<const T> src, std::size_t at, std::size_t need) {
    grow(need);
    std::byte* h = pinned_at(at);
    if (!src.empty())
      check(cudaMemcpyAsync(h, cuda_access::ptr(src), src.size_bytes(), cudaMemcpyDeviceToHost, exec_.stream()),
            "cudaMemcpyAsync (device to pinned)");
    sync();
    return reinterpret_cast<T*>(h);
  }
  //! Queues the copy of the host values back into dst on the stream.
  template <class T>
  void up(cuda_span<T> dst, const T* h) {
    if (dst.empty()) return;
    check(cudaMemcpyAsync(cuda_access::ptr(dst), h, dst.size_bytes(), cudaMemcpyHostToDevice, exec_.stream()),
          "cudaMemcpyAsync (pinned to device)");
  }

  C comm_;
  cuda_space::exec exec_;
  std::shared_ptr<cuda_pinned_buffer<std::byte>> pin_;  // shared by the copies of one communicator
};

template <class C>
CudaStagedComm(C) -> CudaStagedComm<C>;

}  // namespace commpact
