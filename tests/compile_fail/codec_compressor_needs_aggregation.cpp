// expect: this type is not an Aggregation: it needs `comm_type`
// CodecCompressor's second parameter is an aggregation (Allgather<C>), not a communicator.
#include <commpact/comm/thread_comm.hpp>
#include <commpact/compress/compressors/codec_compressor.hpp>
#include <commpact/compress/codecs/topk_sign.hpp>

int main() {
  auto comms = commpact::ThreadComm::make_world(1);
  commpact::CodecCompressor<commpact::sign_codec, commpact::ThreadComm> c{comms[0]};
  (void)c;
}
