// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file isa.hpp
//! Run-time choice of the instruction set for the host hot passes (vector_ops.hpp, the
//! top-k's streaming passes, the fp16 conversions of half.hpp).
//!
//! A header-only library compiles at its users' flags, usually -O2 without -march: SSE2
//! on x86-64. On x86-64 with GCC or clang the hot passes are also compiled for AVX2 (with
//! F16C) and AVX-512F, in functions marked `__attribute__((target(...)))`, and each call
//! picks one by `active()`: a relaxed load of a level chosen once, at the first call, from
//! the CPU (`__builtin_cpu_supports` and CPUID, which also check that the OS saves the
//! wide registers). Every variant gives the same bits: element-wise IEEE operations, the
//! same order of any reduction, no fused multiply-add (simd.hpp's opaque()).
//!
//! \code
//! namespace isa = commpact::host::isa;
//! isa::active();                       // the level in use: base, avx2 or avx512
//! isa::level was = isa::force(isa::level::base);   // tests: run the SSE2 code
//! isa::force(was);
//! \endcode
//!
//! Turning it off: define COMMPACT_NO_ISA_DISPATCH before including commpact (only the
//! code of the user's flags is compiled), or set COMMPACT_ISA=base (or avx2, avx512) in
//! the environment to cap the level (read once; an unknown value is reported on stderr
//! and ignored). CUDA translation units (nvcc) and other architectures compile the base
//! code only.

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "../../error.hpp"

#if !defined(COMMPACT_NO_ISA_DISPATCH) && defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && \
    !defined(__CUDACC__)
#define COMMPACT_ISA_DISPATCH 1
#include <cpuid.h>
#include <immintrin.h>
//! Marks an entry point compiled for AVX2 and F16C.
#define COMMPACT_TARGET_AVX2 __attribute__((target("avx2,f16c")))
//! Marks an entry point compiled for AVX-512F (with AVX2 and F16C).
#define COMMPACT_TARGET_AVX512 __attribute__((target("avx512f,avx2,f16c")))
#else
#define COMMPACT_ISA_DISPATCH 0
#endif

#if defined(__GNUC__) || defined(__clang__)
#define COMMPACT_ALWAYS_INLINE [[gnu::always_inline]]
#else
#define COMMPACT_ALWAYS_INLINE
#endif

namespace commpact::host::isa {

//! The instruction sets of the dispatched passes, in increasing order.
enum class level : int {
  base = 0,    //!< the user's flags (SSE2 on x86-64 at -O2 without -march)
  avx2 = 1,    //!< AVX2 and F16C: 32-byte vectors, hardware fp16 conversion
  avx512 = 2,  //!< AVX-512F: 64-byte vectors
};

[[nodiscard]] inline const char* name(level l) noexcept {
  switch (l) {
    case level::avx512: return "avx512";
    case level::avx2: return "avx2";
    default: return "base";
  }
}

//! The most capable level this CPU and OS run (base without dispatch).
[[nodiscard]] inline level detected() noexcept {
#if COMMPACT_ISA_DISPATCH
  static const level l = [] {
    __builtin_cpu_init();
    unsigned a = 0, b = 0, c = 0, d = 0;
    const bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
    if (!f16c || !__builtin_cpu_supports("avx2")) return level::base;
    return __builtin_cpu_supports("avx512f") ? level::avx512 : level::avx2;
  }();
  return l;
#else
  return level::base;
#endif
}

namespace detail {
//! The level named by COMMPACT_ISA (capped at detected()), or detected() when unset.
inline level from_env() noexcept {
  const level top = detected();
  const char* e = std::getenv("COMMPACT_ISA");
  if (e == nullptr || *e == '\0') return top;
  for (level l : {level::base, level::avx2, level::avx512})
    if (std::strcmp(e, name(l)) == 0) return l < top ? l : top;
  std::fprintf(stderr, "commpact: COMMPACT_ISA=%s is not one of base, avx2, avx512; using %s.\n", e, name(top));
  return top;
}
inline std::atomic<int>& slot() noexcept {
  static std::atomic<int> s{static_cast<int>(from_env())};
  return s;
}
}  // namespace detail

//! The level the dispatched passes run now.
[[nodiscard]] inline level active() noexcept {
  return static_cast<level>(detail::slot().load(std::memory_order_relaxed));
}

//! Makes every later call run level l (for tests and benchmarks; not synchronised with
//! calls running on other threads); returns the level it replaces. Raises
//! invalid_argument when the CPU does not run l.
inline level force(level l) {
  require(l >= level::base && l <= detected(), "commpact::host::isa::force: this CPU runs levels up to ",
          name(detected()), "; ", name(l), " was asked for.");
  return static_cast<level>(detail::slot().exchange(static_cast<int>(l), std::memory_order_relaxed));
}

}  // namespace commpact::host::isa
