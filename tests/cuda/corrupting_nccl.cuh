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
#include "commpact/wire/codec_frame.hpp"

#include "codec_test_common.cuh"

namespace codec_test {

//! Set by device_step for one step; the allgather of corrupting_nccl clears it.
inline bool corrupt_next_allgather = false;

//! NcclComm whose next allgather after codec_test::corrupt_next_allgather is set has the
//! received block's first payload word (after the frame header) set to
//! 0xFFFFFFFF on the stream, right after the collective.
struct corrupting_nccl : cp::NcclComm {
  explicit corrupting_nccl(cp::NcclComm c) : cp::NcclComm(std::move(c)) {}
  using cp::NcclComm::allgather;
  template <class T>
  void allgather(cp::cuda_span<const T> in, cp::cuda_span<T> out) {
    cp::NcclComm::allgather(in, out);
    if (!corrupt_next_allgather) return;
    corrupt_next_allgather = false;
    constexpr std::size_t at = cp::frame::header_bytes;
    EXPECT(out.size_bytes() >= at + 4, "corrupting_nccl: a block of %zu bytes has no payload word to corrupt",
           out.size_bytes());
    if (out.size_bytes() < at + 4) return;  // recorded above; never write past the block
    auto* p = reinterpret_cast<unsigned char*>(cp::cuda_access::ptr(out));
    cudaMemsetAsync(p + at, 0xFF, 4, exec().stream());
  }
};

//! Step s of the device compressor dev on g: reduce (1 delivered, 0 skipped, -1 numeric_error), or with `corrupt`
//! the first payload word of the received block set to 0xFFFFFFFF on the wire (dev's communicator must be a
//! corrupting_nccl, above), which must raise wire_error (-2).
template <class Dev>
int device_step(const char* what, int s, Dev& dev, cp::cuda_buffer<float>& g, bool corrupt) {
  if (corrupt) {
    corrupt_next_allgather = true;
    bool raised = false;
    try {
      dev.reduce(g.view());
    } catch (const cp::wire_error&) {
      raised = true;
    }
    EXPECT(!corrupt_next_allgather, "%s step %d: the step ran no allgather to corrupt", what, s);
    corrupt_next_allgather = false;
    EXPECT(raised, "%s step %d: a corrupted payload did not raise wire_error", what, s);
    return -2;
  }
  try {
    return dev.reduce(g.view()) ? 1 : 0;
  } catch (const cp::numeric_error&) {
    return -1;
  }
}

}  // namespace codec_test
