// expect: this type is not a Codec: it needs `void decode_add\(std::span<const std::byte> msg
// A codec that can encode but not decode is rejected by CodecCompressor with one sentence.
#include <commpact/comm/thread_comm.hpp>
#include <commpact/compress/compressors/codec_compressor.hpp>

#include <cstddef>
#include <span>

struct EncodeOnly {
  std::size_t max_encoded_bytes(std::size_t n) const { return 4 * n; }
  std::size_t encode(std::span<const float>, std::span<std::byte>, std::span<float>) { return 0; }
};

int main() {
  auto comms = commpact::ThreadComm::make_world(1);
  commpact::CodecCompressor<EncodeOnly, commpact::Allgather<commpact::ThreadComm>> c{comms[0]};
  (void)c;
}
