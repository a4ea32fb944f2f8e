// libFuzzer target: every state loader (Dense, TopK, gTopK, PowerCompressor, a
// CodecCompressor, GossipMixer with PowerGossip and CHOCO, DataParallel) on arbitrary
// bytes. A load either succeeds or raises a commpact::error; anything else (a crash, an
// ASan or UBSan report, another exception type) is a bug. An input that does not start
// with the state magic is wrapped in a valid header and checksum (its first byte picks
// the kind), so that the fuzzer reaches the section parsers and range checks behind the
// checksum; the seeds (tests/fuzz/corpus/fuzz_state_loaders/) are valid blobs of every kind.
#include <commpact/comm/thread_comm.hpp>
#include <commpact/comm/tree_comm.hpp>
#include <commpact/compress/compressors/codec_compressor.hpp>
#include <commpact/compress/codecs/topk_sign.hpp>
#include <commpact/compress/compressors/dense.hpp>
#include <commpact/compress/compressors/gtopk.hpp>
#include <commpact/compress/compressors/power.hpp>
#include <commpact/compress/compressors/topk.hpp>
#include <commpact/gossip/gossip_mixer.hpp>
#include <commpact/state.hpp>
#include <commpact/sync/policies.hpp>
#include <commpact/topology/ring.hpp>
#include <commpact/train/data_parallel.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

namespace {
using namespace commpact;

template <class T>
void load(T& t, std::span<const std::byte> b) {
  try {
    t.load_state(b);
  } catch (const commpact::error&) {
  }
}

//! Wraps raw sections in a valid blob of `kind`: header, the kind section, data, checksum.
std::vector<std::byte> wrap(const char* kind, std::span<const std::byte> data) {
  std::vector<std::byte> out;
  state::writer w{out, kind};
  w.finish();
  // Splice `data` (as raw section bytes) before the checksum, fix the count and the sum.
  out.resize(out.size() - 8);
  const std::size_t pad = (8 - data.size() % 8) % 8;
  out.insert(out.end(), data.begin(), data.end());
  out.insert(out.end(), pad, std::byte{0});
  std::uint32_t sections = 1;
  if (data.size() >= 4) std::memcpy(&sections, data.data(), 1), sections = 1 + (sections & 7);
  std::memcpy(out.data() + 16, &sections, 4);
  const std::uint64_t total = out.size() + 8;
  std::memcpy(out.data() + 8, &total, 8);
  const std::uint64_t sum = commpact::detail::fnv1a(out);
  out.resize(out.size() + 8);
  std::memcpy(out.data() + out.size() - 8, &sum, 8);
  return out;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static auto comms = ThreadComm::make_world(1);
  auto& comm = comms[0];
  const std::span<const std::byte> raw(reinterpret_cast<const std::byte*>(data), size);
  const tensor_layout layout = {{6, 4}, {4}};
  static Dense<ThreadComm> dense{comm};
  static TopK<ThreadComm> topk{comm, {.density = 0.5}};
  static gTopK<TreeComm<ThreadComm>> gtopk{comm, {.density = 0.5, .momentum = 0.5f}};
  static PowerCompressor<2> power{comm, layout, {.min_compression_rate = 0.0}};
  static CodecCompressor<sign_codec, Allgather<ThreadComm>> sign{comm};
  static GossipMixer<Ring, power_gossip<1>> pg{comm, Ring(1), layout};
  static GossipMixer<Ring, choco_gossip<topk_codec>> choco{comm, Ring(1), layout, {topk_codec{0.5}, 0.5}};
  static DataParallel<Dense<ThreadComm>, LocalSgd> dp{Dense<ThreadComm>{comm}, LocalSgd{2}, 10};
  const char* kinds[] = {"commpact.Dense", "commpact.TopK", "commpact.gTopK", "commpact.PowerCompressor",
                         "commpact.CodecCompressor", "commpact.GossipMixer", "commpact.DataParallel"};
  std::uint32_t head = 0;
  if (size >= 4) std::memcpy(&head, data, 4);
  const bool wrapped = size > 0 && head != state::magic;
  const auto blob = wrapped ? wrap(kinds[(data[0] >> 1) % 7], raw.subspan(1)) : std::vector<std::byte>(raw.begin(), raw.end());
  load(dense, blob);
  load(topk, blob);
  load(gtopk, blob);
  load(power, blob);
  load(sign, blob);
  load(pg, blob);
  load(choco, blob);
  load(dp, blob);
  return 0;
}
