// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file rows_choco.cuh
//! ops<cuda_space> (kernels/cuda/ops.cuh) inherits these rows: CHOCO-SGD's codec rows
//! choco_encode and choco_decode (kernels/ops.hpp), so that GossipMixer runs CHOCO-SGD over
//! a communicator of the CUDA space (NcclComm, CudaStagedComm). Their workspace,
//! ops<cuda_space>::choco_workspace<Codec>, holds the codec's device_codec object and the
//! staging blocks; the mixer owns it.
//!
//! Checked against its host twin by tests/cuda/test_cuda_choco.cu (docs/cuda.md, "Status", says
//! where it has run).
//!
//! Written once over device_codec<Codec> (kernels/device_codec.hpp; the codecs' in
//! compress/device_codecs.cuh):
//! every codec with device kernels there runs here, no second copy of its encoder or
//! decoder. Those kernels work on frame blocks (the 48-byte header, word 2 the payload's
//! length, then the payload); CHOCO's message is the bare payload (behind a u32 length when
//! framed), so a message is staged through a frame block on each side:
//!
//! | step | kernels | equal to the host |
//! |---|---|---|
//! | diff | choco::diff: diff = exact::sub(x, hat) when words[0] is 0, else 0 (a zero vector encodes to a valid message, then dropped) | bits |
//! | encode | device_codec's encode_frame of diff into the workspace's block (no status: the flag is read on the device) | the codec's bytes |
//! | q | dense codecs: encode_frame's approx; topk_codec and the threshold codecs (their kernels write no approx): q = 0, then choco::scatter of the block's entries, q[idx] = val | bits (the host's approx: assignments, -0 kept) |
//! | message | choco::message: msg = [u32 length when framed] payload, the rest zero; all zero when words[0] is not 0. choco::short_message: unframed, a length other than msg.size() sets words[0] = flag_short (2) | bytes |
//! | decode | choco::frames: neighbour k's message as a frame block (framed: its u32 length, above the capacity: malformed); device_codec's decode_sum of that one block into q_nb[k] with status word k; choco::first_malformed: words[2] = 1 + the first k whose status holds status_wire, when words[0] = words[2] = 0 | bits of q_nb; the same messages rejected |
//!
//! Differences from the host: the host's `why` is the codec's own wire_error sentence; the
//! device cannot say which check failed, so `why` is a fixed sentence naming the codec
//! (the exchange's error names the neighbour's rank), set when decode is queued and read
//! after the fence. Nothing waits for the device: lengths and flags stay in device memory.
//! The scratch (this rank's frame block, the neighbours' blocks, one status word per
//! neighbour, and the codec kernels' own workspaces) grows at the first round only.
//!
//! Codecs: every codec with a device_codec (compress/device_codecs.cuh: topk, threshold,
//! sign, fp16, bf16, TernGrad and QSGD among them). One without device kernels fails to
//! compile with device_codec's sentence (kernels/device_codec.hpp); a codec that delivers
//! indices (delivered()) in another format than topk_codec's (its device_codec does not
//! say `payload_entries`: per_tensor of a sparse codec) fails with this file's sentence.

#if !defined(__CUDACC__)
#error "commpact/kernels/cuda/rows_choco.cuh needs nvcc: include it from a .cu file only."
#endif

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "../../concepts/codec.hpp"
#include "../../error.hpp"
#include "../../space/cuda.hpp"
#include "../../wire/codec_frame.hpp"
#include "../device_codec.hpp"
#include "../exact.hpp"
#include "../host/gossip.hpp"
#include "../status.hpp"
#include "check.cuh"
#include "codecs.cuh"
#include "grid.cuh"

namespace commpact {

namespace cuda_kernels::choco {

using codec::header_words;

//! diff[i] = x[i] - hat[i] (uncontracted) when words[0] is 0; else 0.
__global__ void diff(const float* x, const float* hat, float* d, std::size_t n, const std::int64_t* words) {
  const bool clear = words[0] == 0;
  for (const std::size_t i : cuda_kernels::grid_stride(n)) d[i] = clear ? exact::sub(x[i], hat[i]) : 0.0f;
}

//! q[idx[i]] = val[i] for the c = block[2] / 8 entries of this rank's frame block (at most
//! cap of them; indices outside [0, n) skipped). q was zeroed before.
__global__ void scatter(const std::uint32_t* block, std::size_t cap, float* q, std::size_t n) {
  const std::size_t c = block[2] / 8 < cap ? block[2] / 8 : cap;
  const auto* idx = reinterpret_cast<const std::int32_t*>(block + header_words);
  const auto* val = reinterpret_cast<const float*>(block + header_words + c);
  for (const std::size_t i : cuda_kernels::grid_stride(c)) {
    const std::int32_t j = idx[i];
    if (j >= 0 && static_cast<std::size_t>(j) < n) q[j] = val[i];
  }
}

//! msg (msg_bytes) = [the payload's length, u32, when framed] then the first `length` bytes of
//! the block's payload (at most cap), the rest zero; every byte zero when words[0] is not 0.
__global__ void message(const std::uint32_t* block, std::size_t cap, unsigned char* msg, std::size_t msg_bytes,
                        bool framed, const std::int64_t* words) {
  const std::size_t off = framed ? 4 : 0;
  std::size_t len = words[0] == 0 ? block[2] : 0;
  if (len > cap) len = cap;
  const auto* p = reinterpret_cast<const unsigned char*>(block + header_words);
  for (const std::size_t b : cuda_kernels::grid_stride(msg_bytes)) {
    msg[b] = b < off ? static_cast<unsigned char>((len >> (8 * b)) & 0xFFu) : (b - off < len ? p[b - off] : 0u);
  }
}

//! words[0] = flag_short when words[0] is 0 and the (unframed) payload is not cap bytes long.
__global__ void short_message(const std::uint32_t* block, std::size_t cap, std::int64_t* words) {
  if (!decision_lane()) return;
  if (words[0] == 0 && block[2] != cap) words[0] = host::gossip::flag_short;
}

//! Block k (block_words words) = neighbour k's message (msg_bytes at recv + k msg_bytes) as a
//! frame block: word 2 its length (framed: the u32 in front; unframed: msg_bytes), the other
//! header words 0, then its payload, zero-padded. A framed length above msg_bytes - 4 sets
//! st[k] = status_wire (and length 0); st[k] = 0 otherwise (thread of word 2).
__global__ void frames(const unsigned char* recv, std::size_t msg_bytes, std::size_t deg, bool framed,
                       std::uint32_t* blocks, std::size_t block_words, std::uint32_t* st) {
  const std::size_t off = framed ? 4 : 0, cap = msg_bytes - off;
  for (const std::size_t t : cuda_kernels::grid_stride(deg * block_words)) {
    const std::size_t k = t / block_words, w = t % block_words;
    const unsigned char* m = recv + k * msg_bytes;
    std::size_t len = cap;
    if (framed)
      len = static_cast<std::size_t>(m[0]) | static_cast<std::size_t>(m[1]) << 8 |
            static_cast<std::size_t>(m[2]) << 16 | static_cast<std::size_t>(m[3]) << 24;
    const bool bad = len > cap;
    if (bad) len = 0;
    std::uint32_t out = 0;
    if (w < header_words) {
      if (w == 2) {
        out = static_cast<std::uint32_t>(len);
        st[k] = bad ? static_cast<std::uint32_t>(status_wire) : 0u;
      }
    } else {
      const std::size_t j0 = 4 * (w - header_words);
      for (unsigned b = 0; b < 4; ++b)
        if (j0 + b < len) out |= static_cast<std::uint32_t>(m[off + j0 + b]) << (8 * b);
    }
    blocks[t] = out;
  }
}

//! words[2] = 1 + the first k with status_wire in st[k], when words[0] = words[2] = 0: one
//! warp, 32 neighbours at a time (a ballot, the lowest set lane first).
__global__ void first_malformed(const std::uint32_t* st, std::size_t deg, std::int64_t* words) {
  if (words[0] != 0 || words[2] != 0) return;
  const unsigned lane = threadIdx.x;
  for (std::size_t k0 = 0; k0 < deg; k0 += 32) {
    const bool bad = k0 + lane < deg && (st[k0 + lane] & status_wire) != 0;
    const unsigned mask = __ballot_sync(0xffffffffu, bad);
    if (mask != 0) {
      if (lane == 0) words[2] = static_cast<std::int64_t>(k0 + static_cast<std::size_t>(__ffs(mask) - 1)) + 1;
      return;
    }
  }
}

//! "topk_codec" for commpact::topk_codec (the compiler's spelling of Q, namespace dropped).
template <class Q>
std::string codec_name() {
  std::string_view p = __PRETTY_FUNCTION__;  // "... [with Q = commpact::topk_codec; ...]"
  const auto a = p.find("Q = ");
  if (a == std::string_view::npos) return "the codec";
  p.remove_prefix(a + 4);
  p = p.substr(0, p.find_first_of(";]"));
  if (p.starts_with("commpact::")) p.remove_prefix(10);
  return std::string(p);
}

}  // namespace cuda_kernels::choco

namespace cuda_rows {

//! Codecs whose device kernels leave approx unwritten and send topk_codec's entries (k int32
//! indices, then k float32 values; their device_codec says `payload_entries`): CHOCO's q is
//! scattered from the message.
template <class Codec>
inline constexpr bool choco_entries = requires { requires device_codec<Codec>::payload_entries; };

struct choco {
  using exec = cuda_space::exec;
  template <class T>
  using span = cuda_span<T>;

  //! CHOCO's codec rows' workspace: the codec's device kernels (topk's and threshold's
  //! workspaces) and the staging blocks, grown at the first round only.
  template <class Codec>
  struct choco_workspace {
    static_assert(!req::codec_has_delivered<Codec> || choco_entries<Codec>,
                  "commpact: CHOCO-SGD on cuda_space takes q (what the neighbours decode) from the device encoder's "
                  "approx, or for topk_codec and the threshold codecs from the message's int32 indices and float32 "
                  "values; this codec delivers indices (delivered()) in another message format (per_tensor of a sparse "
                  "codec). Give its commpact::device_codec a `static constexpr bool payload_entries = true` when its "
                  "payload is topk_codec's, or run the mixer over a host communicator.");
    device_codec<Codec> codec;  // the codec's device kernels
    cuda_buffer<float> block, frames;  // this rank's frame block; the neighbours' messages as frame blocks
    cuda_buffer<std::uint32_t> st;     // one status word per neighbour

    //! Every device buffer (allocation checks: grown at the first round only).
    template <class Out>
    void add_signature(Out& s) const {
      s.emplace_back(block.data(), block.capacity());
      s.emplace_back(frames.data(), frames.capacity());
      s.emplace_back(st.data(), st.capacity());
      if constexpr (requires { codec.add_signature(s); }) codec.add_signature(s);
    }
  };

  template <class Codec>
  static void choco_encode(const exec& e, choco_workspace<Codec>& ws, Codec& codec, span<const float> x,
                           span<const float> hat, span<float> diff, span<std::byte> msg, span<float> q,
                           span<std::int64_t> words, bool framed) {
    namespace kc = cuda_kernels::codec;
    namespace ch = cuda_kernels::choco;
    const std::size_t n = x.size(), off = framed ? 4 : 0;
    require(hat.size() == n && diff.size() == n && q.size() == n && msg.size() >= off && words.size() >= 3,
            "commpact::ops<cuda_space>::choco_encode: x holds ", n, " values, hat ", hat.size(), ", diff ",
            diff.size(), ", q ", q.size(), "; msg ", msg.size(), " bytes; words ", words.size(), " (3 needed).");
    const std::size_t cap = msg.size() - off;
    ws.block.resize(kc::header_words + (cap + 3) / 4, e);
    const cudaStream_t s = e.stream();
    if (n)
      ch::diff<<<kc::grid_for(n), kc::block_threads, 0, s>>>(cuda_access::ptr(x), cuda_access::ptr(hat),
                                                          cuda_access::ptr(diff), n, cuda_access::ptr(words));
    ck(cudaGetLastError(), "choco diff");
    frame::header h{};
    h.n = static_cast<std::int64_t>(n);
    h.capacity = static_cast<std::int64_t>(cap);
    const auto* b = reinterpret_cast<const std::uint32_t*>(cuda_access::ptr(ws.block.cview()));
    if constexpr (choco_entries<Codec>) {
      ws.codec.encode_frame(e, codec, span<const float>(diff), ws.block.view(), h, span<float>{},
                            span<const std::uint32_t>{});
      if (n) {
        ck(cudaMemsetAsync(cuda_access::ptr(q), 0, n * sizeof(float), s), "choco q (zero)");
        ch::scatter<<<kc::grid_for(cap / 8), kc::block_threads, 0, s>>>(b, cap / 8, cuda_access::ptr(q), n);
      }
    } else {
      ws.codec.encode_frame(e, codec, span<const float>(diff), ws.block.view(), h, q, span<const std::uint32_t>{});
    }
    if (!msg.empty())
      ch::message<<<kc::grid_for(msg.size()), kc::block_threads, 0, s>>>(
          b, cap, reinterpret_cast<unsigned char*>(cuda_access::ptr(msg)), msg.size(), framed, cuda_access::ptr(words));
    if (!framed) cuda_kernels::decision_launch(ch::short_message, s, b, cap, cuda_access::ptr(words));
    ck(cudaGetLastError(), "choco message");
  }

  template <class Codec>
  static void choco_decode(const exec& e, choco_workspace<Codec>& ws, const Codec& codec, span<const std::byte> recv,
                           std::size_t msg_bytes, bool framed, span<float> q_nb, span<std::int64_t> words,
                           std::string& why) {
    namespace kc = cuda_kernels::codec;
    namespace ch = cuda_kernels::choco;
    const std::size_t off = framed ? 4 : 0, deg = msg_bytes == 0 ? 0 : recv.size() / msg_bytes,
                      n = deg == 0 ? 0 : q_nb.size() / deg;
    require(msg_bytes >= off && words.size() >= 3, "commpact::ops<cuda_space>::choco_decode: messages of ",
            msg_bytes, " bytes (", off, " at least), words ", words.size(), " (3 needed).");
    if (why.empty())  // read after the fence when a message was malformed (the neighbour's rank is named there)
      why = detail::cat("its ", ch::codec_name<Codec>(), " message failed that codec's checks on the CUDA "
                        "space (its length, an index or a value: the device does not say which; the same message "
                        "decoded over a host communicator names the check).");
    const cudaStream_t s = e.stream();
    if (deg) {
      const std::size_t bw = kc::header_words + (msg_bytes - off + 3) / 4;
      ws.frames.resize(deg * bw, e);
      ws.st.resize(deg, e);
      auto* fb = reinterpret_cast<std::uint32_t*>(cuda_access::ptr(ws.frames.view()));
      ch::frames<<<kc::grid_for(deg * bw), kc::block_threads, 0, s>>>(
          reinterpret_cast<const unsigned char*>(cuda_access::ptr(recv)), msg_bytes, deg, framed, fb, bw,
          cuda_access::ptr(ws.st.view()));
      ck(cudaGetLastError(), "choco frames");
      for (std::size_t k = 0; k < deg; ++k)  // k ascending; q_nb[k] = 0 + neighbour k's message
        ws.codec.decode_sum(e, codec, ws.frames.cview().subspan(k * bw, bw), bw, q_nb.subspan(k * n, n),
                            ws.st.view().subspan(k, 1));
    }
    ch::first_malformed<<<1, 32, 0, s>>>(deg ? cuda_access::ptr(ws.st.cview()) : nullptr, deg, cuda_access::ptr(words));
    ck(cudaGetLastError(), "choco first_malformed");
  }

 private:
  static void ck(cudaError_t err, const char* what) {
    cuda_kernels::detail::check(err, what, "commpact::ops<cuda_space> (CHOCO)");
  }
};

}  // namespace cuda_rows

}  // namespace commpact
