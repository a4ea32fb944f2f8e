// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file exact.hpp
//! One IEEE operation each, on the host and on a CUDA device alike: the arithmetic that
//! per-element formulas shared by a host kernel and its device twin are written in, so
//! both run the same operations in the same order and round the same way. On the host
//! they are the plain operators (nothing changes for the compiler); under nvcc's device
//! pass they are the __fadd_rn family, which nvcc never contracts into an FMA. Also the
//! bits of a float without std::bit_cast (not callable from device code).

#include <cstdint>
#if !defined(__CUDA_ARCH__)
#include <bit>
#endif

#include "../config.hpp"

namespace commpact::exact {

#if defined(__CUDA_ARCH__)
COMMPACT_HOST_DEVICE inline float add(float a, float b) { return __fadd_rn(a, b); }
COMMPACT_HOST_DEVICE inline float sub(float a, float b) { return __fsub_rn(a, b); }
COMMPACT_HOST_DEVICE inline float mul(float a, float b) { return __fmul_rn(a, b); }
COMMPACT_HOST_DEVICE inline double add(double a, double b) { return __dadd_rn(a, b); }
COMMPACT_HOST_DEVICE inline double sub(double a, double b) { return __dsub_rn(a, b); }
COMMPACT_HOST_DEVICE inline double mul(double a, double b) { return __dmul_rn(a, b); }
COMMPACT_HOST_DEVICE inline std::uint32_t bits(float f) { return __float_as_uint(f); }
COMMPACT_HOST_DEVICE inline float from_bits(std::uint32_t b) { return __uint_as_float(b); }
#else
COMMPACT_HOST_DEVICE inline float add(float a, float b) { return a + b; }
COMMPACT_HOST_DEVICE inline float sub(float a, float b) { return a - b; }
COMMPACT_HOST_DEVICE inline float mul(float a, float b) { return a * b; }
COMMPACT_HOST_DEVICE inline double add(double a, double b) { return a + b; }
COMMPACT_HOST_DEVICE inline double sub(double a, double b) { return a - b; }
COMMPACT_HOST_DEVICE inline double mul(double a, double b) { return a * b; }
COMMPACT_HOST_DEVICE inline std::uint32_t bits(float f) { return std::bit_cast<std::uint32_t>(f); }
COMMPACT_HOST_DEVICE inline float from_bits(std::uint32_t b) { return std::bit_cast<float>(b); }
#endif

//! False for +-Inf and NaN (an exponent of all ones).
COMMPACT_HOST_DEVICE inline bool finite(float f) { return (bits(f) & 0x7F800000u) != 0x7F800000u; }

//! f, or the quiet NaN 0x7FC00000 when f is a NaN. The bits of a NaN that arithmetic
//! makes differ between the host and a GPU (x86 keeps an operand's payload and makes
//! Inf - Inf negative; the GPU's NaN is its own, 0x7FFFFFFF), so a formula whose result a
//! frame carries writes every NaN as this one on both.
COMMPACT_HOST_DEVICE inline float canonical_nan(float f) {
  return (bits(f) & 0x7FFFFFFFu) > 0x7F800000u ? from_bits(0x7FC00000u) : f;
}
//! -x when neg, else x, on the sign bit (a NaN's payload is kept: a GPU's negation may
//! give another NaN).
COMMPACT_HOST_DEVICE inline float negate_if(bool neg, float x) {
  return from_bits(bits(x) ^ (neg ? 0x80000000u : 0u));
}

}  // namespace commpact::exact
