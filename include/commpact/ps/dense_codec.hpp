// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file dense_codec.hpp
//! ps::dense_codec: float32 values as they are (4 bytes each), the uncompressed codec of
//! the parameter server. decode_add adds in index order, so a server that decodes its
//! workers' pushes in worker order computes the sum ThreadComm's allreduce computes.

#include <cstddef>
#include <cstring>
#include <span>

#include "../concepts.hpp"
#include "../error.hpp"

namespace commpact::ps {

struct dense_codec {
  std::size_t max_encoded_bytes(std::size_t n) const { return 4 * n; }
  std::size_t encode(std::span<const float> v, std::span<std::byte> msg, std::span<float> approx) const {
    require(msg.size() >= 4 * v.size(), "commpact::ps::dense_codec: the message buffer holds ", msg.size(),
            " bytes; ", v.size(), " values need ", 4 * v.size(), ".");
    if (!v.empty()) std::memcpy(msg.data(), v.data(), 4 * v.size());
    if (!approx.empty()) std::copy(v.begin(), v.end(), approx.begin());
    return 4 * v.size();
  }
  void decode_add(std::span<const std::byte> msg, std::span<float> acc) const {
    require<wire_error>(msg.size() == 4 * acc.size(), "commpact::ps::dense_codec: the message has ", msg.size(),
                        " bytes; a vector of ", acc.size(), " values needs exactly ", 4 * acc.size(), ".");
    for (std::size_t i = 0; i < acc.size(); ++i) {
      float x;
      std::memcpy(&x, msg.data() + 4 * i, 4);
      acc[i] += x;
    }
  }
};

static_assert(Codec<dense_codec>);

}  // namespace commpact::ps
