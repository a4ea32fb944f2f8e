// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file state.hpp
//! One format for everything commpact saves (compressors, error feedback, gossip mixers,
//! DataParallel): `save_state(out)` appends a blob, `load_state(blob)` restores it, and
//! a blob of another kind, another format version, a wrong length or one flipped bit
//! raises a clear error and changes nothing (loaders read everything into temporaries
//! first and assign only after every check passed).
//!
//! Layout (host byte order, all fields 8-byte aligned within the blob):
//!
//! | offset | type | field |
//! |---|---|---|
//! | 0  | u32 | magic 0x54535043 ("CPST") |
//! | 4  | u16 | format version (1) |
//! | 6  | u16 | 0 |
//! | 8  | u64 | total bytes of the blob, this header and the checksum included |
//! | 16 | u32 | number of sections |
//! | 20 | u32 | 0 |
//! | 24 | ... | sections: u32 tag, u32 type (1 i64, 2 f32, 3 bytes), u64 count, count elements, zero padding to 8 bytes |
//! | end - 8 | u64 | FNV-1a 64 checksum of every byte before it |
//!
//! The first section (tag 0, bytes) is the kind: the saving class's name, e.g.
//! "commpact.TopK". Sections follow in the order the class writes them; a nested state
//! (DataParallel's compressor) is a bytes section holding a whole blob.
//!
//! <!-- snippet: out=std::vector<std::byte>; blob=std::vector<std::byte> -->
//! \code
//! commpact::state::writer w{out, "my.Thing"};
//! w.i64(1, steps).f32s(2, residual);
//! w.finish();
//! // ...
//! commpact::state::reader r{blob, "my.Thing", "my::Thing"};
//! const auto steps = r.i64(1);
//! auto residual = r.f32s(2, n);   // non-finite values raise
//! r.done();
//! // assign steps and residual only now
//! \endcode

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "detail/bytes.hpp"
#include "detail/hash.hpp"
#include "error.hpp"

namespace commpact::state {

inline constexpr std::uint32_t magic = 0x54535043u;  // "CPST" as little-endian u32
inline constexpr std::uint16_t version = 1;
inline constexpr std::size_t header_bytes = 24;
inline constexpr std::size_t section_header_bytes = 16;

enum class element : std::uint32_t { i64 = 1, f32 = 2, bytes = 3 };

inline constexpr std::size_t element_size(element e) { return e == element::bytes ? 1 : (e == element::f32 ? 4 : 8); }

namespace detail {
using commpact::detail::get;
using commpact::detail::put;
inline std::size_t padded(std::size_t n) { return (n + 7) & ~std::size_t{7}; }
}  // namespace detail

//! Appends n zero bytes. Out of line: inlined into a caller that has just cleared the
//! vector, GCC 12 reports a false -Warray-bounds in the vector's growth.
#if defined(__GNUC__)
[[gnu::noinline]]
#endif
inline void append_zeros(std::vector<std::byte>& v, std::size_t n) {
  v.resize(v.size() + n, std::byte{0});
}

//! Appends one blob to `out`; call finish() once after the last section.
class writer {
 public:
  writer(std::vector<std::byte>& out, std::string_view kind) : out_(out), at_(out.size()) {
    append_zeros(out_, header_bytes);
    raw(0, element::bytes, kind.data(), kind.size());
  }

  writer& i64(std::uint32_t tag, std::int64_t v) { return raw(tag, element::i64, &v, 1); }
  writer& i64s(std::uint32_t tag, std::span<const std::int64_t> v) { return raw(tag, element::i64, v.data(), v.size()); }
  writer& f32s(std::uint32_t tag, std::span<const float> v) { return raw(tag, element::f32, v.data(), v.size()); }
  writer& bytes(std::uint32_t tag, std::span<const std::byte> v) { return raw(tag, element::bytes, v.data(), v.size()); }

  //! A bytes section whose content `fill(out)` appends (a nested blob).
  template <class F>
  writer& nested(std::uint32_t tag, F&& fill) {
    const std::size_t h = out_.size();
    append_zeros(out_, section_header_bytes);
    fill(out_);
    const std::size_t len = out_.size() - h - section_header_bytes;
    detail::put<std::uint32_t>(out_.data() + h, tag);
    detail::put<std::uint32_t>(out_.data() + h + 4, static_cast<std::uint32_t>(element::bytes));
    detail::put<std::uint64_t>(out_.data() + h + 8, len);
    append_zeros(out_, detail::padded(len) - len);
    ++sections_;
    return *this;
  }

  //! Writes the header and the checksum.
  void finish() {
    std::byte* p = out_.data() + at_;
    const std::uint64_t total = out_.size() - at_ + 8;
    detail::put<std::uint32_t>(p, magic);
    detail::put<std::uint16_t>(p + 4, version);
    detail::put<std::uint16_t>(p + 6, 0);
    detail::put<std::uint64_t>(p + 8, total);
    detail::put<std::uint32_t>(p + 16, sections_);
    detail::put<std::uint32_t>(p + 20, 0);
    const std::uint64_t sum =
        commpact::detail::fnv1a(std::span<const std::byte>(out_.data() + at_, out_.size() - at_));
    const std::size_t end = out_.size();
    append_zeros(out_, 8);
    detail::put<std::uint64_t>(out_.data() + end, sum);
  }

 private:
  writer& raw(std::uint32_t tag, element e, const void* data, std::size_t count) {
    const std::size_t bytes = count * element_size(e);
    const std::size_t h = out_.size();
    append_zeros(out_, section_header_bytes + detail::padded(bytes));
    std::byte* p = out_.data() + h;
    detail::put<std::uint32_t>(p, tag);
    detail::put<std::uint32_t>(p + 4, static_cast<std::uint32_t>(e));
    detail::put<std::uint64_t>(p + 8, count);
    if (bytes) std::memcpy(p + section_header_bytes, data, bytes);
    ++sections_;
    return *this;
  }

  std::vector<std::byte>& out_;
  std::size_t at_;
  std::uint32_t sections_ = 0;
};

//! Validates a whole blob on construction (magic, version, length, checksum, section
//! structure, kind), then hands out its sections in order. It keeps a view of the blob,
//! which must outlive it (like std::string_view). Every error is raised before
//! the caller has assigned anything: wire_error for a malformed or corrupted blob,
//! invalid_argument for a blob of another kind.
class reader {
 public:
  reader(std::span<const std::byte> in, std::string_view kind, std::string_view who) : in_(in), who_(who) {
    fail_unless(in.size() >= header_bytes + 8, in.size(), " bytes cannot hold a state (at least ", header_bytes + 8,
                "); pass what save_state() wrote.");
    const std::byte* p = in.data();
    fail_unless(detail::get<std::uint32_t>(p) == magic, "the blob does not start with commpact's state magic; pass "
                                                        "what save_state() wrote.");
    const auto v = detail::get<std::uint16_t>(p + 4);
    fail_unless(v == version, "state format version ", v, " is not the supported version ", version,
                "; save and load with the same commpact.");
    const auto total = detail::get<std::uint64_t>(p + 8);
    fail_unless(total == in.size(), "the header says ", total, " bytes but ", in.size(),
                " were passed; the state is truncated or has trailing bytes.");
    const auto sum = detail::get<std::uint64_t>(p + in.size() - 8);
    fail_unless(commpact::detail::fnv1a(in.first(in.size() - 8)) == sum,
                "the checksum does not match; the state is corrupted.");
    count_ = detail::get<std::uint32_t>(p + 16);
    fail_unless(detail::get<std::uint16_t>(p + 6) == 0 && detail::get<std::uint32_t>(p + 20) == 0,
                "reserved header fields are not zero; the state is corrupted.");
    // Walk the sections once so that later reads cannot run out of bounds.
    std::size_t at = header_bytes;
    const std::size_t end = in.size() - 8;
    for (std::uint32_t s = 0; s < count_; ++s) {
      fail_unless(end - at >= section_header_bytes, "section ", s, " starts past the end; the state is corrupted.");
      const auto type = detail::get<std::uint32_t>(p + at + 4);
      const auto count = detail::get<std::uint64_t>(p + at + 8);
      fail_unless(type >= 1 && type <= 3, "section ", s, " has unknown element type ", type, ".");
      const std::size_t es = element_size(static_cast<element>(type));
      fail_unless(count <= (end - at - section_header_bytes) / es, "section ", s, " announces ", count,
                  " elements, more than the blob holds; the state is corrupted.");
      at += section_header_bytes + detail::padded(static_cast<std::size_t>(count) * es);
      fail_unless(at <= end, "section ", s, " runs past the end; the state is corrupted.");
    }
    fail_unless(at == end, "the sections end at byte ", at, " but the checksum is at ", end, "; the state is corrupted.");
    pos_ = header_bytes;
    const auto name = bytes(0);
    const std::string_view got(reinterpret_cast<const char*>(name.data()), name.size());
    if (got != kind)
      throw invalid_argument(commpact::detail::cat("commpact::", who_, "::load_state: the state was saved by '", got,
                                                   "', not by '", kind, "'; load each state into the kind of object "
                                                   "that saved it."));
  }

  std::int64_t i64(std::uint32_t tag) { return i64s(tag, 1)[0]; }

  //! The next section, of int64; `expect` elements unless it is npos.
  std::vector<std::int64_t> i64s(std::uint32_t tag, std::size_t expect = npos) {
    const auto [p, n] = next(tag, element::i64, expect);
    std::vector<std::int64_t> v(n);
    if (n) std::memcpy(v.data(), p, 8 * n);
    return v;
  }

  //! The next section, of float; raises on NaN or Inf unless allow_nonfinite.
  std::vector<float> f32s(std::uint32_t tag, std::size_t expect = npos, bool allow_nonfinite = false) {
    const auto [p, n] = next(tag, element::f32, expect);
    std::vector<float> v(n);
    if (n) std::memcpy(v.data(), p, 4 * n);
    if (!allow_nonfinite)
      for (std::size_t i = 0; i < n; ++i)
        fail_unless(std::isfinite(v[i]), "section ", tag, " holds the non-finite value ", v[i], " at index ", i,
                    "; a saved state is always finite, so this one is corrupted.");
    return v;
  }

  std::span<const std::byte> bytes(std::uint32_t tag, std::size_t expect = npos) {
    const auto [p, n] = next(tag, element::bytes, expect);
    return {p, n};
  }

  //! True when the next section has this tag (optional sections).
  bool next_is(std::uint32_t tag) const {
    return read_ < count_ && detail::get<std::uint32_t>(in_.data() + pos_) == tag;
  }

  //! Every section was read.
  void done() const {
    fail_unless(read_ == count_, count_ - read_, " sections were not read; the state holds more than this object "
                                                 "saves (another version or setup).");
  }

  //! Raises wire_error "commpact::<who>::load_state: <args>" unless cond.
  template <class... A>
  void fail_unless(bool cond, A&&... args) const {
    if (!cond) throw wire_error(commpact::detail::cat("commpact::", who_, "::load_state: ", std::forward<A>(args)...));
  }
  //! Raises E with the same prefix unless cond (range checks of loaded values).
  template <class E, class... A>
  void require_that(bool cond, A&&... args) const {
    if (!cond) throw E(commpact::detail::cat("commpact::", who_, "::load_state: ", std::forward<A>(args)...));
  }

  static constexpr std::size_t npos = static_cast<std::size_t>(-1);

 private:
  std::pair<const std::byte*, std::size_t> next(std::uint32_t tag, element e, std::size_t expect) {
    fail_unless(read_ < count_, "section ", tag, " is missing; the state is from another version or setup.");
    const std::byte* p = in_.data() + pos_;
    const auto t = detail::get<std::uint32_t>(p);
    const auto type = static_cast<element>(detail::get<std::uint32_t>(p + 4));
    const auto n = static_cast<std::size_t>(detail::get<std::uint64_t>(p + 8));
    fail_unless(t == tag && type == e, "expected section ", tag, " of type ", static_cast<int>(e), ", found section ",
                t, " of type ", static_cast<int>(type), "; the state is from another version or setup.");
    fail_unless(expect == npos || n == expect, "section ", tag, " holds ", n, " elements where this object has ",
                expect, "; the state was saved with another size or layout.");
    pos_ += section_header_bytes + detail::padded(n * element_size(e));
    ++read_;
    return {p + section_header_bytes, n};
  }

  std::span<const std::byte> in_;
  std::string who_;
  std::uint32_t count_ = 0, read_ = 0;
  std::size_t pos_ = 0;
};

//! Section 1 of most compressors: the step counters (steps, skipped).
inline void write_counters(writer& w, std::int64_t steps, std::int64_t skipped) {
  const std::int64_t c[2] = {steps, skipped};
  w.i64s(1, c);
}
//! The largest step counter a loaded state may hold: 2^62, so that every step after a
//! load (and every counter derived from it, such as a step plus a period) stays far
//! from signed overflow.
inline constexpr std::int64_t max_counter = std::int64_t{1} << 62;

//! Reads section 1 and checks 0 <= skipped <= steps <= max_counter (wire_error otherwise).
inline std::pair<std::int64_t, std::int64_t> read_counters(reader& r) {
  const auto c = r.i64s(1, 2);
  r.fail_unless(c[0] >= 0 && c[1] >= 0 && c[1] <= c[0] && c[0] <= max_counter, "counters steps = ", c[0],
                ", skipped = ", c[1], " are out of range (0 <= skipped <= steps <= 2^62); the state is corrupted.");
  return {c[0], c[1]};
}

}  // namespace commpact::state
