// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file rows_gossip.cuh
//! ops<cuda_space> (kernels/cuda/ops.cuh) inherits these rows: GossipMixer's rows (gossip_check,
//! gossip_agree_begin/end, gossip_pack, gossip_mix, choco_update). Each row implements the specification of kernels/ops.hpp on the executor's stream.
//!
//! Bits. One thread per model entry runs host/gossip.hpp's per-element formulas
//! (mix_init, mix_term, choco_term, choco_result: COMMPACT_HOST_DEVICE, in
//! kernels/exact.hpp's uncontracted operations) over the neighbours in ascending k, the
//! host's order, so x (and acc) equal the host's bit for bit. gossip_check's first
//! non-finite index is a minimum (atomicMin), the same index the host's scan finds.
//! The status words live in device memory; the rows that change state read words[0] and
//! words[2] on the device and do nothing unless both are 0.
//!
//! Checked against its host twin by tests/cuda/test_cuda_rows_cast_vote.cu (docs/cuda.md,
//! "Status", says where it has run).

#if !defined(__CUDACC__)
#error "commpact/kernels/cuda/rows_gossip.cuh needs nvcc: include it from a .cu file only."
#endif

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "../../error.hpp"
#include "../../space/cuda.hpp"
#include "../host/gossip.hpp"
#include "check.cuh"
#include "vector.cuh"
#include "grid.cuh"

namespace commpact {

namespace cuda_kernels::gossip_detail {

using detail::vec_block;
using detail::vec_grid;

__device__ __forceinline__ bool clear(const std::int64_t* w) { return w[0] == 0 && w[2] == 0; }

//! words = {0, n, 0} (gossip_check's start).
__global__ void check_begin(std::int64_t* words, std::size_t n) {
  if (!decision_lane()) return;
  words[0] = 0;
  words[1] = static_cast<std::int64_t>(n);
  words[2] = 0;
}
//! words[1] = min(words[1], i) over the non-finite x[i].
__global__ void check_scan(const float* x, std::size_t n, std::int64_t* words) {
  unsigned long long first = n;
  for (const std::size_t i : cuda_kernels::grid_stride(n))
  if (!exact::finite(x[i])) {
    first = i;
    break;  // later i of this thread are larger
  }
  if (first < n) atomicMin(reinterpret_cast<unsigned long long*>(&words[1]), first);
}
__global__ void check_end(std::int64_t* words, std::size_t n) {
  if (!decision_lane()) return;
  words[0] = words[1] != static_cast<std::int64_t>(n) ? host::gossip::flag_nonfinite : 0;
}

//! The agreement's two ends (host::gossip::agree_begin_words, agree_end_words).
__global__ void agree_begin(std::int64_t* words, std::int64_t round) {
  if (!decision_lane()) return;
  host::gossip::agree_begin_words(words, round);
}
__global__ void agree_end(std::int64_t* words) {
  if (!decision_lane()) return;
  host::gossip::agree_end_words(words);
}

//! D-PSGD's mix (host::gossip::mix_exact), one thread per entry, k ascending.
__global__ void mix_kernel(float* x, const float* recv, const double* w, std::size_t deg, double self_w, double* acc,
                           std::size_t n, const std::int64_t* words) {
  if (!clear(words)) return;
  for (const std::size_t i : cuda_kernels::grid_stride(n)) {
    double a = host::gossip::mix_init(self_w, x[i]);
    for (std::size_t k = 0; k < deg; ++k) a = host::gossip::mix_term(a, w[k], recv[k * n + i]);
    acc[i] = a;
    x[i] = static_cast<float>(a);
  }
}

//! CHOCO's update (host::gossip::choco_update), one thread per entry, k ascending.
__global__ void choco_kernel(float* x, float* hat_self, const float* q_self, float* hat_nb, const float* q_nb,
                             const double* w, std::size_t deg, double gamma, double* acc, std::size_t n,
                             const std::int64_t* words) {
  if (!clear(words)) return;
  for (const std::size_t i : cuda_kernels::grid_stride(n)) {
    const float hs = exact::add(hat_self[i], q_self[i]);
    hat_self[i] = hs;
    double a = 0.0;
    for (std::size_t k = 0; k < deg; ++k) {
      const float h = exact::add(hat_nb[k * n + i], q_nb[k * n + i]);
      hat_nb[k * n + i] = h;
      a = host::gossip::choco_term(a, w[k], h, hs);
    }
    acc[i] = a;
    x[i] = host::gossip::choco_result(x[i], gamma, a);
  }
}


}  // namespace cuda_kernels::gossip_detail

namespace cuda_rows {

struct gossip {
  using exec = cuda_space::exec;
  template <class T>
  using span = cuda_span<T>;

  static void gossip_check(const exec& e, span<const float> x, bool on, span<std::int64_t> words) {
    namespace kd = cuda_kernels::gossip_detail;
    require(words.size() >= host::gossip::status_words, "commpact::ops::gossip_check: ", words.size(),
            " status words; pass ", host::gossip::status_words, ".");
    const cudaStream_t s = e.stream();
    const std::size_t n = x.size();
    std::int64_t* w = cuda_access::ptr(words);
    cuda_kernels::decision_launch(kd::check_begin, s, w, n);
    if (on && n) kd::check_scan<<<kd::vec_grid(n), kd::vec_block, 0, s>>>(cuda_access::ptr(x), n, w);
    cuda_kernels::decision_launch(kd::check_end, s, w, n);
    ck(cudaGetLastError(), "gossip_check");
  }
  static void gossip_agree_begin(const exec& e, std::int64_t round, span<std::int64_t> words) {
    constexpr std::size_t need = host::gossip::status_words + host::gossip::agreement_words;
    require(words.size() >= need, "commpact::ops::gossip_agree_begin: ", words.size(), " words; pass ", need, ".");
    cuda_kernels::decision_launch(cuda_kernels::gossip_detail::agree_begin, e.stream(), cuda_access::ptr(words),
                                  round);
    ck(cudaGetLastError(), "gossip_agree_begin");
  }
  static void gossip_agree_end(const exec& e, span<std::int64_t> words) {
    constexpr std::size_t need = host::gossip::status_words + host::gossip::agreement_words;
    require(words.size() >= need, "commpact::ops::gossip_agree_end: ", words.size(), " words; pass ", need, ".");
    cuda_kernels::decision_launch(cuda_kernels::gossip_detail::agree_end, e.stream(), cuda_access::ptr(words));
    ck(cudaGetLastError(), "gossip_agree_end");
  }
  static void gossip_pack(const exec& e, span<const float> x, span<std::byte> msg) {
    require(msg.size() >= x.size_bytes(), "commpact::ops::gossip_pack: the message holds ", msg.size(),
            " bytes; the model needs ", x.size_bytes(), ".");
    if (x.empty()) return;
    ck(cudaMemcpyAsync(cuda_access::ptr(msg), cuda_access::ptr(x), x.size_bytes(), cudaMemcpyDeviceToDevice,
                       e.stream()),
       "gossip_pack");
  }
  static void gossip_mix(const exec& e, span<float> x, span<const std::byte> recv, span<const double> w, double self_w,
                         span<double> acc, span<const std::int64_t> words) {
    namespace kd = cuda_kernels::gossip_detail;
    const std::size_t n = x.size(), deg = w.size();
    require(recv.size() >= deg * x.size_bytes() && acc.size() >= n && words.size() >= host::gossip::status_words,
            "commpact::ops::gossip_mix: ", n, " values and ", deg, " neighbours need ", deg * x.size_bytes(),
            " received bytes and ", n, " doubles of scratch; got ", recv.size(), " and ", acc.size(), ".");
    if (n == 0) return;
    kd::mix_kernel<<<kd::vec_grid(n), kd::vec_block, 0, e.stream()>>>(
        cuda_access::ptr(x), reinterpret_cast<const float*>(cuda_access::ptr(recv)),
        deg ? cuda_access::ptr(w) : nullptr, deg, self_w, cuda_access::ptr(acc), n, cuda_access::ptr(words));
    ck(cudaGetLastError(), "gossip_mix");
  }
  static void choco_update(const exec& e, span<float> x, span<float> hat_self, span<const float> q_self,
                           span<float> hat_nb, span<const float> q_nb, span<const double> w, double gamma,
                           span<double> acc, span<const std::int64_t> words) {
    namespace kd = cuda_kernels::gossip_detail;
    const std::size_t n = x.size(), deg = w.size();
    require(hat_self.size() >= n && q_self.size() >= n && hat_nb.size() >= deg * n && q_nb.size() >= deg * n &&
                acc.size() >= n && words.size() >= host::gossip::status_words,
            "commpact::ops::choco_update: ", n, " values and ", deg, " neighbours need public copies of ", n,
            " and ", deg * n, " values (got ", hat_self.size(), ", ", hat_nb.size(), "), messages of as many (got ",
            q_self.size(), ", ", q_nb.size(), ") and ", n, " doubles of scratch (got ", acc.size(), ").");
    if (n == 0) return;
    kd::choco_kernel<<<kd::vec_grid(n), kd::vec_block, 0, e.stream()>>>(
        cuda_access::ptr(x), cuda_access::ptr(hat_self), cuda_access::ptr(q_self),
        deg ? cuda_access::ptr(hat_nb) : nullptr, deg ? cuda_access::ptr(q_nb) : nullptr,
        deg ? cuda_access::ptr(w) : nullptr, deg, gamma, cuda_access::ptr(acc), n, cuda_access::ptr(words));
    ck(cudaGetLastError(), "choco_update");
  }

 private:
  static void ck(cudaError_t err, const char* what) {
    cuda_kernels::detail::check(err, what, "commpact::ops<cuda_space>");
  }
};

}  // namespace cuda_rows

}  // namespace commpact
