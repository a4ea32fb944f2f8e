// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file copies.hpp
//! Copies between a space's memory and host vectors, each queued and then fenced: what
//! save_state / load_state of a compressor over a space need (never a per-step path,
//! since each waits for the executor).
//!
//! <!-- snippet: using space_type=commpact::deferred_space; exec=commpact::deferred_space::exec; residual_=commpact::deferred_space::buffer<float> -->
//! \code
//! auto h = commpact::copy_to_host<space_type>(exec, residual_.cview());   // std::vector<float>
//! commpact::copy_from_host<space_type>(exec, std::span<const float>(h), residual_);
//! \endcode

#include <span>
#include <type_traits>
#include <vector>

#include "deferred/ops.hpp"
#include "host/ops.hpp"
#include "../space/host.hpp"

namespace commpact {

//! The values of span s of space S as a host vector (queued on e, then fenced).
template <class S, class Span>
std::vector<std::remove_const_t<typename Span::element_type>> copy_to_host(const typename S::exec& e, Span s) {
  std::vector<std::remove_const_t<typename Span::element_type>> h(s.size());
  if (h.empty()) return h;
  ops<S>::to_host(e, s, std::span(h));
  S::fence(e, no_deadline());
  return h;
}

//! Buffer b of space S resized to h's length and holding h (queued on e, then fenced).
template <class S, class T, class Buffer>
void copy_from_host(const typename S::exec& e, std::span<const T> h, Buffer& b) {
  b.resize(h.size(), e);
  if (h.empty()) return;
  ops<S>::from_host(e, h, b.view());
  S::fence(e, no_deadline());
}

}  // namespace commpact
