// SPDX-License-Identifier: Apache-2.0
#pragma once
// The one list of every compressor commpact ships, on host memory (ThreadComm) and on the
// deferred space where it runs there: the hardening suites run their guarantees over it,
// so a compressor added here is checked by all of them (test_hardening_protocol.cpp,
// test_hardening_mismatch.cpp).

#include <commpact/comm/deferred_comm.hpp>
#include <commpact/comm/thread_comm.hpp>
#include <commpact/comm/tree_comm.hpp>
#include <commpact/compress/codecs/quantizers.hpp>
#include <commpact/compress/codecs/randomk.hpp>
#include <commpact/compress/codecs/topk_sign.hpp>
#include <commpact/compress/compressors/bucketed.hpp>
#include <commpact/compress/compressors/cast_allreduce.hpp>
#include <commpact/compress/compressors/codec_compressor.hpp>
#include <commpact/compress/compressors/dense.hpp>
#include <commpact/compress/compressors/gtopk.hpp>
#include <commpact/compress/compressors/linear.hpp>
#include <commpact/compress/compressors/majority.hpp>
#include <commpact/compress/compressors/oktopk.hpp>
#include <commpact/compress/compressors/power.hpp>
#include <commpact/compress/compressors/topk.hpp>

#include <tuple>

namespace commpact_test {

template <class TC = commpact::ThreadComm, class DC = commpact::DeferredComm<commpact::ThreadComm>>
using every_compressor = std::tuple<
    commpact::Dense<TC>, commpact::TopK<TC>, commpact::gTopK<commpact::TreeComm<TC>>, commpact::PowerCompressor<2>,
    commpact::CodecCompressor<commpact::qsgd_codec, commpact::Allgather<TC>>,
    commpact::CodecCompressor<commpact::sign_codec, commpact::Allgather<TC>>, commpact::Fp16Allreduce<TC>,
    commpact::Bf16Allreduce<TC>, commpact::LinearCompressor<commpact::randomk_codec, TC>, commpact::MajorityVote<TC>,
    commpact::OkTopK<TC>, commpact::Bucketed<commpact::Dense<TC>>, commpact::Bucketed<commpact::TopK<TC>>,
    commpact::Dense<DC>, commpact::TopK<DC>, commpact::gTopK<commpact::TreeComm<DC>>,
    commpact::PowerCompressor<2, commpact::deferred_space>,
    commpact::CodecCompressor<commpact::qsgd_codec, commpact::Allgather<DC>>, commpact::Fp16Allreduce<DC>,
    commpact::LinearCompressor<commpact::randomk_codec, DC>, commpact::MajorityVote<DC>, commpact::OkTopK<DC>,
    commpact::Bucketed<commpact::TopK<DC>>>;

}  // namespace commpact_test
