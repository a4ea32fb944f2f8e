// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file simd.hpp
//! Portable SIMD plumbing for the host kernels (vector_ops.hpp, lowrank.hpp).
//!
//! A header-only library runs at its users' flags. GCC 12 at -O2 only vectorises loops
//! whose vector code replaces the scalar code entirely (the "very-cheap" cost model: no
//! runtime alias checks, no epilogue), and `#pragma omp simd` is ignored without
//! -fopenmp(-simd). So the kernels are written with GCC/clang vector extensions
//! (`__attribute__((vector_size))`): element-wise operations on them are the scalar
//! IEEE operations, lane by lane, so results are bit-identical to a scalar loop, and
//! they compile to packed SSE2 (x86-64 baseline), AVX (when the user enables it) or NEON
//! at every optimisation level from -O1. Other compilers get plain scalar loops.
//!
//! `opaque(v)` is an empty asm statement that hides a value from the optimiser; placed
//! on a product it stops the compiler from contracting `a + b * c` into one fused
//! multiply-add (GCC contracts across statements by default in GNU mode when FMA is
//! enabled; clang within an expression). So every kernel rounds each product and each
//! sum separately, the same on every rank whatever its -march.
//!
//! The hot passes are also compiled for wider vectors and chosen at run time (isa.hpp):
//! their bodies are templates on the vector width W in bytes (vf_w<W>, vu_w<W>), marked
//! always_inline so that they compile into the AVX2 or AVX-512 entry point that calls
//! them. Every helper that takes or returns a vector is always_inline for that reason.

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "../../error.hpp"
#include "isa.hpp"

#if defined(__SSE2__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define COMMPACT_HOST_STREAM 1
#else
#define COMMPACT_HOST_STREAM 0
#endif

namespace commpact::host::simd {

#if defined(__GNUC__) || defined(__clang__)
#define COMMPACT_HOST_SIMD 1
//! Bytes per vector: 32 with AVX, else 16 (SSE2, NEON).
#if defined(__AVX__)
inline constexpr std::size_t vector_bytes = 32;
#else
inline constexpr std::size_t vector_bytes = 16;
#endif
typedef float vf __attribute__((vector_size(vector_bytes)));
typedef std::uint32_t vu __attribute__((vector_size(vector_bytes)));
#else
#define COMMPACT_HOST_SIMD 0
inline constexpr std::size_t vector_bytes = 4;
#endif
//! Unrolls the next loop (a small constant trip count) completely also at -O2, where
//! GCC would otherwise keep per-column accumulators in memory.
//! Under nvcc (host code in a .cu file) the front end does not know GCC's pragma and
//! would warn (#1675) in the user's build: the warning is suppressed around it alone.
//! (clang's own CUDA mode knows the pragma; under nvcc with MSVC there is none.)
#if defined(__NVCC__) && (defined(__GNUC__) || defined(__clang__))
#define COMMPACT_UNROLL                                                                          \
  _Pragma("nv_diagnostic push") _Pragma("nv_diag_suppress 1675") _Pragma("GCC unroll 16") \
      _Pragma("nv_diagnostic pop")
#elif defined(__GNUC__) || defined(__clang__)
#define COMMPACT_UNROLL _Pragma("GCC unroll 16")
#else
#define COMMPACT_UNROLL
#endif

//! Floats per vector.
inline constexpr std::size_t lanes = vector_bytes / sizeof(float);

#if COMMPACT_HOST_SIMD
// 32- and 64-byte vectors in functions compiled without AVX pass in memory; the kernels
// never pass them across a call that is not inlined (the -Wpsabi note does not apply).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
//! Vectors of W bytes (W = 16, 32 or 64): the dispatched kernels' types.
template <std::size_t W>
struct vec_of {
  typedef float f __attribute__((vector_size(W)));
  typedef std::uint32_t u __attribute__((vector_size(W)));
  typedef std::int32_t i __attribute__((vector_size(W)));
};
template <std::size_t W>
using vf_w = typename vec_of<W>::f;
template <std::size_t W>
using vu_w = typename vec_of<W>::u;
template <std::size_t W>
using vi_w = typename vec_of<W>::i;
#endif

//! Hides v from the optimiser (no code): blocks floating-point contraction through it.
template <class T>
COMMPACT_ALWAYS_INLINE inline void opaque(T& v) noexcept {
#if defined(__clang__) && (defined(__x86_64__) || defined(__i386__)) && defined(__SSE2__)
  // clang checks the register's size against the function's own target, so a vector
  // wider than the user's flags allow passes unhidden: the dispatched bodies that use
  // it also turn contraction off (#pragma clang fp contract(off)).
  if constexpr (sizeof(T) <= vector_bytes) asm("" : "+x"(v));
#elif defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__)) && defined(__SSE2__)
  asm("" : "+x"(v));
#elif defined(__GNUC__) && defined(__aarch64__)
  asm("" : "+w"(v));
#elif defined(__GNUC__)
  asm("" : "+m"(v));
#else
  (void)v;
#endif
}

//! Unaligned load / store of a vector (one movups / vmovups).
template <class V, class T>
COMMPACT_ALWAYS_INLINE inline V load(const T* p) noexcept {
  V v;
  std::memcpy(&v, p, sizeof(V));
  return v;
}
template <class V, class T>
COMMPACT_ALWAYS_INLINE inline void store(T* p, const V& v) noexcept {
  std::memcpy(p, &v, sizeof(V));
}

#if COMMPACT_HOST_STREAM
//! Non-temporal store of a vector to a vector-aligned address: the line goes to memory
//! without being read first (no read-for-ownership). Call stream_fence() after a run.
inline void stream_store(float* p, const vf& v) noexcept {
#if defined(__AVX__)
  _mm256_stream_ps(p, v);
#else
  _mm_stream_ps(p, v);
#endif
}
inline void stream_fence() noexcept { _mm_sfence(); }
//! Non-temporal store of a W-byte vector to a 16-byte-aligned address, 16 bytes at a time
//! (SSE2 stores, so that the generic body compiles at every width).
template <std::size_t W>
COMMPACT_ALWAYS_INLINE inline void stream_store_w(float* p, const vf_w<W>& v) noexcept {
  COMMPACT_UNROLL
  for (std::size_t k = 0; k < W / 16; ++k) {
    __m128 q;
    std::memcpy(&q, reinterpret_cast<const char*>(&v) + 16 * k, 16);
    _mm_stream_ps(p + 4 * k, q);
  }
}
#endif
#if COMMPACT_HOST_SIMD
//! OR of the lanes of a W-byte vector of words.
template <std::size_t W>
COMMPACT_ALWAYS_INLINE inline std::uint32_t or_lanes(const vu_w<W>& v) noexcept {
  std::uint32_t r = 0;
  COMMPACT_UNROLL
  for (std::size_t l = 0; l < W / 4; ++l) r |= v[l];
  return r;
}
#pragma GCC diagnostic pop
#endif

//! A float is non-finite (Inf or NaN) iff its exponent bits are all ones, i.e. iff
//! (bits & 0x7fffffff) >= 0x7f800000, i.e. iff (bits & 0x7fffffff) + 0x00800000 has the
//! top bit set. OR-ing that over many values is order-free and branch-free.
inline constexpr std::uint32_t magnitude_mask = 0x7fffffffu;
inline constexpr std::uint32_t exponent_carry = 0x00800000u;
[[nodiscard]] inline std::uint32_t nonfinite_bit(float v) noexcept {
  std::uint32_t b;
  std::memcpy(&b, &v, sizeof b);
  return ((b & magnitude_mask) + exponent_carry) >> 31;
}

//! Raises invalid_argument when [a, a + na) and [b, b + nb) overlap without being the
//! same range (the kernels allow exact in-place use, not shifted overlap).
inline void check_no_partial_overlap(const char* fn, const char* an, const float* a, std::size_t na, const char* bn,
                                     const float* b, std::size_t nb) {
  if (a == b || na == 0 || nb == 0) return;
  const auto ua = reinterpret_cast<std::uintptr_t>(a), ub = reinterpret_cast<std::uintptr_t>(b);
  const bool overlap = ua < ub + nb * sizeof(float) && ub < ua + na * sizeof(float);
  require(!overlap, "commpact::host::", fn, ": ", an, " and ", bn,
          " overlap without being the same buffer; pass either the same span (in place) or disjoint spans.");
}

//! Runs K::run<W>(a...) at the widest vector width of isa::active(): the AVX2 and
//! AVX-512 entry points compile K's always_inline body for their instruction set.
#if COMMPACT_ISA_DISPATCH
template <class K, class... A>
COMMPACT_TARGET_AVX2 inline auto run_avx2(A... a) noexcept {
  return K::template run<32>(a...);
}
template <class K, class... A>
COMMPACT_TARGET_AVX512 inline auto run_avx512(A... a) noexcept {
  return K::template run<64>(a...);
}
#endif
template <class K, class... A>
inline auto dispatch(A... a) noexcept {
#if COMMPACT_ISA_DISPATCH
  switch (isa::active()) {
    case isa::level::avx512: return run_avx512<K>(a...);
    case isa::level::avx2: return run_avx2<K>(a...);
    default: break;
  }
#endif
  return K::template run<vector_bytes>(a...);
}

}  // namespace commpact::host::simd
