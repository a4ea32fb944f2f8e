// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file rows_cast_vote.cuh
//! ops<cuda_space> (kernels/cuda/ops.cuh) inherits these rows: CastAllreduce's rows (cast_encode, cast_add,
//! cast_decode_mean), LinearCompressor's and Allreduce's (linear_encode, linear_decode, linear_feedback),
//! MajorityVote's and Vote's (signum_update, sign_vote). Each row implements the specification of
//! kernels/ops.hpp on the executor's stream.
//!
//! Bits. Every per-element formula is the host's own COMMPACT_HOST_DEVICE function
//! (host/cast.hpp's cast_encode_value and the codecs' to_code/from_code/add in
//! formulas/casts.hpp; host/linear_vote.hpp's signum_value, vote_block_valid, vote_value;
//! mean.hpp's mean_of), written in kernels/exact.hpp's uncontracted operations, so the
//! device computes what the host computes. sign_vote sums the scales in double in rank
//! order, as the host does (each block of the vote kernel repeats that short sum).
//!
//! Linear codecs: compress/decompress_add are host code, so the device rows run the
//! LinearCodecs commpact ships: randomk_codec (its indices are drawn on the host by
//! kernels/formulas/randomk.hpp's randomk_draw, as the host rows do, and copied into the
//! executor's scratch for the gather and the scatter; detail::gathers_randomk_draw<K> says
//! which codecs those are). Any other LinearCodec fails to compile on cuda_space with a
//! sentence naming it.
//!
//! Checked against its host twin by tests/cuda/test_cuda_rows_cast_vote.cu (docs/cuda.md,
//! "Status", says where it has run).

#if !defined(__CUDACC__)
#error "commpact/kernels/cuda/rows_cast_vote.cuh needs nvcc: include it from a .cu file only."
#endif

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "../../error.hpp"
#include "../../space/cuda.hpp"
#include "../formulas/randomk.hpp"
#include "../host/cast.hpp"
#include "../host/linear_vote.hpp"
#include "../mean.hpp"
#include "../status.hpp"
#include "check.cuh"
#include "vector.cuh"
#include "grid.cuh"

namespace commpact {

namespace cuda_kernels::cast_vote_detail {

using detail::vec_block;
using detail::vec_grid;

template <class Cast>
__global__ void cast_encode_kernel(const float* g, const float* r, std::uint16_t* codes, float* cand, std::size_t n) {
  for (const std::size_t i : cuda_kernels::grid_stride(n)) codes[i] = host::cast_encode_value<Cast>(g[i], r, i, cand);
}

template <class Cast>
__global__ void cast_add_kernel(const std::uint16_t* in, std::uint16_t* mine, std::size_t n) {
  for (const std::size_t i : cuda_kernels::grid_stride(n)) mine[i] = Cast::add(in[i], mine[i]);
}

//! flag |= 1 when some code is not finite (status too).
template <class Cast>
__global__ void cast_check_kernel(const std::uint16_t* sums, std::size_t n, std::uint32_t* flag,
                                  std::uint32_t* status) {
  bool bad = false;
  for (const std::size_t i : cuda_kernels::grid_stride(n)) bad |= !Cast::finite_code(sums[i]);
  if (__syncthreads_or(bad) && threadIdx.x == 0) {
    atomicOr(flag, 1u);
    atomicOr(status, static_cast<std::uint32_t>(status_nonfinite));
  }
}

template <class Cast>
__global__ void cast_decode_kernel(const std::uint16_t* sums, float* out, std::size_t n, int P,
                                   const std::uint32_t* flag) {
  if (*flag) return;
  for (const std::size_t i : cuda_kernels::grid_stride(n)) out[i] = mean_of(Cast::from_code(sums[i]), P);
}

//! next = signum_value(beta, m, g) (g when m is null); status |= nonfinite for a non-finite value.
__global__ void signum_kernel(float* next, const float* m, const float* g, std::size_t n, float beta,
                              std::uint32_t* status) {
  bool bad = false;
  for (const std::size_t i : cuda_kernels::grid_stride(n)) {
    const float v = m ? host::signum_value(beta, m[i], g[i]) : g[i];
    next[i] = v;
    bad |= !exact::finite(v);
  }
  if (__syncthreads_or(bad) && threadIdx.x == 0) atomicOr(status, static_cast<std::uint32_t>(status_nonfinite));
}

//! The vote: thread 0 of every block validates the P blocks and sums their scales in rank
//! order (as host::sign_vote); a malformed block makes block 0 set status_wire and every
//! block return. Else out[8b + j] = vote_value(votes, s), one sign byte b per thread.
__global__ void sign_vote_kernel(const unsigned char* blocks, std::size_t total_bytes, std::size_t block_bytes,
                                 std::size_t P, bool scaled, float* out, std::size_t n, std::uint32_t* status) {
  __shared__ float s_sh;
  __shared__ int ok_sh;
  if (threadIdx.x == 0) {
    int ok = 1;
    double scales = 0.0;
    for (std::size_t r = 0; r < P && ok; ++r) {
      const std::size_t off = r * block_bytes + host::vote_header_bytes;
      float s = 0.0f;
      ok = off <= total_bytes && host::vote_block_valid(blocks + r * block_bytes, total_bytes - off, n, s);
      scales = exact::add(scales, static_cast<double>(s));
    }
    ok_sh = ok;
    s_sh = scaled ? static_cast<float>(scales / static_cast<double>(P)) : 1.0f;
    if (!ok && blockIdx.x == 0) atomicOr(status, static_cast<std::uint32_t>(status_wire));
  }
  __syncthreads();
  if (!ok_sh) return;
  const float s = s_sh;
  const std::size_t nb = (n + 7) / 8;
  for (const std::size_t b : cuda_kernels::grid_stride(nb)) {
    int votes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (std::size_t r = 0; r < P; ++r) {
      const unsigned v = blocks[r * block_bytes + host::vote_header_bytes + 4 + b];
      for (unsigned j = 0; j < 8; ++j) votes[j] += ((v >> j) & 1u) ? -1 : 1;
    }
    for (std::size_t j = 0; j < 8 && 8 * b + j < n; ++j) out[8 * b + j] = host::vote_value(votes[j], s);
  }
}

//! block[j] = s acc[idx[j]] for j < m (random-k's compress); block[m] = 0. When status
//! holds nonfinite: block = 0 and block[m] = 1 (host::linear_encode).
__global__ void randomk_encode_kernel(const float* acc, const std::int32_t* idx, std::size_t m, float s,
                                      float* block, const std::uint32_t* status) {
  const bool bad = (*status & status_nonfinite) != 0;
  for (const std::size_t j : cuda_kernels::grid_stride(m + 1)) {
    if (j == m) block[j] = bad ? 1.0f : 0.0f;
    else block[j] = bad ? 0.0f : exact::mul(s, acc[idx[j]]);
  }
}

//! When block[m] = 0: block[j] = mean_of(block[j], P) for j < m, and status |= nonfinite
//! when a mean is not finite (finite inputs whose sum overflowed); else (thread 0 of
//! block 0) status |= nonfinite.
__global__ void linear_mean_kernel(float* block, std::size_t m, int P, std::uint32_t* status) {
  const bool flagged = block[m] != 0.0f;
  if (flagged) {
    if (blockIdx.x == 0 && threadIdx.x == 0) atomicOr(status, static_cast<std::uint32_t>(status_nonfinite));
    return;
  }
  for (const std::size_t j : cuda_kernels::grid_stride(m)) {
    block[j] = mean_of(block[j], P);
    if (!isfinite(block[j])) atomicOr(status, static_cast<std::uint32_t>(status_nonfinite));
  }
}

//! out = 0 when block[m] = 0 and the status is clear of nonfinite (the host leaves out
//! untouched otherwise).
__global__ void linear_zero_kernel(const float* block, std::size_t m, float* out, std::size_t n,
                                   const std::uint32_t* status) {
  if (block[m] != 0.0f || (*status & status_nonfinite)) return;
  for (const std::size_t i : cuda_kernels::grid_stride(n)) out[i] = 0.0f;
}

//! out[idx[j]] += block[j] (random-k's decompress_add into the zeroed out) when block[m] = 0
//! and the status is clear of nonfinite; indices outside [0, n) are skipped.
__global__ void randomk_decode_kernel(const float* block, std::size_t m, const std::int32_t* idx, float* out,
                                      std::size_t n, const std::uint32_t* status) {
  if (block[m] != 0.0f || (*status & status_nonfinite)) return;
  for (const std::size_t j : cuda_kernels::grid_stride(m)) {
    const std::int32_t i = idx[j];
    if (i >= 0 && static_cast<std::size_t>(i) < n) out[i] = exact::add(out[i], block[j]);
  }
}


//! A grid of at most 1024 blocks (the vote kernel repeats the scale sum per block).
inline unsigned vote_grid(std::size_t n) {
  const unsigned g = vec_grid(n);
  return g < 1024u ? g : 1024u;
}

template <class K>
inline constexpr bool device_linear_codec = commpact::detail::gathers_randomk_draw<std::remove_cvref_t<K>>;

}  // namespace cuda_kernels::cast_vote_detail

namespace cuda_rows {

//! Why a LinearCodec other than randomk_codec fails on the CUDA space (the codec is the K
//! of the instantiation the compiler names below the message).
#define COMMPACT_NO_LINEAR_KERNELS                                                                                \
  "commpact: this LinearCodec has no device kernels: ops<cuda_space>::linear_encode, linear_decode and "          \
  "linear_feedback run randomk_codec only (its compress and decompress_add are host code); write device kernels " \
  "for your codec in kernels/cuda/rows_cast_vote.cuh, or run LinearCompressor over a host communicator."

struct cast_vote {
  using exec = cuda_space::exec;
  template <class T>
  using span = cuda_span<T>;

  // ---- CastAllreduce (kernels/host/cast.hpp) ----------------------------------------
  template <class Cast>
  static void cast_encode(const exec& e, span<const float> g, span<const float> r, span<std::uint16_t> codes,
                          span<float> cand) {
    namespace kd = cuda_kernels::cast_vote_detail;
    const std::size_t n = g.size();
    require((r.empty() || r.size() == n) && codes.size() >= n && (cand.empty() || cand.size() >= n),
            "commpact::ops::cast_encode: g holds ", n, " values, the residual ", r.size(), ", codes ", codes.size(),
            ", cand ", cand.size(), "; pass a residual of n values or none, and outputs of at least n.");
    if (n == 0) return;
    kd::cast_encode_kernel<Cast><<<kd::vec_grid(n), kd::vec_block, 0, e.stream()>>>(
        cuda_access::ptr(g), r.empty() ? nullptr : cuda_access::ptr(r), cuda_access::ptr(codes),
        cand.empty() ? nullptr : cuda_access::ptr(cand), n);
    ck(cudaGetLastError(), "cast_encode");
  }
  template <class Cast>
  static void cast_add(const exec& e, span<const std::uint16_t> in, span<std::uint16_t> mine) {
    namespace kd = cuda_kernels::cast_vote_detail;
    require(in.size() >= mine.size(), "commpact::ops::cast_add: ", in.size(), " received codes for a chunk of ",
            mine.size(), "; pass at least as many.");
    if (mine.empty()) return;
    kd::cast_add_kernel<Cast><<<kd::vec_grid(mine.size()), kd::vec_block, 0, e.stream()>>>(
        cuda_access::ptr(in), cuda_access::ptr(mine), mine.size());
    ck(cudaGetLastError(), "cast_add");
  }
  template <class Cast>
  static void cast_decode_mean(const exec& e, span<const std::uint16_t> sums, span<float> out, int P,
                               span<std::uint32_t> status) {
    namespace kd = cuda_kernels::cast_vote_detail;
    const std::size_t n = sums.size();
    require(out.size() >= n, "commpact::ops::cast_decode_mean: ", n, " sums into ", out.size(),
            " values; pass an output of at least as many.");
    auto* flag = flag_word(e);
    ck(cudaMemsetAsync(flag, 0, sizeof(std::uint32_t), e.stream()), "cast_decode_mean");
    if (n == 0) return;
    kd::cast_check_kernel<Cast><<<kd::vec_grid(n), kd::vec_block, 0, e.stream()>>>(cuda_access::ptr(sums), n, flag,
                                                                                   cuda_access::ptr(status));
    kd::cast_decode_kernel<Cast><<<kd::vec_grid(n), kd::vec_block, 0, e.stream()>>>(
        cuda_access::ptr(sums), cuda_access::ptr(out), n, P, flag);
    ck(cudaGetLastError(), "cast_decode_mean");
  }

  // ---- LinearCompressor (Allreduce<C>) and MajorityVote (Vote<C>): host/linear_vote.hpp
  template <class K>
  static void linear_encode(const exec& e, K& codec, span<const float> acc, span<float> block,
                            span<const std::uint32_t> status) {
    static_assert(cuda_kernels::cast_vote_detail::device_linear_codec<K>, COMMPACT_NO_LINEAR_KERNELS);
    if constexpr (cuda_kernels::cast_vote_detail::device_linear_codec<K>) randomk_encode(e, codec, acc, block, status);
  }
  template <class K>
  static void linear_decode(const exec& e, const K& codec, span<float> block, span<float> out, int P,
                            span<std::uint32_t> status) {
    static_assert(cuda_kernels::cast_vote_detail::device_linear_codec<K>, COMMPACT_NO_LINEAR_KERNELS);
    if constexpr (cuda_kernels::cast_vote_detail::device_linear_codec<K>)
      randomk_decode(e, codec, block, out, P, status);
  }
  //! (approx and dense are unused: random-k has delivered(), so B A is a projection.)
  template <class K>
  static void linear_feedback(const exec& e, K& codec, span<float> acc, span<float> approx, span<float> dense) {
    static_assert(cuda_kernels::cast_vote_detail::device_linear_codec<K>, COMMPACT_NO_LINEAR_KERNELS);
    if constexpr (cuda_kernels::cast_vote_detail::device_linear_codec<K>) randomk_feedback(e, codec, acc);
  }
  static void signum_update(const exec& e, span<float> next, span<const float> m, span<const float> g, float beta,
                            span<std::uint32_t> status) {
    namespace kd = cuda_kernels::cast_vote_detail;
    const std::size_t n = g.size();
    require(next.size() == n && (m.empty() || m.size() == n), "commpact::ops::signum_update: g holds ", n,
            " values, next ", next.size(), ", m ", m.size(), "; pass equal lengths (m empty on the first step).");
    if (n == 0) return;
    kd::signum_kernel<<<kd::vec_grid(n), kd::vec_block, 0, e.stream()>>>(
        cuda_access::ptr(next), m.empty() ? nullptr : cuda_access::ptr(m), cuda_access::ptr(g), n, beta,
        cuda_access::ptr(status));
    ck(cudaGetLastError(), "signum_update");
  }
  static void sign_vote(const exec& e, span<const float> blocks, std::size_t block_floats, bool scaled,
                        span<float> out, span<std::uint32_t> status) {
    namespace kd = cuda_kernels::cast_vote_detail;
    const std::size_t n = out.size();
    const std::size_t P = block_floats == 0 ? 0 : blocks.size() / block_floats;
    require(P == 0 || block_floats * 4 >= host::vote_header_bytes, "commpact::ops::sign_vote: blocks of ",
            block_floats, " floats cannot hold the ", host::vote_header_bytes, "-byte frame header.");
    kd::sign_vote_kernel<<<kd::vote_grid((n + 7) / 8), kd::vec_block, 0, e.stream()>>>(
        reinterpret_cast<const unsigned char*>(cuda_access::ptr(blocks)), blocks.size_bytes(), block_floats * 4, P,
        scaled, cuda_access::ptr(out), n, cuda_access::ptr(status));
    ck(cudaGetLastError(), "sign_vote");
  }

 private:
  static void randomk_encode(const exec& e, commpact::detail::randomk_draw& codec, span<const float> acc,
                             span<float> block, span<const std::uint32_t> status) {
    namespace kd = cuda_kernels::cast_vote_detail;
    require(!block.empty(), "commpact::ops::linear_encode: the block is empty; it holds m values and the flag.");
    const std::size_t m = block.size() - 1, n = acc.size();
    const auto ix = codec.indices(n);
    require(ix.size() == m, "commpact::ops::linear_encode: random-k keeps ", ix.size(), " of ", n,
            " values, but the block holds ", m, "; pass a block of codec.size(n) + 1 floats.");
    // randomk_codec::compress's factor: the draw's.
    const float s = codec.factor(n, ix.size());
    const std::int32_t* idx = upload_indices(e, ix);
    kd::randomk_encode_kernel<<<kd::vec_grid(m + 1), kd::vec_block, 0, e.stream()>>>(
        cuda_access::ptr(acc), idx, m, s, cuda_access::ptr(block), cuda_access::ptr(status));
    ck(cudaGetLastError(), "linear_encode");
  }
  static void randomk_decode(const exec& e, const commpact::detail::randomk_draw& codec, span<float> block,
                             span<float> out, int P, span<std::uint32_t> status) {
    namespace kd = cuda_kernels::cast_vote_detail;
    require(!block.empty(), "commpact::ops::linear_decode: the block is empty; it holds m values and the flag.");
    const std::size_t m = block.size() - 1, n = out.size();
    const auto ix = codec.delivered();
    require(ix.size() == m, "commpact::randomk_codec::decompress_add: called for n = ", n, " with ", m,
            " values; compress() of the same step and length comes first.");
    const std::int32_t* idx = upload_indices(e, ix);
    const cudaStream_t s = e.stream();
    float* b = cuda_access::ptr(block);
    kd::linear_mean_kernel<<<kd::vec_grid(m), kd::vec_block, 0, s>>>(b, m, P, cuda_access::ptr(status));
    kd::linear_zero_kernel<<<kd::vec_grid(n), kd::vec_block, 0, s>>>(b, m, cuda_access::ptr(out), n,
                                                                     cuda_access::ptr(status));
    kd::randomk_decode_kernel<<<kd::vec_grid(m), kd::vec_block, 0, s>>>(b, m, idx, cuda_access::ptr(out), n,
                                                                        cuda_access::ptr(status));
    ck(cudaGetLastError(), "linear_decode");
  }
  static void randomk_feedback(const exec& e, const commpact::detail::randomk_draw& codec, span<float> acc) {
    // random-k has delivered(): B A is the projection onto those indices, zeroed here.
    const auto ix = codec.delivered();
    if (ix.empty()) return;
    const std::int32_t* idx = upload_indices(e, ix);
    ck(cuda_kernels::zero_delivered(cuda_access::ptr(acc), nullptr, acc.size(), idx, nullptr, ix.size(), e.stream()),
       "linear_feedback");
  }
  static void ck(cudaError_t err, const char* what) {
    cuda_kernels::detail::check(err, what, "commpact::ops<cuda_space>");
  }
  //! cast_decode_mean's flag word and the random-k indices: each in its own scratch slot
  //! of the executor, used only while its own row's work runs (the stream orders the rows).
  static std::uint32_t* flag_word(const exec& e) {
    return static_cast<std::uint32_t*>(e.scratch("cast_decode_mean", sizeof(std::uint32_t)));
  }
  static const std::int32_t* upload_indices(const exec& e, std::span<const std::int32_t> ix) {
    auto* d = static_cast<std::int32_t*>(e.scratch("randomk_indices", ix.size_bytes()));
    // From pageable memory the copy is staged before cudaMemcpyAsync returns: the codec
    // may draw again at once.
    if (!ix.empty())
      ck(cudaMemcpyAsync(d, ix.data(), ix.size_bytes(), cudaMemcpyHostToDevice, e.stream()), "random-k indices");
    return d;
  }
};

}  // namespace cuda_rows

}  // namespace commpact
