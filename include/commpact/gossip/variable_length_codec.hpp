// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file variable_length_codec.hpp
//! variable_length_codec<Q>: whether CHOCO-SGD's messages (gossip/choco.hpp, through the
//! rows choco_encode and choco_decode of kernels/ops.hpp) carry a 4-byte length.
//!
//! Messages have a known size (the Codec's max_encoded_bytes(n)), so the exchange needs
//! no probe. A codec whose messages vary in length (threshold_codec, gaussiank_codec,
//! dgc_codec, per_tensor of those, or a user's codec that says so by specialising
//! `commpact::variable_length_codec`) travels behind a 4-byte length ("framed").

#include <type_traits>

namespace commpact {

namespace detail {
class threshold_base;
}
template <class K>
class per_tensor;

//! True for a Codec whose encode() may write fewer than max_encoded_bytes(n) bytes:
//! CHOCO-SGD then sends a 4-byte length before each message. Specialise it (as
//! std::true_type) for such a codec of your own.
template <class Q>
struct variable_length_codec : std::bool_constant<std::is_base_of_v<detail::threshold_base, Q>> {};
template <class K>
struct variable_length_codec<per_tensor<K>> : variable_length_codec<K> {};

}  // namespace commpact
