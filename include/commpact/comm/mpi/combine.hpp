// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file mpi/combine.hpp
//! The element-wise reduction MpiComm's own allreduces run (recursive doubling in
//! small_collectives.hpp, the ring in ring_allreduce.hpp): out[i] = op(a[i], b[i]).
//!
//! A header-only library runs at its users' flags, and GCC 12 at -O2 vectorises a plain
//! loop only when no runtime alias check and no epilogue is needed (see
//! kernels/host/simd.hpp), so the scalar loops this replaces ran 1.5-1.9x a raw
//! MPI_Allreduce at -O2 and vectorised only at -O3. This is written with the host
//! kernels' vector-extension plumbing (simd::vector_bytes, simd::load, simd::store):
//! each lane performs the scalar operation, so the result is the bits of the scalar loop
//! below at every optimisation level, with g++ and clang++:
//!
//!   sum: a[i] + b[i] (integers wrap, as MPI_SUM does, without signed overflow)
//!   min: std::min(a[i], b[i]) == (b[i] < a[i] ? b[i] : a[i])
//!   max: std::max(a[i], b[i]) == (a[i] < b[i] ? b[i] : a[i])
//!
//! min and max keep the operand order exactly (+0/-0, NaN); a sum of two NaNs carries
//! one of their payloads (x86 takes the first operand's, and compilers may commute an
//! addition, in scalar code as in vector code). Every rank combines through this one
//! function with the same operand order, so all ranks get the same bits. `out` may be
//! the same pointer as `a` or `b`; other overlap is not allowed. Part of MpiComm (include
//! commpact/comm/mpi_comm.hpp).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "../../concepts.hpp"
#include "../../kernels/host/simd.hpp"

namespace commpact::detail {

#if COMMPACT_HOST_SIMD
//! A vector of T as wide as the host kernels' vectors (vector_size of a dependent type).
template <class T>
struct mpi_vec {
  typedef T type __attribute__((vector_size(host::simd::vector_bytes)));
};

//! out[i] = op(a[i], b[i]) over [0, n - n % lanes) with vectors of V (element type E);
//! returns how many elements it did. S is the element type arithmetic runs in (the
//! unsigned twin of an integer type for sums).
template <class T, class S>
inline std::size_t mpi_combine_vec(T* out, const T* a, const T* b, std::size_t n, reduce_op op) noexcept {
  namespace simd = host::simd;
  using V = typename mpi_vec<S>::type;
  constexpr std::size_t L = simd::vector_bytes / sizeof(T);
  const std::size_t body = n - n % (2 * L);
  switch (op) {
    case reduce_op::sum:
      for (std::size_t i = 0; i < body; i += 2 * L) {
        const V x0 = simd::load<V>(a + i), y0 = simd::load<V>(b + i);
        const V x1 = simd::load<V>(a + i + L), y1 = simd::load<V>(b + i + L);
        simd::store(out + i, x0 + y0);
        simd::store(out + i + L, x1 + y1);
      }
      break;
    case reduce_op::min:
      for (std::size_t i = 0; i < body; i += 2 * L) {
        const V x0 = simd::load<V>(a + i), y0 = simd::load<V>(b + i);
        const V x1 = simd::load<V>(a + i + L), y1 = simd::load<V>(b + i + L);
        simd::store(out + i, y0 < x0 ? y0 : x0);
        simd::store(out + i + L, y1 < x1 ? y1 : x1);
      }
      break;
    case reduce_op::max:
      for (std::size_t i = 0; i < body; i += 2 * L) {
        const V x0 = simd::load<V>(a + i), y0 = simd::load<V>(b + i);
        const V x1 = simd::load<V>(a + i + L), y1 = simd::load<V>(b + i + L);
        simd::store(out + i, x0 < y0 ? y0 : x0);
        simd::store(out + i + L, x1 < y1 ? y1 : x1);
      }
      break;
  }
  return body;
}
#endif

//! out[i] = op(a[i], b[i]) for i in [0, n); see the file comment. T: float, double, or a
//! 32- or 64-bit integer.
template <class T>
inline void mpi_combine(T* out, const T* a, const T* b, std::size_t n, reduce_op op) noexcept {
  std::size_t i = 0;
#if COMMPACT_HOST_SIMD
  if constexpr (std::is_floating_point_v<T>) {
    i = mpi_combine_vec<T, T>(out, a, b, n, op);
  } else {
    // Sums wrap in the unsigned twin (no signed overflow); min and max compare as T.
    if (op == reduce_op::sum) i = mpi_combine_vec<T, std::make_unsigned_t<T>>(out, a, b, n, op);
    else i = mpi_combine_vec<T, T>(out, a, b, n, op);
  }
#endif
  switch (op) {
    case reduce_op::sum:
      if constexpr (std::is_integral_v<T>) {
        using U = std::make_unsigned_t<T>;
        for (; i < n; ++i) out[i] = static_cast<T>(static_cast<U>(a[i]) + static_cast<U>(b[i]));
      } else {
        for (; i < n; ++i) out[i] = a[i] + b[i];
      }
      break;
    case reduce_op::min:
      for (; i < n; ++i) out[i] = std::min(a[i], b[i]);
      break;
    case reduce_op::max:
      for (; i < n; ++i) out[i] = std::max(a[i], b[i]);
      break;
  }
}

}  // namespace commpact::detail
