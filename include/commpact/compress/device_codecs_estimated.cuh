// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file device_codecs_estimated.cuh
//! device_codec<gaussiank_codec> and device_codec<dgc_codec>
//! (included by device_codecs.cuh): threshold sparsifiers whose threshold is estimated
//! on the device, kernels in kernels/cuda/codecs_estimated.cuh. The estimate and its
//! adjustments stay on the device (an estimate_state); then threshold_codec's selection
//! with that threshold: mask, topk_abs of the cap, compaction with the count on the device,
//! frame_finish with the device's length; clear_delivered reads the count there.
//!
//! | codec | estimate on the device | then |
//! |---|---|---|
//! | gaussiank_codec | gaussiank_moments (the sums in double in kernels/fixed_sum.hpp's shape, as the host, z from the host), then `rounds - 1` times estimate_count (strict) ending in gaussiank_decide | the selection of |v_i| > t, cap floor(cap_factor k) |
//! | dgc_codec | dgc_sample (random_stream replayed), topk_abs of the sample_rank(m) largest samples, dgc_kth, then `iters` times estimate_count ending in dgc_decide | the selection of |v_i| >= t, cap k |
//!
//! The host codec's statistics (last_threshold, last_passed, last_adjustments) are not
//! updated by the device.
//!
//! Checked against its host twin by tests/cuda/test_cuda_codecs_estimated.cu (docs/cuda.md,
//! "Status", says where it has run).

#if !defined(__CUDACC__)
#error "commpact/compress/device_codecs_estimated.cuh needs nvcc: include it from a .cu file only."
#endif

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "../error.hpp"
#include "../kernels/cuda/codecs_estimated.cuh"
#include "../kernels/cuda/codecs_threshold.cuh"
#include "../kernels/cuda/ops.cuh"
#include "../space/cuda.hpp"
#include "../wire/codec_frame.hpp"
#include "device_codecs.cuh"
#include "codecs/sparsifiers.hpp"

namespace commpact {

namespace detail {

//! The part of gaussiank_codec's and dgc_codec's kernels that follows the estimate: the
//! selection of the entries passing the device's threshold under the cap (threshold_codec's
//! kernels), decode_sum and clear_delivered. Every buffer grow-only.
template <class Codec>
struct cuda_estimated_kernels {
  static constexpr bool payload_entries = true;  // topk_codec's entries (count on the device); approx unwritten
  using exec = cuda_space::exec;
  template <class T>
  using span = cuda_span<T>;
  static constexpr const char* who = std::is_same_v<Codec, gaussiank_codec> ? "gaussiank_codec" : "dgc_codec";

  //! As threshold_codec's, with at most capacity(n) entries per block.
  static void decode_sum(const exec& e, const Codec& codec, span<const float> blocks, std::size_t block_floats,
                         span<float> sum, span<std::uint32_t> status) {
    cuda_sparse_decode_sum(e, who, codec.capacity(sum.size()), blocks, block_floats, sum, status);
  }

  void clear_delivered(const exec& e, const Codec&, span<float> residual, span<float> velocity) const {
    namespace kc = cuda_kernels::codec;
    require(velocity.empty() || velocity.size() == residual.size(), "commpact::", who, ": the velocity holds ",
            velocity.size(), " values but the residual ", residual.size(), ".");
    if (!delivered_ || cap_ == 0) return;
    kc::threshold_clear<<<kc::grid_for(cap_), kc::block_threads, 0, e.stream()>>>(
        cuda_access::ptr(residual), velocity.empty() ? nullptr : cuda_access::ptr(velocity), residual.size(),
        delivered_, cuda_access::ptr(count_.cview()), cap_);
    cuda_codec_check(cudaGetLastError(), "estimated threshold clear");
  }

  //! Every device buffer (allocation checks: grown at the first step only).
  template <class Out>
  void add_signature(Out& s) const {
    s.emplace_back(ws_.data(), ws_.capacity_bytes());
    s.emplace_back(w_.data(), w_.capacity());
    s.emplace_back(val_.data(), val_.capacity());
    s.emplace_back(smp_.data(), smp_.capacity());
    s.emplace_back(sval_.data(), sval_.capacity());
    s.emplace_back(idx_.data(), idx_.capacity());
    s.emplace_back(sidx_.data(), sidx_.capacity());
    s.emplace_back(flag_.data(), flag_.capacity());
    s.emplace_back(pos_.data(), pos_.capacity());
    s.emplace_back(count_.data(), count_.capacity());
    s.emplace_back(scan_tmp_.data(), scan_tmp_.capacity());
    s.emplace_back(state_.data(), state_.capacity());
    s.emplace_back(mom_.data(), mom_.capacity());
  }

 protected:
  //! Checks the block, sizes the buffers for n and the cap; false (the frame finished
  //! empty) when h.flags is set.
  bool begin(const exec& e, const Codec& codec, std::size_t n, span<float> block, const frame::header& h,
             span<const std::uint32_t> status) {
    namespace kc = cuda_kernels::codec;
    delivered_ = nullptr, cap_ = 0;
    if (h.flags != 0) {
      cuda_finish_frame(e, block, h, 0, status);
      return false;
    }
    const std::size_t cap = codec.capacity(n);
    require(cap >= 1 && block.size() >= kc::header_words + 2 * cap, "commpact::", who, ": a block of ",
            block.size() * 4, " bytes cannot hold the cap of ", cap, " entries behind the frame header.");
    std::size_t scan_bytes = 0;
    cuda_codec_check(kc::threshold_scan_bytes(cap, scan_bytes), "estimated threshold scan (size query)");
    w_.resize(n, e), idx_.resize(cap, e), val_.resize(cap, e), flag_.resize(cap, e), pos_.resize(cap, e), count_.resize(1, e);
    scan_tmp_.resize(scan_bytes ? scan_bytes : 1, e), state_.resize(1, e);
    return true;
  }

  //! The entries of acc passing the state's threshold (strict: |v| > t, else |v| >= t), at
  //! most capacity(n) of them (the largest), compacted into the payload; the frame finished
  //! with the device's count.
  void select(const exec& e, const Codec& codec, span<const float> acc, bool strict, span<float> block,
              const frame::header& h, span<const std::uint32_t> status) {
    namespace kc = cuda_kernels::codec;
    const std::size_t n = acc.size(), cap = codec.capacity(n);
    const cudaStream_t s = e.stream();
    kc::estimate_mask<<<kc::grid_for(n), kc::block_threads, 0, s>>>(cuda_access::ptr(acc), n, strict, state(),
                                                                    cuda_access::ptr(w_.view()));
    cuda_codec_check(cudaGetLastError(), "estimate_mask");
    ops<cuda_space>::topk_abs(e, w_.cview(), cap, idx_.view(), val_.view(), ws_);
    kc::estimate_flags<<<kc::grid_for(cap), kc::block_threads, 0, s>>>(cuda_access::ptr(val_.cview()), cap, strict,
                                                                       state(), cuda_access::ptr(flag_.view()));
    cuda_codec_check(cudaGetLastError(), "estimate_flags");
    std::size_t tb = scan_tmp_.size();
    cuda_codec_check(
        cub::DeviceScan::ExclusiveSum(cuda_access::ptr(scan_tmp_.view()), tb, cuda_access::ptr(flag_.cview()),
                                      cuda_access::ptr(pos_.view()), static_cast<int>(cap), s),
        "estimated threshold scan");
    auto* payload = reinterpret_cast<std::uint32_t*>(cuda_access::ptr(block)) + kc::header_words;
    kc::threshold_compact<<<kc::grid_for(cap), kc::block_threads, 0, s>>>(
        cuda_access::ptr(idx_.cview()), cuda_access::ptr(val_.cview()), cuda_access::ptr(flag_.cview()),
        cuda_access::ptr(pos_.cview()), cap, payload, cuda_access::ptr(count_.view()));
    cuda_codec_check(cudaGetLastError(), "threshold_compact");
    delivered_ = reinterpret_cast<const std::int32_t*>(payload), cap_ = cap;
    cuda_finish_frame(e, block, h, 0, status, cuda_access::ptr(count_.cview()), 8);
  }

  //! `rounds` counts of the entries passing the state's threshold, each ending in
  //! decide(state, count) (the count's last block): the loop runs on the device, no count
  //! reaches the host.
  template <class Decide>
  void adjust(const exec& e, span<const float> acc, bool strict, int rounds, Decide decide) {
    namespace kc = cuda_kernels::codec;
    const std::size_t n = acc.size();
    for (int r = 0; r < rounds; ++r) {
      kc::estimate_count<<<kc::grid_for(n), kc::block_threads, 0, e.stream()>>>(cuda_access::ptr(acc), n, strict,
                                                                                state(), decide);
      cuda_codec_check(cudaGetLastError(), "estimate_count");
    }
  }

  cuda_kernels::codec::estimate_state* state() {
    return reinterpret_cast<cuda_kernels::codec::estimate_state*>(cuda_access::ptr(state_.view()));
  }

  ops<cuda_space>::topk_workspace ws_;
  cuda_buffer<float> w_, val_, smp_, sval_;
  cuda_buffer<std::int32_t> idx_, sidx_;
  cuda_buffer<std::uint32_t> flag_, pos_, count_;
  cuda_buffer<unsigned char> scan_tmp_;
  cuda_buffer<cuda_kernels::codec::estimate_state> state_;
  cuda_buffer<fixed_sum::double2_sum> mom_;  // Gaussian-k's moments: the fixed-shape sum's levels
  const std::int32_t* delivered_ = nullptr;  // this rank's block's indices (count_ of them)
  std::size_t cap_ = 0;
};

}  // namespace detail

//! gaussiank_codec on the CUDA space (see the file comment). One object per compressor.
template <>
struct device_codec<gaussiank_codec> : detail::cuda_estimated_kernels<gaussiank_codec> {
  void encode_frame(const exec& e, gaussiank_codec& codec, span<const float> acc, span<float> block, frame::header h,
                    span<float> /*approx: the codec delivers indices*/, span<const std::uint32_t> status) {
    namespace kc = cuda_kernels::codec;
    const std::size_t n = acc.size();
    if (!begin(e, codec, n, block, h, status)) return;
    const cudaStream_t s = e.stream();
    mom_.resize(kc::gaussiank_scratch(n) ? kc::gaussiank_scratch(n) : 1, e);
    detail::cuda_codec_check(kc::gaussiank_moments(cuda_access::ptr(acc), n, codec.z(), state(),
                                                   cuda_access::ptr(mom_.view()), s),
                             "gaussiank_moments");
    adjust(e, acc, true, codec.rounds() - 1, kc::gaussiank_decide{codec.k(n)});
    select(e, codec, acc, true, block, h, status);
  }
};

//! dgc_codec on the CUDA space (see the file comment). One object per compressor.
template <>
struct device_codec<dgc_codec> : detail::cuda_estimated_kernels<dgc_codec> {
  void encode_frame(const exec& e, dgc_codec& codec, span<const float> acc, span<float> block, frame::header h,
                    span<float> /*approx: the codec delivers indices*/, span<const std::uint32_t> status) {
    namespace kc = cuda_kernels::codec;
    const std::size_t n = acc.size();
    if (!begin(e, codec, n, block, h, status)) return;
    const std::size_t m = codec.samples(n), ks = codec.sample_rank(m);
    smp_.resize(m, e), sidx_.resize(ks, e), sval_.resize(ks, e);
    const cudaStream_t s = e.stream();
    kc::dgc_sample<<<kc::grid_for(m), kc::block_threads, 0, s>>>(cuda_access::ptr(acc), n, m, codec.stream(),
                                                                 cuda_access::ptr(smp_.view()), state());
    detail::cuda_codec_check(cudaGetLastError(), "dgc_sample");
    ops<cuda_space>::topk_abs(e, smp_.cview(), ks, sidx_.view(), sval_.view(), ws_);
    kc::dgc_kth<<<kc::grid_for(ks), kc::block_threads, 0, s>>>(cuda_access::ptr(sval_.cview()), ks, state());
    detail::cuda_codec_check(cudaGetLastError(), "dgc_kth");
    adjust(e, acc, false, codec.iters(), kc::dgc_decide{codec.floor_count(n), static_cast<float>(codec.lower())});
    select(e, codec, acc, false, block, h, status);
  }
};

}  // namespace commpact
