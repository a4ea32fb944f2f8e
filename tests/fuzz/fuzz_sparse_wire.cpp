// libFuzzer harness for the sparse wire decoder (wire/sparse_frame.hpp).
//
// Input: one control byte, then the message. Control bit 0 set: the harness writes the
// valid magic and version itself and the rest of the input starts at the flags, so the
// fuzzer spends its time on the fields behind them. Bits 1-2 choose what the receiver
// expects: the header's own n / count / mask_bits (so valid bodies get decoded), or
// perturbed ones. Outputs are heap buffers of exactly the size the receiver offers, so
// AddressSanitizer sees any write out of bounds.
//
// Checked on every input: the decoder raises only commpact::wire_error (anything else
// escapes and is reported as a crash); what it accepts satisfies the format's rules
// (indices strictly increasing in [0, n), finite values, mask bits in range); and
// encoding what it decoded gives back the exact input bytes.
#include <commpact/wire/sparse_frame.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <span>
#include <vector>

namespace sw = commpact::sparse_wire;

namespace {
void check(bool ok) {
  if (!ok) std::abort();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const unsigned control = data[0];
  std::vector<std::byte> msg;
  if (control & 1u) {
    msg.resize(6);
    std::memcpy(msg.data(), &sw::magic, 4);
    std::memcpy(msg.data() + 4, &sw::version, 2);
  }
  const auto* body = reinterpret_cast<const std::byte*>(data + 1);
  msg.insert(msg.end(), body, body + (size - 1));
  const std::span<const std::byte> m(msg);

  sw::header h;
  try {
    h = sw::decode_header(m);
  } catch (const commpact::wire_error&) {
    return 0;
  }
  // A header it accepts is self-consistent.
  check(h.n_min >= 0 && h.n_min <= h.n_max && h.k_min >= 0 && h.k_min <= h.k_max);
  check((h.flags & ~sw::known_flags) == 0);
  check(sw::encoded_size(h.count, h.mask_bits) == m.size());

  sw::expect e{h.n_min, h.count, h.mask_bits};
  std::size_t room = h.count, mask_room = h.mask_bits;
  switch ((control >> 1) & 3u) {
    case 0: break;                                   // exactly what the header says
    case 1:  // the receiver's own n may differ (without overflowing a header's n near INT64_MAX)
      e.n = h.n_max <= std::numeric_limits<std::int64_t>::max() - 32 ? h.n_max + (control >> 3) : h.n_max;
      break;
    case 2:                                          // a smaller limit or less room
      e.max_count = h.count / 2 + (control >> 3);
      room = h.count ? h.count - 1 : 0;
      break;
    case 3:
      e.mask_bits = static_cast<std::size_t>(control >> 3);
      mask_room = e.mask_bits;
      break;
  }
  std::vector<std::int32_t> idx(room);
  std::vector<float> val(room);
  std::vector<std::uint8_t> mask(mask_room);
  sw::header got;
  try {
    got = sw::decode(m, e, idx, val, mask);
  } catch (const commpact::wire_error&) {
    return 0;
  }
  // Accepted: the body follows the rules for this receiver.
  check(got.count == h.count && got.count <= e.max_count && got.count <= room);
  check(got.mask_bits == e.mask_bits && got.n_min == e.n && got.n_max == e.n);
  for (std::size_t i = 0; i < got.count; ++i) {
    check(idx[i] >= 0 && idx[i] < e.n);
    check(i == 0 || idx[i] > idx[i - 1]);
    check(std::isfinite(val[i]));
  }
  for (std::size_t b = 0; b < got.mask_bits; ++b) check(mask[b] <= 1);
  // And it round-trips: encoding the decoded set reproduces the message byte for byte.
  std::vector<std::byte> again;
  sw::encode(again, got, std::span<const std::int32_t>(idx.data(), got.count),
             std::span<const float>(val.data(), got.count), std::span<const std::uint8_t>(mask.data(), got.mask_bits));
  check(again.size() == m.size() && std::memcmp(again.data(), m.data(), m.size()) == 0);
  return 0;
}
