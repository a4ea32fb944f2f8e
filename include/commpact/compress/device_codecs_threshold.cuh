// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file device_codecs_threshold.cuh
//! device_codec<threshold_codec> (included by device_codecs.cuh): the hard
//! threshold on the device, its kernels in kernels/cuda/codecs_threshold.cuh. The number of
//! entries sent is known on the device only: the frame header's payload length is written
//! there, and clear_delivered reads the count there. The host codec's statistics
//! (last_threshold, last_passed) are not updated by the device.
//!
//! Checked against its host twin by tests/cuda/test_cuda_codec_leaves.cu,
//! tests/cuda/test_cuda_codecs.cu (docs/cuda.md, "Status", says where it has run).

#if !defined(__CUDACC__)
#error "commpact/compress/device_codecs_threshold.cuh needs nvcc: include it from a .cu file only."
#endif

#include <cstddef>
#include <cstdint>

#include "../error.hpp"
#include "../kernels/cuda/codecs_threshold.cuh"
#include "../kernels/cuda/ops.cuh"
#include "../space/cuda.hpp"
#include "../wire/codec_frame.hpp"
#include "device_codecs.cuh"
#include "codecs/sparsifiers.hpp"

namespace commpact {

//! threshold_codec on the CUDA space. One object per compressor (CodecCompressor keeps
//! it): the masked copy, the selection of the cap, the scan and its CUB storage, the
//! count, all grow-only.
template <>
struct device_codec<threshold_codec> {
  static constexpr bool payload_entries = true;  // topk_codec's entries (count on the device); approx unwritten
  using exec = cuda_space::exec;
  template <class T>
  using span = cuda_span<T>;

  void encode_frame(const exec& e, threshold_codec& codec, span<const float> acc, span<float> block, frame::header h,
                    span<float> /*approx: the codec delivers indices*/, span<const std::uint32_t> status) {
    namespace kc = cuda_kernels::codec;
    delivered_ = nullptr, cap_ = 0;
    if (h.flags != 0) {
      detail::cuda_finish_frame(e, block, h, 0, status);
      return;
    }
    const std::size_t n = acc.size(), cap = codec.capacity(n);
    const float t = codec.lambda();
    require(cap >= 1 && block.size() >= kc::header_words + 2 * cap, "commpact::threshold_codec: a block of ",
            block.size() * 4, " bytes cannot hold the cap of ", cap, " entries behind the frame header.");
    const cudaStream_t s = e.stream();
    std::size_t scan_bytes = 0;
    detail::cuda_codec_check(kc::threshold_scan_bytes(cap, scan_bytes), "threshold scan (size query)");
    w_.resize(n, e), idx_.resize(cap, e), val_.resize(cap, e), flag_.resize(cap, e), pos_.resize(cap, e), count_.resize(1, e);
    scan_tmp_.resize(scan_bytes ? scan_bytes : 1, e);
    kc::threshold_mask<<<kc::grid_for(n), kc::block_threads, 0, s>>>(cuda_access::ptr(acc), n, t, cuda_access::ptr(w_.view()));
    detail::cuda_codec_check(cudaGetLastError(), "threshold_mask");
    ops<cuda_space>::topk_abs(e, w_.cview(), cap, idx_.view(), val_.view(), ws_);
    kc::threshold_flags<<<kc::grid_for(cap), kc::block_threads, 0, s>>>(cuda_access::ptr(val_.cview()), cap, t,
                                                                        cuda_access::ptr(flag_.view()));
    detail::cuda_codec_check(cudaGetLastError(), "threshold_flags");
    std::size_t tb = scan_tmp_.size();
    detail::cuda_codec_check(cub::DeviceScan::ExclusiveSum(cuda_access::ptr(scan_tmp_.view()), tb,
                                                           cuda_access::ptr(flag_.cview()), cuda_access::ptr(pos_.view()),
                                                           static_cast<int>(cap), s),
                             "threshold scan");
    auto* payload = reinterpret_cast<std::uint32_t*>(cuda_access::ptr(block)) + kc::header_words;
    kc::threshold_compact<<<kc::grid_for(cap), kc::block_threads, 0, s>>>(
        cuda_access::ptr(idx_.cview()), cuda_access::ptr(val_.cview()), cuda_access::ptr(flag_.cview()),
        cuda_access::ptr(pos_.cview()), cap, payload, cuda_access::ptr(count_.view()));
    detail::cuda_codec_check(cudaGetLastError(), "threshold_compact");
    delivered_ = reinterpret_cast<const std::int32_t*>(payload), cap_ = cap;
    detail::cuda_finish_frame(e, block, h, 0, status, cuda_access::ptr(count_.cview()), 8);
  }

  //! As topk_codec's, with at most capacity(n) entries per block.
  static void decode_sum(const exec& e, const threshold_codec& codec, span<const float> blocks,
                         std::size_t block_floats, span<float> sum, span<std::uint32_t> status) {
    detail::cuda_sparse_decode_sum(e, "threshold_codec", codec.capacity(sum.size()), blocks, block_floats, sum, status);
  }

  void clear_delivered(const exec& e, const threshold_codec&, span<float> residual, span<float> velocity) const {
    namespace kc = cuda_kernels::codec;
    require(velocity.empty() || velocity.size() == residual.size(), "commpact::threshold_codec: the velocity holds ",
            velocity.size(), " values but the residual ", residual.size(), ".");
    if (!delivered_ || cap_ == 0) return;
    kc::threshold_clear<<<kc::grid_for(cap_), kc::block_threads, 0, e.stream()>>>(
        cuda_access::ptr(residual), velocity.empty() ? nullptr : cuda_access::ptr(velocity), residual.size(),
        delivered_, cuda_access::ptr(count_.cview()), cap_);
    detail::cuda_codec_check(cudaGetLastError(), "threshold_clear");
  }

  //! Every device buffer (allocation checks: grown at the first step only).
  template <class Out>
  void add_signature(Out& s) const {
    s.emplace_back(ws_.data(), ws_.capacity_bytes());
    s.emplace_back(w_.data(), w_.capacity());
    s.emplace_back(idx_.data(), idx_.capacity());
    s.emplace_back(val_.data(), val_.capacity());
    s.emplace_back(flag_.data(), flag_.capacity());
    s.emplace_back(pos_.data(), pos_.capacity());
    s.emplace_back(count_.data(), count_.capacity());
    s.emplace_back(scan_tmp_.data(), scan_tmp_.capacity());
  }

 private:
  ops<cuda_space>::topk_workspace ws_;
  cuda_buffer<float> w_, val_;
  cuda_buffer<std::int32_t> idx_;
  cuda_buffer<std::uint32_t> flag_, pos_, count_;
  cuda_buffer<unsigned char> scan_tmp_;
  const std::int32_t* delivered_ = nullptr;  // this rank's block's indices (count_ of them)
  std::size_t cap_ = 0;
};

}  // namespace commpact
