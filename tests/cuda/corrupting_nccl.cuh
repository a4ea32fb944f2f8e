// SPDX-License-Identifier: Apache-2.0
//! \file corrupting_nccl.cuh
//! A one-rank NcclComm that corrupts one allgather on the wire, for the codec tests'
//! wire_error path. A CodecCompressor queues its whole step (encode, allgather, gate,
//! decode) inside start(), so a corruption queued after start() would land behind the
//! decode; this one lands between the collective and the decode, as a bad peer's would.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

#include "commpact/comm/nccl_comm.hpp"

#include "codec_test_common.cuh"

namespace codec_test {

//! NcclComm whose next allgather after codec_test::corrupt_next_allgather is set has the
//! received block's first payload word (byte 48, after the 12-word frame header) set to
//! 0xFFFFFFFF on the stream, right after the collective.
struct corrupting_nccl : cp::NcclComm {
  explicit corrupting_nccl(cp::NcclComm c) : cp::NcclComm(std::move(c)) {}
  using cp::NcclComm::allgather;
  template <class T>
  void allgather(cp::cuda_span<const T> in, cp::cuda_span<T> out) {
    cp::NcclComm::allgather(in, out);
    if (!corrupt_next_allgather) return;
    corrupt_next_allgather = false;
    EXPECT(out.size_bytes() >= 52, "corrupting_nccl: a block of %zu bytes has no payload word to corrupt",
           out.size_bytes());
    auto* p = reinterpret_cast<unsigned char*>(cp::cuda_access::ptr(out));
    cudaMemsetAsync(p + 48, 0xFF, 4, exec().stream());
  }
};

}  // namespace codec_test
