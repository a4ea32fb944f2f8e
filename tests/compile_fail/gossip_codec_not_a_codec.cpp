// expect: this type is not a Codec: it needs `std::size_t max_encoded_bytes\(std::size_t n\) const`
// GossipMixer's second parameter must be exact_mixing, power_gossip<R>, choco_gossip<Q> or
// a Codec; a compressor such as Dense is not a codec.
#include <commpact/comm/thread_comm.hpp>
#include <commpact/compress/compressors/dense.hpp>
#include <commpact/gossip/gossip_mixer.hpp>
#include <commpact/topology/ring.hpp>

int main() {
  auto comms = commpact::ThreadComm::make_world(1);
  commpact::GossipMixer<commpact::Ring, commpact::Dense<commpact::ThreadComm>> m{comms[0], commpact::Ring(1), {{4}}};
  (void)m;
}
