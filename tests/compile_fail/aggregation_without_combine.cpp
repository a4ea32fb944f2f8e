// expect: this type is not an Aggregation: it needs `void combine
// A user aggregation written to v2's concept (block, exchange, received, sources, comm)
// but without combine: CodecCompressor's diagnose_aggregation names what is missing.
#include <commpact/comm/thread_comm.hpp>
#include <commpact/compress/codecs/topk_sign.hpp>
#include <commpact/compress/compressors/codec_compressor.hpp>

#include <cstddef>
#include <span>
#include <vector>

struct my_allgather {
  using comm_type = commpact::ThreadComm;
  using space_type = commpact::host_space;
  explicit my_allgather(commpact::ThreadComm c) : comm_(c) {}
  std::span<float> block(std::size_t capacity) {
    mine_.resize(capacity / 4);
    all_.resize(mine_.size() * static_cast<std::size_t>(comm_.size()));
    return mine_;
  }
  void exchange() { comm_.allgather(std::span<const float>(mine_), std::span<float>(all_)); }
  std::span<const float> received() const { return all_; }
  std::span<const float> received(int r) const {
    return std::span<const float>(all_).subspan(static_cast<std::size_t>(r) * mine_.size(), mine_.size());
  }
  int sources() const { return comm_.size(); }
  commpact::ThreadComm& comm() { return comm_; }
  commpact::ThreadComm comm_;
  std::vector<float> mine_, all_;
};

int main() {
  auto comms = commpact::ThreadComm::make_world(1);
  commpact::CodecCompressor<commpact::sign_codec, my_allgather> c{comms[0]};
  (void)c;
}
