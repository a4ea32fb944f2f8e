// The CUDA side of commpact_hooks: the hooks' compressors in commpact's CUDA space over
// the DDP group (commpact_hooks_cuda.cu, compiled by nvcc). This interface names neither
// torch nor CUDA: nvcc cannot compile LibTorch 1.13's headers in C++20, so the module's
// C++ side (commpact_hooks.cpp) hands over what it took from torch: the group as a
// torch_group_link, PyTorch's caching allocator as two functions, and each bucket as a
// device pointer with its device and PyTorch's current stream.
#pragma once

#include <commpact/comm/agree.hpp>
#include <commpact/compress/codecs/tensor_layout.hpp>
#include <commpact/torch/group_link.hpp>

#include "feedback_by_parameter.hpp"

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string_view>

namespace commpact_hooks_cuda {

//! Stream-ordered device memory (commpact::cuda_allocator's shape; a stream is a
//! cudaStream_t): PyTorch's caching allocator.
struct allocator {
  void* (*alloc)(std::size_t bytes, void* stream, void* ctx) = nullptr;
  void (*free)(void* p, std::size_t bytes, void* stream, void* ctx) = nullptr;
  void* ctx = nullptr;
};

enum class method { gtopk, topk, powersgd, efsign, qsgd };

struct params {
  method m = method::gtopk;
  double density = 0.01;        // gtopk, topk
  float momentum = 0.0f;        // gtopk, topk, efsign, qsgd (error feedback's)
  int rank = 1;                 // powersgd: matrix_approximation_rank
  double min_rate = 2.0;        // powersgd: min_compression_rate
  std::uint32_t levels = 256;   // qsgd
  std::size_t qsgd_bucket = 512;
  std::uint64_t seed = 0;       // qsgd's stochastic rounding
};

//! A DDP bucket on the GPU: n floats at `data` on `device`, PyTorch's current `stream`.
struct bucket {
  float* data = nullptr;
  std::size_t n = 0;
  int device = 0;
  void* stream = nullptr;
};

//! One hook state's CUDA side: a TorchCudaComm on the first bucket's stream (every later
//! bucket must come on that stream) and one compressor per DDP bucket index, rebuilt when
//! the bucket's parameters, size or layout change. Each call queues its step on the stream.
//! Every method and reduce_dense return at once, the step in flight: its finish (one
//! fence for that step's own work, its status read, an error raised alike on every rank)
//! and commit run when the same bucket index comes again (the next DDP step: every step in
//! flight is finished then, in order) or at settle().
class state {
 public:
  state(std::shared_ptr<commpact::torch_group_link> link, params p, allocator a);
  ~state();
  state(const state&) = delete;
  state& operator=(const state&) = delete;

  //! Reduces the bucket in place with the state's method (powersgd: power_prepare first).
  //! `layout`: the bucket's tensors (efsign: a scale per row; powersgd: the matrices).
  //! `params`: its parameters; when they change (DDP's rebuild), the new compressor
  //! starts from their residuals (feedback_by_parameter.hpp; the steps in flight are
  //! finished first).
  void reduce(std::int64_t index, const bucket& b, const commpact::tensor_layout& layout,
              const commpact_hooks::bucket_params& params);
  //! Reduces the bucket in place to the plain mean (powersgd before start_powerSGD_iter).
  void reduce_dense(std::int64_t index, const bucket& b);
  //! powersgd: makes bucket index's compressor for `layout` when it has none or another
  //! layout; true when it is new (then set its first Q factors).
  bool power_prepare(std::int64_t index, const bucket& b, const commpact::tensor_layout& layout);
  bool is_compressed(std::int64_t index, std::size_t tensor) const;
  std::size_t rank_of(std::int64_t index, std::size_t tensor) const;
  //! Tensor `tensor`'s first Q (cols x r, column-major, host memory).
  void set_q_factor(std::int64_t index, std::size_t tensor, std::span<const float> q);

  //! Finishes and commits every step in flight (waits for their work on the host, under
  //! the deadline); raises the first one's error (the others are dropped).
  void settle();
  //! Whether a step is in flight.
  bool in_flight() const;

  //! The checks the C++ side makes over the group, here on the control plane (host words
  //! staged through pinned memory and fenced, on the stream and device of `b`): the group
  //! may be ProcessGroupNCCL, which refuses the CPU tensors of the C++ side's communicator.
  //! agree_uncounted: one allreduce (max) of `words`, left out of bytes_sent() (the hooks'
  //! own agreement, uncounted on the CPU side too); require_same: commpact::require_same,
  //! counted (ModelAverager's check of a round, counted on the CPU side too).
  void agree_uncounted(const bucket& b, std::span<std::int64_t> words);
  void require_same(const bucket& b, std::initializer_list<commpact::agreement_item> items);

  std::uint64_t bytes_sent() const;
  void abort(std::string_view why) noexcept;

 private:
  struct impl;
  std::unique_ptr<impl> p_;
};

}  // namespace commpact_hooks_cuda
