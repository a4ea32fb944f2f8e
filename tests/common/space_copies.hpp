// Helpers for tests over the deferred space: bit comparison, and copies between host
// vectors and deferred buffers (queued, then fenced); with the seeded Gaussians of
// random.hpp, the names a host-vs-deferred test uses (namespace deferred_twins).
#pragma once

#include "bits.hpp"
#include "random.hpp"

#include <commpact/kernels/deferred/ops.hpp>
#include <commpact/space/deferred.hpp>

#include <cstring>
#include <span>
#include <vector>

namespace commpact_test {

//! A host copy of a deferred span (queued, then fenced).
inline std::vector<float> host_copy(const commpact::deferred_space::exec& e, commpact::deferred_span<const float> s) {
  std::vector<float> h(s.size());
  commpact::ops<commpact::deferred_space>::to_host(e, s, std::span<float>(h));
  commpact::deferred_space::fence(e, commpact::no_deadline());
  return h;
}

//! A deferred buffer holding h.
inline commpact::deferred_space::buffer<float> device_copy(const commpact::deferred_space::exec& e,
                                                           const std::vector<float>& h) {
  commpact::deferred_space::buffer<float> b;
  b.resize(h.size());
  commpact::ops<commpact::deferred_space>::from_host(e, std::span<const float>(h), b.view());
  commpact::deferred_space::fence(e, commpact::no_deadline());
  return b;
}

//! The names a test of host against deferred compressors uses unqualified (`using namespace
//! commpact_test::deferred_twins;`).
namespace deferred_twins {
using commpact_test::device_copy;
using commpact_test::host_copy;
using commpact_test::normal;
using commpact_test::same_bits;
}  // namespace deferred_twins

}  // namespace commpact_test
