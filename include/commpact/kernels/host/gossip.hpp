// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file gossip.hpp
//! The host kernels of GossipMixer's data plane (D-PSGD and CHOCO-SGD, gossip/): the
//! non-finite check, packing the model into a message, D-PSGD's weighted mix and
//! CHOCO's update of the public copies and of the model. They are the reference of the
//! ops rows `gossip_check`, `gossip_pack`, `gossip_mix`, `choco_update` (kernels/ops.hpp).
//!
//! Every round keeps a status of three int64 words in the space's memory (six with the
//! agreement's, below):
//! words[0] the round's flag (0 clear; flag_nonfinite: a non-finite model; flag_short: a
//! codec wrote a message shorter than its known size; flag_length: a rank passed a buffer
//! of another length),
//! agreed over the ranks (below) so that every rank reads the same;
//! words[1] the first non-finite index of this rank's model (n when none); words[2]
//! 1 + k when neighbour k's message was malformed (0 when none). The kernels that change
//! the model or the mixer's state do nothing unless words[0] and words[2] are 0, so a
//! failed round changes nothing and no kernel throws.
//!
//! Three more words carry the agreement (one allreduce, max, of words[3..5]):
//! agree_begin writes {words[0], round, -round} there, and after the allreduce
//! agree_end sets words[0] to the agreed flag, or to flag_rounds when the ranks' round
//! counts differ (max round + max(-round) != 0: a rank restored alone from an older
//! checkpoint, which would mix stale state into its neighbours').

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "../../config.hpp"
#include "../exact.hpp"
#include "vector_ops.hpp"

namespace commpact::host::gossip {

//! The status words of a round (see the file comment).
inline constexpr std::size_t status_words = 3;
//! words[0] of a rank whose model holds a NaN or Inf (check, with the check on).
inline constexpr std::int64_t flag_nonfinite = 1;
//! words[0] when an unframed codec wrote a message of another length than its known size
//! (CHOCO's encode).
inline constexpr std::int64_t flag_short = 2;
//! words[0] of a rank whose buffer is not the registered length (GossipMixer::mix runs its
//! round on zeros, so that its neighbours' exchanges stay whole, and every rank raises).
inline constexpr std::int64_t flag_length = 3;
//! words[0] after the agreement when the ranks' round counts differ (agree_end).
inline constexpr std::int64_t flag_rounds = 4;
//! The words the agreement adds after the status words: {flag, round, -round}.
inline constexpr std::size_t agreement_words = 3;

//! True when the round may change the model: no rank flagged it, no message was malformed.
inline bool clear(std::span<const std::int64_t> words) { return words[0] == 0 && words[2] == 0; }

//! words = {flag_nonfinite when x holds a NaN/Inf (and `on`) else 0, its first index or n, 0}.
inline void check(std::span<const float> x, bool on, std::span<std::int64_t> words) {
  const std::size_t bad = on ? first_nonfinite(x) : x.size();
  words[0] = bad != x.size() ? flag_nonfinite : 0;
  words[1] = static_cast<std::int64_t>(bad);
  words[2] = 0;
}

//! words[3..5] = {words[0], round, -round}, to be allreduced (max).
COMMPACT_HOST_DEVICE inline void agree_begin_words(std::int64_t* words, std::int64_t round) {
  words[3] = words[0];
  words[4] = round;
  words[5] = -round;
}
//! After the allreduce of words[3..5]: words[0] = flag_rounds when the ranks' round
//! counts differ, else the agreed flag.
COMMPACT_HOST_DEVICE inline void agree_end_words(std::int64_t* words) {
  words[0] = words[4] + words[5] != 0 ? flag_rounds : words[3];
}
inline void agree_begin(std::int64_t round, std::span<std::int64_t> words) { agree_begin_words(words.data(), round); }
inline void agree_end(std::span<std::int64_t> words) { agree_end_words(words.data()); }

//! msg = the bytes of x (4n bytes).
inline void pack(std::span<const float> x, std::span<std::byte> msg) {
  if (!x.empty()) std::memcpy(msg.data(), x.data(), x.size_bytes());
}

// The per-entry formulas, shared with the CUDA rows (kernels/cuda/rows_gossip.cuh).
//! D-PSGD's start: self_w x in double.
COMMPACT_HOST_DEVICE inline double mix_init(double self_w, float x) {
  return exact::mul(self_w, static_cast<double>(x));
}
//! D-PSGD's term of neighbour k: acc + w_k x_k in double.
COMMPACT_HOST_DEVICE inline double mix_term(double acc, double wk, float xk) {
  return exact::add(acc, exact::mul(wk, static_cast<double>(xk)));
}
//! CHOCO's term of neighbour k: acc + w_k (hat_k - hat_self) in double.
COMMPACT_HOST_DEVICE inline double choco_term(double acc, double wk, float hat_k, float hat_self) {
  return exact::add(acc, exact::mul(wk, exact::sub(static_cast<double>(hat_k), static_cast<double>(hat_self))));
}
//! CHOCO's model: float(x + gamma acc), in double.
COMMPACT_HOST_DEVICE inline float choco_result(float x, double gamma, double acc) {
  return static_cast<float>(exact::add(static_cast<double>(x), exact::mul(gamma, acc)));
}

//! D-PSGD: when clear, x = float(w_self x + sum_k w[k] x_k) in double, neighbours in
//! ascending order; x_k is the k-th block of 4n bytes of recv. acc: n doubles of scratch.
inline void mix_exact(std::span<float> x, std::span<const std::byte> recv, std::span<const double> w, double self_w,
                      std::span<double> acc, std::span<const std::int64_t> words) {
  if (!clear(words)) return;
  const std::size_t n = x.size();
  for (std::size_t i = 0; i < n; ++i) acc[i] = mix_init(self_w, x[i]);
  for (std::size_t k = 0; k < w.size(); ++k) {
    const auto* xj = reinterpret_cast<const float*>(recv.data() + k * 4 * n);
    const double wk = w[k];
    for (std::size_t i = 0; i < n; ++i) acc[i] = mix_term(acc[i], wk, xj[i]);
  }
  for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<float>(acc[i]);
}

//! CHOCO-SGD: when clear, the public copies take the decoded messages (hat_self +=
//! q_self, hat_nb[k] += q_nb[k]; the k-th blocks of n floats), then
//! x = float(x + gamma sum_k w[k] (hat_nb[k] - hat_self)) with the sum in double.
inline void choco_update(std::span<float> x, std::span<float> hat_self, std::span<const float> q_self,
                         std::span<float> hat_nb, std::span<const float> q_nb, std::span<const double> w, double gamma,
                         std::span<double> acc, std::span<const std::int64_t> words) {
  if (!clear(words)) return;
  const std::size_t n = x.size(), deg = w.size();
  for (std::size_t i = 0; i < n; ++i) hat_self[i] += q_self[i];
  for (std::size_t j = 0; j < deg * n; ++j) hat_nb[j] += q_nb[j];
  for (std::size_t i = 0; i < n; ++i) acc[i] = 0.0;
  for (std::size_t k = 0; k < deg; ++k) {
    const float* h = hat_nb.data() + k * n;
    const double wk = w[k];
    for (std::size_t i = 0; i < n; ++i) acc[i] = choco_term(acc[i], wk, h[i], hat_self[i]);
  }
  for (std::size_t i = 0; i < n; ++i) x[i] = choco_result(x[i], gamma, acc[i]);
}

}  // namespace commpact::host::gossip
